"""The vLLM and SGLang profiles against what those servers print, and `absent: zero`.

The vLLM bodies and responses in tests/data were captured from a real vLLM 0.32.0 (its CPU build);
the SGLang body is built from SGLang's own source (tests/data/METRICS.md says which lines).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cache_qualify.config.measurement import Measurement
from cache_qualify.config.profiles import load_profile, resolve
from cache_qualify.config.yamlsource import FieldProblem
from cache_qualify.errors import InvalidResponse, MetricMissing
from cache_qualify.trials.client import CompletionsClient
from tests.support.httpfixtures import Request, Reply, StubServer, json_reply
from tests.support.recorded_vllm import body, figures, snapshot, vllm_bodies

DATA = Path(__file__).resolve().parent / "data"
CACHED = "usage.prompt_tokens_details.cached_tokens"
HOST = "127.0.0.23"
# the tokenizer manager's prompt-token series of tests/data/sglang-metrics.txt, at a value
PROMPT_TOKENS = 'sglang:prompt_tokens_total{{engine_type="unified",is_streaming="false",model_name="tiny"}} {}.0'


def samples(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


# --- vLLM, recorded --------------------------------------------------------------------------------

def test_vllm_re_read_with_caching_on_hits_whole_blocks_over_prompt_tokens() -> None:
    model = resolve("vllm")
    bodies = vllm_bodies("vllm-metrics.txt")
    first = figures(model, bodies[0], bodies[1])
    again = figures(model, bodies[2], bodies[3])
    assert (first["hits"], first["prompt_tokens"], first["hit_rate"]) == (0, 4000, 0)
    # 31 whole blocks of 128: the last partial block is always computed
    assert (again["hits"], again["prompt_tokens"], again["misses"]) == (3968, 4000, 32)
    assert again["hit_rate"] == pytest.approx(3968 / 4000)
    assert 0 < again["prefill_time_s"] < first["prefill_time_s"]
    assert again["ttft_s"] > 0


def test_vllm_with_caching_off_has_a_hit_rate_of_zero_not_zero_over_zero() -> None:
    model = resolve("vllm")
    bodies = vllm_bodies("vllm-metrics-no-caching.txt")
    again = figures(model, bodies[2], bodies[3])
    # the lookup is skipped: its queries stay 0, the prompt tokens do not
    assert 'vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 0.0' in bodies[3]
    assert (again["hits"], again["prompt_tokens"], again["hit_rate"]) == (0, 4000, 0)
    assert not any(math.isnan(v) for v in again.values())


EXTERNAL_HITS = 'vllm:external_prefix_cache_hits_total{engine="0",model_name="tiny-llama"} '


def test_vllm_hit_rate_over_both_tiers_reads_from_the_recorded_bodies() -> None:
    """No KV connector: the external tier's hits are 0 (its series there, at 0), so the hit rate over both
    tiers is the device's; the tiers' split by source sums to them, as vLLM's help text says."""
    model = resolve("vllm")
    bodies = vllm_bodies("vllm-metrics.txt")
    again = figures(model, bodies[2], bodies[3])
    assert samples(bodies[3], "vllm:external_prefix_cache_hits_total") == [EXTERNAL_HITS + "0.0"]
    assert (again["external_hits"], again["hits"], again["prompt_tokens"]) == (0, 3968, 4000)
    assert again["hit_rate_total"] == again["hit_rate"] == pytest.approx(3968 / 4000)
    assert model.quantities["hit_rate_total"].describe() == ("fraction (hits + external_hits) / (prompt_tokens) "
                                                          "(fraction, higher is better)")
    by_source = sum(float(line.rsplit(" ", 1)[1]) for line in samples(bodies[3], "vllm:prompt_tokens_cached_by_source_total"))
    assert by_source == 3968 + 0


def test_vllm_external_hits_count_in_the_total_hit_rate_not_its_denominator() -> None:
    """A connector's 32 hits (the block the device computed) over the same 4,000 prompt tokens, which count
    every prompt token once; a body without the series (a release before it) reads 0 external hits."""
    model = resolve("vllm")
    bodies = vllm_bodies("vllm-metrics.txt")
    moved = bodies[3].replace(EXTERNAL_HITS + "0.0", EXTERNAL_HITS + "32.0")
    got = figures(model, bodies[2], moved)
    assert (got["external_hits"], got["hit_rate_total"]) == (32, 1.0)
    assert got["hit_rate"] == pytest.approx(3968 / 4000)

    def cut(text: str) -> str:
        return "\n".join(line for line in text.splitlines() if "vllm:external_prefix_cache_hits" not in line)
    without = figures(model, cut(bodies[2]), cut(bodies[3]))
    assert without["external_hits"] == 0
    assert without["hit_rate_total"] == pytest.approx(3968 / 4000)


def test_vllm_kv_line_of_the_cpu_and_the_gpu_build() -> None:
    import re
    regex = re.compile(resolve("vllm").quantities["kv_pages"].spec.log or "")
    recorded = body("vllm-start.log")
    cpu = regex.search(recorded)
    assert cpu is not None and cpu.group(1) == "2,097,152"
    gpu = regex.search("INFO 05-01 [kv_cache_utils.py:1087] GPU KV cache size: 123,456 tokens")
    assert gpu is not None and gpu.group(1) == "123,456"


def stub(stub_servers: Callable[[str], StubServer], document: dict[str, Any]) -> StubServer:
    server = stub_servers(HOST)

    def reply(request: Request) -> Reply:
        return json_reply(document)
    server.serve("/v1/completions", reply)
    return server


def cached_tokens(server: StubServer, model: Measurement, *, forbid: bool = False) -> float:
    path = model.prefix_cached
    assert path is not None
    zero = (path,) if model.absent_zero(path) else ()
    with CompletionsClient(server.url, host=server.host) as client:
        result = client.complete("A", list(range(100, 4100)), logprobs=None, fields=() if forbid else (path,),
                                 forbid_cached=path if forbid else None, absent_zero=zero)
    return result.fields[path]


@pytest.mark.parametrize("recorded", ["vllm-response.json", "vllm-response-no-details.json"])
def test_vllm_responses_read_as_their_cached_tokens(stub_servers: Callable[[str], StubServer],
                                                    recorded: str) -> None:
    first, _other, again = json.loads(body(recorded))
    model = resolve("vllm").for_prefix_reuse("measure")
    details = recorded == "vllm-response.json"
    assert (again["usage"]["prompt_tokens_details"] is None) is not details
    assert cached_tokens(stub(stub_servers, first), model) == 0
    assert cached_tokens(stub(stub_servers, again), model) == (3968 if details else 0)


# --- SGLang, from its source ---------------------------------------------------------------------

def test_sglang_without_cached_tokens_total_has_zero_hits() -> None:
    model = resolve("sglang")
    fresh, served = body("sglang-metrics.txt").split("\n# --- next scrape ---\n")
    assert not samples(fresh + served, "sglang:cached_tokens_total")
    assert not samples(fresh + served, "sglang:evicted_tokens_total")   # nothing evicted yet: no series
    # the warm-up request, counted before /health_generate answers: the series is there at the first scrape
    assert samples(fresh, "sglang:prompt_tokens_total") == [PROMPT_TOKENS.format(3)]
    got = figures(model, fresh, served)
    assert (got["hits"], got["prompt_tokens"], got["hit_rate"], got["misses"]) == (0, 4000, 0, 4000)
    assert got["evictions"] == 0
    assert got["ttft_s"] > 0


def test_sglang_prompt_tokens_are_required_since_the_warm_up_counts_them() -> None:
    """The profile asks for the series at every scrape: the warm-up makes it before the server is ready."""
    model = resolve("sglang")
    assert "sglang:prompt_tokens_total" in model.required_metrics()
    fresh, served = body("sglang-metrics.txt").split("\n# --- next scrape ---\n")
    with pytest.raises(MetricMissing, match="sglang:prompt_tokens_total"):
        figures(model, fresh.replace("sglang:prompt_tokens_total{", "sglang:other_total{"), served)


def test_sglang_counts_its_first_hit_and_eviction_from_zero() -> None:
    model = resolve("sglang")
    _fresh, served = body("sglang-metrics.txt").split("\n# --- next scrape ---\n")
    hit = served.replace(PROMPT_TOKENS.format(4003), PROMPT_TOKENS.format(8003))
    # one series per cache source, summed; the evictions of a rank's tree (0.5.21 on: its rank labels)
    hit += ('# HELP sglang:cached_tokens_total Number of cached prompt tokens by source (device/host/storage).\n'
            '# TYPE sglang:cached_tokens_total counter\n'
            'sglang:cached_tokens_total{cache_source="device",engine_type="unified",model_name="tiny"} 3968.0\n'
            'sglang:cached_tokens_total{cache_source="host",engine_type="unified",model_name="tiny"} 31.0\n'
            '# TYPE sglang:evicted_tokens_total counter\n'
            'sglang:evicted_tokens_total{cache_type="RadixCache",dp_rank="0",pp_rank="0",tp_rank="0"} 4003.0\n')
    got = figures(model, served, hit)
    assert (got["hits"], got["prompt_tokens"], got["evictions"]) == (3999, 4000, 4003)


def test_the_sglang_sample_is_what_sglangs_metric_definitions_print() -> None:
    """tests/data/sglang-metrics.txt is prometheus_client's output for the source's definitions (the
    families' order aside: the client takes it from its multiprocess folder's listing)."""
    printed = subprocess.run([sys.executable, "-m", "tests.support.sglang_sample"], cwd=DATA.parent.parent,
                             capture_output=True, text=True, check=True, timeout=60).stdout
    def parts(text: str) -> list[list[str]]:
        return [sorted(part.splitlines()) for part in text.split("\n# --- next scrape ---\n")]
    assert parts(printed) == parts(body("sglang-metrics.txt"))


@pytest.mark.parametrize("usage", [{"prompt_tokens": 4000, "completion_tokens": 1, "total_tokens": 4001,
                                    "prompt_tokens_details": None},
                                   {"prompt_tokens": 4000, "completion_tokens": 1, "total_tokens": 4001}])
def test_sglang_response_without_prompt_tokens_details_is_zero_cached_tokens(
        stub_servers: Callable[[str], StubServer], usage: dict[str, Any]) -> None:
    document = {"id": "1", "object": "text_completion", "model": "tiny",
                "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}], "usage": usage}
    model = resolve("sglang").for_prefix_reuse("measure")
    assert cached_tokens(stub(stub_servers, document), model) == 0
    # where prefix reuse is forbidden, a response without the field served no cached tokens
    assert cached_tokens(stub(stub_servers, document), resolve("sglang"), forbid=True) == 0


def test_sglang_and_vllm_are_single_host_and_say_their_flags() -> None:
    vllm, sglang = load_profile("vllm"), load_profile("sglang")
    assert "one rank" in vllm.description and "one rank" in sglang.description
    assert "--enable-prompt-tokens-details" in vllm.description
    assert "--enable-metrics" in sglang.description and "--enable-cache-report" in sglang.description
    assert resolve("sglang").readiness_path == "/health_generate"


# --- absent: zero, and absent elsewhere ----------------------------------------------------------

def test_a_required_counter_absent_stays_an_error_naming_it() -> None:
    model = resolve("vllm")
    bodies = vllm_bodies("vllm-metrics.txt")
    cut = "\n".join(line for line in bodies[3].splitlines() if not line.startswith("vllm:prefix_cache_hits"))
    with pytest.raises(MetricMissing, match="vllm:prefix_cache_hits_total"):
        figures(model, bodies[2], cut)


def test_a_counter_absent_as_zero_that_vanishes_is_still_an_error() -> None:
    model = resolve("sglang")
    _fresh, served = body("sglang-metrics.txt").split("\n# --- next scrape ---\n")
    with pytest.raises(MetricMissing, match="sglang:prompt_tokens_total"):
        figures(model, served, served.replace("sglang:prompt_tokens_total{", "sglang:other_total{"))


def test_a_response_field_absent_stays_an_error_where_it_is_required(
        stub_servers: Callable[[str], StubServer]) -> None:
    first, _other, _again = json.loads(body("vllm-response-no-details.json"))
    with CompletionsClient(stub(stub_servers, first).url, host=HOST) as client:
        with pytest.raises(InvalidResponse, match="prompt_tokens_details.cached_tokens is missing"):
            client.complete("A", list(range(100, 4100)), logprobs=None, forbid_cached=CACHED)


def test_absent_zero_is_for_counters_and_responses_only() -> None:
    with pytest.raises(FieldProblem, match="absent: zero` is for a counter or a response, found a gauge"):
        resolve("vllm", {"kv_usage": {"gauge": "vllm:kv_cache_usage_perc", "unit": "fraction", "absent": "zero"}})
    model = resolve("vllm", {"external": {"counter": "vllm:external_prefix_cache_hits_total", "unit": "tokens",
                                          "absent": "zero"}})
    assert model.quantities["external"].spec.absent == "zero"
