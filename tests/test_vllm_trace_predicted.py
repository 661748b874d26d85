"""A trace replayed one request at a time on a real vLLM 0.32.0: its warm window's predicted hits are
the hits vLLM counts.

examples/vllm-trace-serial.yaml (records 300 to 499 of the shipped Mooncake slice, one client, a KV
cache of 24 MiB that eviction decides) is sent as a qualification sends it: the records before the
window, then /metrics, the window's, /metrics again. `predict_replay` of every prompt sent, from the
build's command line and the started server's /metrics and log, must give the window's
``vllm:prefix_cache_hits_total`` and ``vllm:prefix_cache_queries_total`` deltas exactly, for blocks of
128 and of 32. One start per build (each most of a minute); caching off is the trace run's
(tests/test_vllm_qualify.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from cache_qualify.config.inventory import load_inventory
from cache_qualify.config.profiles import resolve
from cache_qualify.config.scenario import load_scenario
from cache_qualify.emulation.predicted import predict_replay
from cache_qualify.emulation.sources import StartFacts
from cache_qualify.trials.exchange import RequestShape
from cache_qualify.trials.measure import parse_metrics
from cache_qualify.trials.replay import Arrival, replay
from cache_qualify.workload.trace import TraceRequest, parts, scenario_trace
from tests.support.labfixtures import REPO
from tests.support.vllm_server import MODEL_NAME, running_vllm_server, vllm  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]

EXAMPLE = REPO / "examples" / "vllm.yaml"
SERIAL = REPO / "examples" / "vllm-trace-serial.yaml"
# the warm half's 44,246 prompt tokens: cached with blocks of 128 and of 32 (the example's figures)
PREDICTED = {"prefix-caching": 4352, "prefix-caching-32": 3424}
COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")


def counters(base_url: str) -> tuple[str, dict[str, float]]:
    """The server's /metrics body and its prefix-cache counters."""
    body = httpx.get(f"{base_url}/metrics", timeout=60).text
    values = {name: value for (name, _table), value in parse_metrics(body, host="vllm", rank=0).items()}
    return body, {name: values[name] for name in COUNTERS}


def send(base_url: str, requests: Sequence[TraceRequest]) -> None:
    """`requests` by one client in order, each answered before the next is sent."""
    shape = RequestShape.of_profile(resolve("vllm"), stream=True, model_name=MODEL_NAME)
    result = replay(base_url, shape, requests, arrival=Arrival(clients=1), timeout_s=120)
    assert not result.stopped and all(r.ok for r in result.records), result.frame()["error"].unique()


@pytest.mark.parametrize("build", sorted(PREDICTED))
def test_a_one_at_a_time_replay_s_predicted_hits_are_the_ones_vllm_counts(
        vllm: tuple[Path, Path], tmp_path: Path, build: str) -> None:
    scenario = load_scenario(SERIAL)
    assert scenario.trace is not None and scenario.trace.clients == 1
    trace = scenario_trace(scenario)
    inventory = load_inventory(EXAMPLE)
    spec = inventory.measurement.emulator
    assert spec is not None
    before, window, _ = parts(trace)
    with running_vllm_server(*vllm, tmp_path / "vllm.log", [*inventory.build(build).flags,
                                                             *scenario.server_flags]) as server:
        send(server.base_url, before)
        body, first = counters(server.base_url)
        send(server.base_url, window)
        _, last = counters(server.base_url)
        facts = StartFacts(tuple(str(a) for a in server.process.args), body, server.log())   # type: ignore[union-attr]
    sent = [r.prompt for r in (*before, *window)]
    record = predict_replay(spec, facts, sent, range(len(before), len(sent)), build=build, trial=0, attempt="a",
                            one_at_a_time=True, outputs=[r.max_tokens for r in (*before, *window)])
    hits, queries = (int(last[name] - first[name]) for name in COUNTERS)
    assert record.exact and record.tolerance == 0, record
    assert (record.cached_tokens, record.prompt_tokens) == ((hits,), (queries,)), (record, hits, queries)
    assert hits == PREDICTED[build], (build, hits, queries)
