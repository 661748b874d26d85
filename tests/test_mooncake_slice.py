"""The shipped slice of Mooncake's conversation trace: the file its README describes (records, bytes,
digest, figures), shipped with the license it names, and read by the trace workload as Mooncake's
own records are (every record's ids cover its length)."""

from __future__ import annotations

import hashlib
import math
import re

from cache_qualify.trials.trace import scaled_lengths
from cache_qualify.trials.traceanalysis import trace_figures
from cache_qualify.trials.tracefile import read_records
from tests.support.labfixtures import REPO
from tests.support.traces import MOONCAKE_SLICE

README = (MOONCAKE_SLICE.parent / "README.md").read_text(encoding="utf-8")


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


def test_every_record_covers_its_length_with_its_ids_and_starts_with_block_0() -> None:
    records = read_records(MOONCAKE_SLICE, format="mooncake", block_size=512)
    assert len(records) == 1_000 and [r.index for r in records] == list(range(1_000))
    assert all(len(r.hash_ids) == math.ceil(r.input_length / 512) for r in records)
    assert all(r.hash_ids[0] == 0 for r in records)


def test_the_slice_s_figures_are_those_its_readme_states() -> None:
    records = read_records(MOONCAKE_SLICE, format="mooncake", block_size=512)
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


def test_at_32_tokens_a_block_its_prompts_and_working_set_are_those_the_docs_state() -> None:
    """docs/traces.md: "prompts are 56 to 7,621 tokens, 858,783 in all, and its 21,514 distinct blocks
    688,448 tokens"."""
    records = read_records(MOONCAKE_SLICE, format="mooncake", block_size=512)
    lengths = [(len(r.hash_ids) - 1) * 32 + last for r, last in zip(records, scaled_lengths(records, 512, 32))]
    distinct = len({h for r in records for h in r.hash_ids})
    assert (min(lengths), max(lengths), sum(lengths), distinct * 32) == (56, 7_621, 858_783, 688_448)
    docs = " ".join((REPO / "docs" / "traces.md").read_text(encoding="utf-8").split())
    assert "prompts are 56 to 7,621 tokens, 858,783 in all, and its 21,514 distinct blocks 688,448 tokens" in docs
