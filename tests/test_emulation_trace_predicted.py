"""A trace replay's predicted hit rate (cache_qualify.emulation.predicted.predict_replay) from real vLLM
0.32.0 starts of examples/vllm-trace.yaml (tests/data/vllm-trace-starts.json): each start's warm half
predicted from its build's flags and what the start kept, held against what the same start measured,
as the request `replay` in summary.md, verdicts.json and test_prediction."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cache_qualify.config.command import command_words
from cache_qualify.config.inventory import load_inventory
from cache_qualify.config.scenario import load_scenario
from cache_qualify.emulation.predicted import predict_replay, request_checks
from cache_qualify.emulation.sources import StartFacts
from cache_qualify.errors import ScenarioError
from cache_qualify.report.render import render_run
from cache_qualify.samples import runfolder
from cache_qualify.samples.store import WINDOW
from cache_qualify.workload.trace import parts, scenario_trace
from tests.support.labfixtures import REPO, collected
from tests.support.recorded_trace import (TRACE_EXAMPLE, TRACE_SCENARIO, TraceStart, trace_starts,
                                          write_recorded_trace_run)
from tests.support.recorded_vllm import EXAMPLE, body

SERIAL = REPO / "examples" / "vllm-trace-serial.yaml"
BAND = 0.02   # the vllm profile's emulator band
# the warm half (records 500 to 999, 206,749 prompt tokens) of every start at 48 MiB of KV cache
# (768 blocks of 128, 3,072 of 32), the first half sent first, one at a time from an empty cache, each
# request's decode steps writing its first output token into its blocks (which, with blocks of 32, evicts
# 96 tokens' worth more than the prompts alone: 22,784)
PREDICTED = {"no-prefix-caching": 0, "prefix-caching": 20_096, "prefix-caching-32": 22_688}
WARM_TOKENS = 206_749


@pytest.fixture(scope="module")
def trace_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = write_recorded_trace_run(tmp_path_factory.mktemp("trace"), trace_starts())
    render_run(run, plots=False)
    return run


def test_each_recorded_start_of_the_trace_example_is_predicted_as_the_request_replay(trace_run: Path) -> None:
    records = runfolder.read_predictions(trace_run)[TRACE_SCENARIO]
    assert len(records) == len(trace_starts()) == 9
    for record in records:
        assert record.requests == (WINDOW,) and record.prompt_tokens == (WARM_TOKENS,), record
        assert record.cached_tokens == (PREDICTED[record.build],), record
        assert not record.exact and record.tolerance == BAND, record   # open loop: requests overlap
    assert {r.params["num_gpu_blocks"] for r in records if r.build == "prefix-caching-32"} == {3072}


def test_the_run_shows_each_builds_predicted_beside_measured_warm_half(trace_run: Path) -> None:
    listed = json.loads((trace_run / "verdicts.json").read_text(encoding="utf-8"))["predictions"][TRACE_SCENARIO]
    got = {c["build"]: c for c in listed}
    assert set(got) == set(PREDICTED) and {c["request"] for c in listed} == {WINDOW}
    measured: dict[str, list[float]] = {}
    for start in trace_starts():
        measured.setdefault(start.build, []).append(start.hit_rate)
    for build, check in got.items():
        assert check["predicted"] == PREDICTED[build] / WARM_TOKENS, check
        # the start furthest from its prediction is shown; every start is inside the band
        assert check["measured"] == max(measured[build], key=lambda m: abs(m - check["predicted"])), check
        assert (check["outcome"], check["starts"], check["starts_within"]) == ("passed", 3, 3), check
    summary = (trace_run / "summary.md").read_text(encoding="utf-8")
    assert "| `prefix-caching` | replay | 9.72 % |" in summary and "| 3 of 3 | within (± 2.00 pp) |" in summary
    assert "Outside:" not in summary
    page = (trace_run / "summary.html").read_text(encoding="utf-8")   # the same renderer
    assert "<h3>Predicted beside measured</h3>" in page and ">within (± 2.00 pp)</td>" in page


def test_a_start_serving_far_less_than_predicted_fails_its_check_naming_the_build(tmp_path: Path) -> None:
    # a prefix-caching start that measured what the start without caching did: 0 of the warm half
    first = next(s for s in trace_starts() if s.build == "prefix-caching")
    lacking = TraceStart(first.build, 0, first.metrics, hits=0, prompt_tokens=WARM_TOKENS)
    off = next(s for s in trace_starts() if s.build == "no-prefix-caching")
    run = write_recorded_trace_run(tmp_path, [off, lacking])
    checks = request_checks(runfolder.read_predictions(run)[TRACE_SCENARIO], pd.read_csv(run / "samples.csv"))
    (check,) = checks["prefix-caching"]
    assert (check.request, check.check.outcome, check.within) == (WINDOW, "failed", 0)
    assert check.check.line().startswith("build prefix-caching measured 0.0 % on replay where prefix caching with "
                                         "blocks of 128 and 98,304 tokens gives 9.7 %"), check.check.line()


def facts(build: str, metrics: str) -> StartFacts:
    inventory = load_inventory(EXAMPLE)
    argv = command_words(inventory.server.command, list(inventory.build(build).flags))
    return StartFacts(tuple(argv), metrics, body("vllm-start.log"))


@pytest.mark.parametrize(("example", "exact"), [(SERIAL, True), (TRACE_EXAMPLE, False)])
def test_one_client_in_order_is_exact_and_overlapping_requests_a_band(example: Path, exact: bool) -> None:
    spec = load_inventory(EXAMPLE).measurement.emulator
    assert spec is not None
    scenario = load_scenario(example)
    assert scenario.trace is not None
    before, window, _ = parts(scenario_trace(scenario))
    sent = [r.prompt for r in (*before, *window)]
    start = next(s for s in trace_starts() if s.build == "prefix-caching")
    record = predict_replay(spec, facts("prefix-caching", start.metrics), sent, range(len(before), len(sent)),
                            build="prefix-caching", trial=0, attempt="a", one_at_a_time=scenario.trace.clients == 1,
                            band=scenario.trace.prediction_band)
    assert (record.exact, record.tolerance) == (exact, 0.0 if exact else BAND)
    narrower = predict_replay(spec, facts("prefix-caching", start.metrics), sent, range(len(before), len(sent)),
                              build="prefix-caching", trial=0, attempt="a", one_at_a_time=False, band=0.005)
    assert narrower.tolerance == 0.005 and narrower.cached_tokens == record.cached_tokens


def test_a_trace_scenario_has_a_prediction_test_per_build() -> None:
    names = collected("--hosts", str(EXAMPLE), "--scenario", str(TRACE_EXAMPLE), "--candidate", "prefix-caching-32")
    wanted = [f"test_prediction[vllm-trace:{build}]" for build in ("no-prefix-caching", "prefix-caching-32")]
    assert sorted(n for n in names if n.startswith("test_prediction[")) == wanted, names


def test_a_band_past_one_is_one_line_naming_the_file_and_field(tmp_path: Path) -> None:
    text = SERIAL.read_text(encoding="utf-8").replace("name: vllm-trace-serial", "name: banded").replace(
        "  clients: 1\n", "  clients: 1\n  prediction_band: 1.5\n").replace("../fixtures", str(REPO / "fixtures"))
    (tmp_path / "banded.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"banded\.yaml:\d+: trace\.prediction_band: expected a value less than "
                                            r"or equal to 1, found 1\.5$"):
        load_scenario(tmp_path / "banded.yaml")
