"""The shipped slice of Mooncake's conversation trace: the file its README describes (records, bytes,
digest, figures), shipped with the license it names, and read by the trace workload as Mooncake's
own records are (every record's ids cover its length)."""

from __future__ import annotations

import hashlib
import math
import re

import pytest

from cache_qualify.config.inventory import load_inventory
from cache_qualify.config.scenario import check_against, load_scenario
from cache_qualify.workload.trace import scaled_lengths, scenario_trace
from cache_qualify.workload.traceanalysis import trace_figures
from cache_qualify.workload.tracefile import TraceRecord, read_records
from tests.support.labfixtures import REPO
from tests.support.traces import MOONCAKE_SLICE

README = (MOONCAKE_SLICE.parent / "README.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def records() -> list[TraceRecord]:
    """The slice read once, as a trace scenario's setup reads it."""
    return read_records(MOONCAKE_SLICE, format="mooncake", block_size=512)


def test_the_slice_is_the_file_its_readme_names() -> None:
    data = MOONCAKE_SLICE.read_bytes()
    assert f"{len(data):,} bytes" in README and len(data) < 1_000_000
    assert f"sha256 `{hashlib.sha256(data).hexdigest()}`" in README
    assert data.count(b"\n") == 1_000 and data.endswith(b"\n")
    assert "3b5a594133958449a1feaf1c9e0fc1b553e34a28" in README and "kvcache-ai/Mooncake" in README


def test_the_license_the_readme_names_is_shipped_beside_it() -> None:
    license_text = (MOONCAKE_SLICE.parent / "LICENSE-APACHE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "4. Redistribution." in license_text and "END OF TERMS AND CONDITIONS" in license_text


def test_every_record_covers_its_length_with_its_ids_and_starts_with_block_0(records: list[TraceRecord]) -> None:
    assert len(records) == 1_000 and [r.index for r in records] == list(range(1_000))
    assert all(len(r.hash_ids) == math.ceil(r.input_length / 512) for r in records)
    assert all(r.hash_ids[0] == 0 for r in records)


def test_the_slice_s_figures_are_those_its_readme_states(records: list[TraceRecord]) -> None:
    figures = trace_figures(records, [8000, 2000, 500])
    for line in figures.lines():
        assert f"    {line}\n" in README, line
    assert (figures.records, figures.distinct_blocks) == (1_000, 21_514)
    assert [round(100 * h.rate, 1) for h in figures.hits] == [21.2, 15.8, 4.2, 3.7]
    # "each of the five windows of 200 consecutive records ... 3.7 % to 8.4 % ... 3.4 % to 4.6 %"
    windows = [trace_figures(records[first:first + 200], [1000]).hits for first in range(0, 1_000, 200)]
    unbounded = [round(100 * w[0].rate, 1) for w in windows]
    bounded = [round(100 * w[1].rate, 1) for w in windows]
    assert (min(unbounded), max(unbounded), min(bounded), max(bounded)) == (3.7, 8.4, 3.4, 4.6)
    assert re.search(r"3\.7 % to 8\.4 % of whole-block hits unbounded and 3\.4 % to 4\.6 %", " ".join(README.split()))


def test_at_32_tokens_a_block_its_prompts_and_working_set_are_those_the_docs_state(records: list[TraceRecord]) -> None:
    """docs/traces.md: "prompts are 56 to 7,621 tokens, 858,783 in all, and its 21,514 distinct blocks
    688,448 tokens"."""
    lengths = [(len(r.hash_ids) - 1) * 32 + last for r, last in zip(records, scaled_lengths(records, 512, 32))]
    distinct = len({h for r in records for h in r.hash_ids})
    assert (min(lengths), max(lengths), sum(lengths), distinct * 32) == (56, 7_621, 858_783, 688_448)
    docs = " ".join((REPO / "docs" / "traces.md").read_text(encoding="utf-8").split())
    assert "prompts are 56 to 7,621 tokens, 858,783 in all, and its 21,514 distinct blocks 688,448 tokens" in docs


# the tiny Llama's KV: one layer, one KV head of 64, float32, keys and values (2,097,152 tokens a GiB)
KV_BYTES_PER_TOKEN = 2 * 64 * 4


@pytest.mark.parametrize(("example", "inventory", "block_tokens", "context"), [
    ("vllm-trace.yaml", "vllm.yaml", 16, 8_192),            # examples/vllm.yaml's --max-model-len
    ("llama-cpp-trace.yaml", "llama-cpp.yaml", 16, 8_192),  # n_ctx_slot: the training context, each slot
])
def test_the_example_trace_scenarios_load_and_their_traces_pass_the_setup_check(
        example: str, inventory: str, block_tokens: int, context: int) -> None:
    """What the run's setup does before any lab time: the scenario read and checked against what its
    example inventory's runtime exports, the slice read, checked, selected and synthesized; every prompt
    and its output cap fit the server's context."""
    scenario = load_scenario(REPO / "examples" / example)
    check_against(scenario, load_inventory(REPO / "examples" / inventory).measurement)
    trace = scenario_trace(scenario)
    assert trace.file.resolve() == MOONCAKE_SLICE.resolve()
    assert (len(trace.requests), trace.block_tokens, trace.marker_clashes) == (1_000, block_tokens, 0)
    assert len(trace.warm_requests()) == 500
    assert max(len(r.prompt) + r.max_tokens for r in trace.requests) < context
    ids = {t for r in trace.requests for t in r.prompt}
    assert min(ids) >= 3 and max(ids) <= 31_999   # the tiny models' vocabulary, no special token


def test_the_vllm_trace_example_s_kv_cache_holds_under_a_third_of_the_slice_s_blocks() -> None:
    scenario = load_scenario(REPO / "examples" / "vllm-trace.yaml")
    flags = list(scenario.server_flags)
    kv_tokens = int(flags[flags.index("--kv-cache-memory-bytes") + 1]) // KV_BYTES_PER_TOKEN
    trace = scenario_trace(scenario)
    working_set = len({h for r in trace.requests for h in r.hash_ids}) * trace.block_tokens
    assert (kv_tokens, working_set) == (98_304, 344_224) and kv_tokens < working_set / 3
    example = (REPO / "examples" / "vllm-trace.yaml").read_text(encoding="utf-8")
    assert "48 MiB, 98,304\n# tokens" in example and "21,514 distinct blocks 344,224 tokens" in example


def test_the_llama_trace_example_gives_two_slots() -> None:
    assert load_scenario(REPO / "examples" / "llama-cpp-trace.yaml").server_flags == ("--parallel", "2")
