"""The trace workload: trace files read and checked (cache_qualify.workload.tracefile), selected and their prompts
synthesized (workload.trace), their prefix figures (workload.traceanalysis), the generated trace (workload.tracegen)
and the commands that print figures about them (cli.traces)."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from cache_qualify.cli import main
from cache_qualify.config.scenario import load_scenario
from cache_qualify.errors import CorpusError, ScenarioError
from cache_qualify.workload.corpus import default_corpus
from cache_qualify.workload.trace import (marker_clashes, scaled_lengths, scenario_trace, synthesize,
                                        synthesize_plainly)
from cache_qualify.workload.traceanalysis import prefix_hits, trace_figures
from cache_qualify.workload.tracefile import read_records
from cache_qualify.workload.tracegen import Shape, as_records, conversation_records, write_jsonl
from tests.support.labfixtures import edited, write_file
from tests.support.traces import SHIPPED_TRACE, TRACE_SCENARIO, common_prefix, mooncake, write_trace

ID_RANGE = (3, 127_999)


def test_mooncake_records_are_read_as_written(tmp_path: Path) -> None:
    path = write_trace(tmp_path, [mooncake(0, 1025, [0, 1, 2], 7), "", {**mooncake(1.5, 512, [0]), "extra": 1}])
    first, second = read_records(path, format="mooncake", block_size=512)
    assert (first.index, first.line, first.timestamp_ms, first.input_length, first.output_length, first.hash_ids,
            first.prompt) == (0, 1, 0.0, 1025, 7, (0, 1, 2), None)
    assert (second.index, second.line, second.timestamp_ms, second.hash_ids) == (1, 3, 1.5, (0,))   # blank line 2


GOOD = mooncake(0, 1000, [0, 1])
MALFORMED: list[tuple[str, list[object], str]] = [
    ("no hash ids", [GOOD, {"timestamp": 5, "input_length": 10, "output_length": 1}],
     r":2: hash_ids: required field is missing$"),
    ("ids short of the length", [mooncake(0, 1025, [0, 1])],
     r":1: hash_ids: expected 3 ids, one per 512-token block of input_length 1025 \(ceil\(1025 / 512\)\), found 2$"),
    ("ids past the length", [GOOD, mooncake(1, 512, [0, 1])],
     r":2: hash_ids: expected 1 ids, one per 512-token block of input_length 512 \(ceil\(512 / 512\)\), found 2$"),
    ("timestamp back", [GOOD, mooncake(10, 512, [0]), mooncake(5, 512, [0])],
     r":3: timestamp: expected timestamps in arrival order: 5 ms is before 10 ms of the record before it "
     r"\(line 2\)$"),
    ("length as text", [{**GOOD, "input_length": "1000"}], r":1: input_length: expected an integer, found '1000'$"),
    ("output as a bool", [{**GOOD, "output_length": True}], r":1: output_length: expected an integer, found True$"),
    ("no output", [{**GOOD, "output_length": 0}], r":1: output_length: expected an integer >= 1, found 0$"),
    ("an id as text", [{**GOOD, "hash_ids": [0, "1"]}],
     r":1: hash_ids\[1\]: expected a hash id \(an integer 0\.\.9,223,372,036,854,775,807\), found '1'$"),
    ("ids not a list", [{**GOOD, "hash_ids": 3}], r":1: hash_ids: expected a list of hash ids, found 3$"),
    ("timestamp as text", [{**GOOD, "timestamp": "0"}], r":1: timestamp: expected a number of milliseconds, found '0'$"),
    ("timestamp below 0", [{**GOOD, "timestamp": -1}],
     r":1: timestamp: expected milliseconds >= 0 since the first request, found -1$"),
    ("bad JSON", [GOOD, '{"timestamp": 1,'], r":2: not valid JSON \(Expecting property name"),
    ("not an object", [[0, 1]], r":1: expected a JSON object \(one record\), found \[0, 1\]$"),
    ("no record", ["", " "], r": expected JSON Lines of trace records, found none$"),
]


@pytest.mark.parametrize(("case", "lines", "message"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_a_malformed_trace_is_one_line_naming_file_line_and_field(tmp_path: Path, case: str, lines: list[object],
                                                                   message: str) -> None:
    path = write_trace(tmp_path, lines)   # type: ignore[arg-type]
    with pytest.raises(ScenarioError, match=re.escape(str(path)) + message) as caught:
        read_records(path, format="mooncake", block_size=512)
    assert "\n" not in str(caught.value)


def test_every_record_of_the_shipped_trace_covers_its_length_with_its_ids() -> None:
    """What the check asks of a Mooncake trace is what Mooncake's own records hold (as the shipped trace,
    made in their shape, does): ceil(input_length / 512) ids each."""
    records = read_records(SHIPPED_TRACE, format="mooncake", block_size=512)
    assert all(len(r.hash_ids) == math.ceil(r.input_length / 512) for r in records) and len(records) == 156


def test_a_plain_trace_keeps_its_prompts_and_numbers_blocks_by_what_came_before(tmp_path: Path) -> None:
    path = write_trace(tmp_path, [{"timestamp": 0, "prompt": [5, 6, 7, 8, 9], "output_length": 3},
                                  {"timestamp": 2, "prompt": [5, 6, 7, 8, 1], "output_length": 3},
                                  {"timestamp": 3, "prompt": [7, 8, 5, 6], "output_length": 1}])
    a, b, c = read_records(path, format="plain", block_size=2)
    assert (a.prompt, a.input_length, a.hash_ids) == ((5, 6, 7, 8, 9), 5, (0, 1, 2))
    assert b.hash_ids == (0, 1, 3)   # the same first two blocks, another last one
    assert c.hash_ids == (4, 5)      # the same tokens after other blocks are other blocks


@pytest.mark.parametrize(("record", "message"), [
    ({"timestamp": 0, "output_length": 1}, r":1: prompt: required field is missing$"),
    ({"timestamp": 0, "prompt": [], "output_length": 1}, r":1: prompt: expected at least 1 token id, found none$"),
    ({"timestamp": 0, "prompt": [1, -2], "output_length": 1},
     r":1: prompt\[1\]: expected a token id \(an integer 0\.\.4,294,967,295\), found -2$"),
])
def test_a_malformed_plain_record_is_one_line_too(tmp_path: Path, record: dict[str, object], message: str) -> None:
    path = write_trace(tmp_path, [record])
    with pytest.raises(ScenarioError, match=message):
        read_records(path, format="plain", block_size=16)


def test_lengths_scale_to_the_tokens_a_block_becomes() -> None:
    """A 512-token block becomes 16 tokens; a last block of r tokens ceil(r * 16 / 512), at least 1."""
    records = as_records([{"timestamp": 0, "input_length": n, "output_length": 1, "hash_ids": list(range(ids))}
                          for n, ids in [(512, 1), (1, 1), (513, 2), (1024 + 256, 3), (1024 + 33, 3), (31, 1)]])
    assert scaled_lengths(records, 512, 16) == [16, 1, 1, 8, 2, 1]
    prompts = synthesize(records, default_corpus(), block_size=512, block_tokens=16, id_range=ID_RANGE)
    assert [len(p) for p in prompts] == [16, 1, 17, 40, 34, 1]


def test_every_pair_of_requests_shares_exactly_the_tokens_of_their_shared_leading_blocks() -> None:
    """For every pair of the shipped trace's requests (12,090 pairs), at 16 and at 5 tokens a block: the
    longest common token prefix is the shared leading blocks' tokens, not one token more or less."""
    records = read_records(SHIPPED_TRACE, format="mooncake", block_size=512)
    assert marker_clashes(records, seed=0, id_range=ID_RANGE) == 0
    for block_tokens in (16, 5):
        prompts = synthesize(records, default_corpus(), block_size=512, block_tokens=block_tokens, id_range=ID_RANGE)
        lasts = scaled_lengths(records, 512, block_tokens)
        pairs = 0
        for (a, pa, la), (b, pb, lb) in itertools.combinations(zip(records, prompts, lasts), 2):
            shared = next((k for k, (x, y) in enumerate(zip(a.hash_ids, b.hash_ids)) if x != y),
                          min(len(a.hash_ids), len(b.hash_ids)))
            sizes_a = [block_tokens] * (len(a.hash_ids) - 1) + [la]
            sizes_b = [block_tokens] * (len(b.hash_ids) - 1) + [lb]
            expected = sum(min(x, y) for x, y in zip(sizes_a[:shared], sizes_b[:shared]))
            assert common_prefix(pa, pb) == expected, (a.index, b.index)
            pairs += shared > 0 and expected < min(len(pa), len(pb))   # pairs whose prompts part after sharing
        assert pairs > 1_000


def test_an_id_is_the_same_block_in_any_window_and_another_seed_gives_other_blocks() -> None:
    records = read_records(SHIPPED_TRACE, format="mooncake", block_size=512)
    corpus = default_corpus()
    whole = synthesize(records, corpus, block_size=512, block_tokens=16, id_range=ID_RANGE)
    late = synthesize(records[100:], corpus, block_size=512, block_tokens=16, id_range=ID_RANGE)
    assert late == whole[100:]
    other = synthesize(records, corpus, block_size=512, block_tokens=16, id_range=ID_RANGE, seed=1)
    assert all(a != b for a, b in zip(whole, other))
    blocks: dict[int, tuple[int, ...]] = {}
    for record, prompt in zip(records, whole):
        for k, block_id in enumerate(record.hash_ids[:-1]):   # whole blocks
            block = prompt[16 * k:16 * (k + 1)]
            assert blocks.setdefault(block_id, block) == block
    assert len(set(blocks.values())) == len(blocks) > 200   # different ids, different blocks
    body = set(corpus.tolist())
    assert all(set(block[1:]) <= body for block in blocks.values())   # cut from the corpus after the marker


def test_the_plain_python_baseline_synthesizes_the_same_prompts() -> None:
    records = read_records(SHIPPED_TRACE, format="mooncake", block_size=512)
    for block_tokens in (1, 32):
        options = {"block_size": 512, "block_tokens": block_tokens, "id_range": ID_RANGE, "seed": 3}
        assert synthesize(records, default_corpus(), **options) == synthesize_plainly(  # type: ignore[arg-type]
            records, default_corpus(), **options)  # type: ignore[arg-type]


def test_ids_an_id_range_apart_after_the_same_block_are_counted_as_clashes() -> None:
    """With 10 token values for markers, ids 1 and 11 after block 0 share a first token: counted, and the
    prompts then share one token past block 0, which is what the count warns of."""
    records = as_records([{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1]},
                          {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 11]},
                          {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 2]}])
    assert marker_clashes(records, seed=0, id_range=(3, 12)) == 1
    assert marker_clashes(records, seed=0, id_range=(3, 13)) == 0
    a, b, c = synthesize(records, default_corpus(), block_size=512, block_tokens=4, id_range=(3, 12))
    assert (common_prefix(a, b), common_prefix(a, c)) == (5, 4)


def test_a_block_longer_than_the_corpus_is_refused() -> None:
    records = as_records([{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}])
    with pytest.raises(CorpusError, match=r"a block of 10 tokens is cut from the corpus, which holds 4"):
        synthesize(records, np.arange(3, 7, dtype=np.uint32), block_size=10, block_tokens=10, id_range=ID_RANGE)


def test_a_scenario_s_trace_is_selected_scaled_capped_and_windowed(tmp_path: Path) -> None:
    write_jsonl(conversation_records(), tmp_path / "trace.jsonl")
    text = edited(TRACE_SCENARIO, "  block_tokens: 16\n", "  block_tokens: 16\n  records: {first: 10, last: 29}\n"
                  "  time_scale: 0.5\n  max_output_tokens: 20\n  warm: second_half\n")
    trace = scenario_trace(load_scenario(write_file(tmp_path, text, "replay.yaml")))
    records = read_records(tmp_path / "trace.jsonl", format="mooncake", block_size=512)[10:30]
    assert [r.index for r in trace.requests] == list(range(10, 30))
    assert [r.line for r in trace.requests] == list(range(11, 31))
    assert trace.requests[0].at_s == 0.0
    assert [r.at_s for r in trace.requests] == pytest.approx(
        [(r.timestamp_ms - records[0].timestamp_ms) / 2000 for r in records])
    assert [r.max_tokens for r in trace.requests] == [min(r.output_length, 20) for r in records]
    assert [r.hash_ids for r in trace.requests] == [r.hash_ids for r in records]
    assert [len(r.prompt) for r in trace.requests] == [(len(r.hash_ids) - 1) * 16 + last for r, last in
                                                       zip(records, scaled_lengths(records, 512, 16))]
    assert (trace.format, trace.block_size, trace.block_tokens, trace.warm, trace.marker_clashes) == (
        "mooncake", 512, 16, (20, 29), 0)
    assert trace.file == tmp_path / "trace.jsonl" and trace.seed == 0
    assert [r.index for r in trace.warm_requests()] == list(range(20, 30))
    assert trace.span_s == pytest.approx((records[-1].timestamp_ms - records[0].timestamp_ms) / 2000)


def test_a_selection_past_the_file_s_end_names_the_scenario_s_line(tmp_path: Path) -> None:
    write_trace(tmp_path, [GOOD, GOOD])
    path = write_file(tmp_path, edited(TRACE_SCENARIO, "  block_tokens: 16\n", "  block_tokens: 16\n  records: 5\n"),
                      "replay.yaml")
    with pytest.raises(ScenarioError, match=r"replay\.yaml:8: trace\.records: trace\.jsonl holds 2 records \(0\.\.1\): "
                       r"expected a selection within them, found records 0\.\.4$"):
        scenario_trace(load_scenario(path))
    path.write_text(edited(TRACE_SCENARIO, "  block_tokens: 16\n", "  block_tokens: 16\n  warm: {first: 1, last: 2}\n"))
    with pytest.raises(ScenarioError, match=r"replay\.yaml:8: trace\.warm: expected a window within the replayed "
                       r"records \(0\.\.1\), found 1\.\.2$"):
        scenario_trace(load_scenario(path))


def test_a_plain_scenario_trace_sends_its_prompts_as_written(tmp_path: Path) -> None:
    write_trace(tmp_path, [{"timestamp": 0, "prompt": [5, 6, 7], "output_length": 30},
                           {"timestamp": 250, "prompt": [5, 6, 8], "output_length": 2}])
    text = edited(TRACE_SCENARIO, "  block_tokens: 16\n", "  format: plain\n  block_size: 2\n  max_output_tokens: 8\n")
    trace = scenario_trace(load_scenario(write_file(tmp_path, text, "replay.yaml")))
    assert [(r.prompt, r.at_s, r.max_tokens, r.hash_ids) for r in trace.requests] == [
        ((5, 6, 7), 0.0, 8, (0, 1)), ((5, 6, 8), 0.25, 2, (0, 2))]
    assert (trace.block_size, trace.block_tokens, trace.prompt_tokens) == (2, 2, 6)


def test_whole_block_prefix_hits_stop_at_the_first_miss_and_lru_evicts_the_oldest() -> None:
    prompts = [[0, 1, 2], [0, 1, 3], [0, 4, 1], [5], [0, 1, 2]]
    unbounded = prefix_hits(prompts)
    # hits: none; 0 1; 0 (1 follows a miss); none; 0 1 2
    assert (unbounded.blocks, unbounded.hits) == (13, 6) and unbounded.rate == pytest.approx(6 / 13)
    # three blocks: after [5] the cache holds 4 1 5 (0 left when 5 came), so the last request hits nothing
    assert prefix_hits(prompts, 3).hits == 3
    assert prefix_hits(prompts, 1).hits == 0
    with pytest.raises(ValueError, match=r"expected a capacity of at least 1 block, found 0"):
        prefix_hits(prompts, 0)


def test_the_shipped_trace_s_figures_are_those_its_readme_states() -> None:
    figures = trace_figures(read_records(SHIPPED_TRACE, format="mooncake", block_size=512), [200, 50, 20])
    readme = (SHIPPED_TRACE.parent / "README.md").read_text(encoding="utf-8")
    for line in figures.lines():
        assert f"    {line}\n" in readme, line
    assert (figures.records, figures.distinct_blocks) == (156, 406)
    assert [round(100 * h.rate, 1) for h in figures.hits] == [64.9, 63.3, 37.7, 26.3]


def test_the_shipped_trace_is_what_its_generator_writes(tmp_path: Path) -> None:
    from cache_qualify.workload.data import make_trace

    write_jsonl(conversation_records(make_trace.SHAPE, seed=make_trace.SEED), tmp_path / "made.jsonl")
    assert (tmp_path / "made.jsonl").read_bytes() == SHIPPED_TRACE.read_bytes()


def test_generated_turns_extend_their_conversation_and_ids_number_in_order_of_appearance() -> None:
    rows = conversation_records(Shape(conversations=5, max_turns=4), seed=7)
    seen: list[int] = []
    for row in rows:
        seen += [h for h in row["hash_ids"] if h not in seen]
    assert seen == list(range(len(seen)))
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows) and rows[0]["timestamp"] == 0
    later = [(a, b) for a, b in itertools.combinations(rows, 2) if b["hash_ids"][:len(a["hash_ids"]) - 1]
             == a["hash_ids"][:-1] and len(b["hash_ids"]) > len(a["hash_ids"]) > 2]
    assert later   # some turn is an earlier turn's prompt less its last block, and more


def test_trace_figures_prints_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace-figures", str(SHIPPED_TRACE), "--records", "40", "--lru", "30"]) == 0
    out = capsys.readouterr().out.splitlines()
    figures = trace_figures(read_records(SHIPPED_TRACE, format="mooncake", block_size=512)[:40], [30])
    assert out == [f"trace-figures: {SHIPPED_TRACE}, records 0..39", *figures.lines()]
    assert re.fullmatch(r"whole-block prefix hits, LRU of 30 blocks: \d+\.\d % \([\d,]+ of [\d,]+ blocks\)", out[-1])


def test_trace_figures_refuses_a_malformed_file_in_one_line(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = write_trace(tmp_path, [GOOD, json.dumps({"timestamp": 1})])
    assert main(["trace-figures", str(path)]) == 2
    assert capsys.readouterr().err == f"cache-qualify: error: {path}:2: input_length: required field is missing\n"


def test_the_synthesis_benchmark_prints_both_times_and_their_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench-trace-synthesis", "--records", "300"]) == 0
    out = capsys.readouterr().out
    number = r"\d+\.\d{3}"
    assert re.search(r"^bench-trace-synthesis: 300 records of a generated conversation trace \(seed 0\), "
                     r"[\d,]+ distinct blocks, [\d,]+ prompt tokens at 16 tokens a block$", out, re.M), out
    fast = re.search(rf"^synthesis \(numpy, each block once\): ({number}) CPU s \(target <= 2 s\)$", out, re.M)
    plain = re.search(rf"^plain Python, every block again: ({number}) CPU s$", out, re.M)
    ratio = re.search(r"^ratio: (\d+\.\d)x$", out, re.M)
    assert fast and plain and ratio, out
    f, p, half = float(fast[1]), float(plain[1]), 0.0005   # each time printed to the millisecond
    assert (p - half) / (f + half) - 0.05 <= float(ratio[1]) <= (p + half) / max(f - half, 1e-9) + 0.05


def test_a_trace_is_read_and_synthesized_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The setup's check, each runner and the predictor take one resolved trace: the file is read once per
    process for one scenario and one version of the file, again when the file changes."""
    import cache_qualify.workload.trace as resolving

    reads: list[Path] = []

    def counted(path: Path, **options: object) -> object:
        reads.append(Path(path))
        return read_records(path, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(resolving, "read_records", counted)
    write_trace(tmp_path, [mooncake(i * 100, 1024, [i % 5, 10 + i]) for i in range(12)])
    scenario_file = write_file(tmp_path, TRACE_SCENARIO, "replay.yaml")
    at_setup = scenario_trace(load_scenario(scenario_file))
    by_runners = [scenario_trace(load_scenario(scenario_file)) for _ in range(3)]   # each loads its own copy
    assert all(trace is at_setup for trace in by_runners) and reads == [tmp_path / "trace.jsonl"]
    write_trace(tmp_path, [mooncake(i * 100, 1024, [i % 5, 10 + i]) for i in range(13)])   # another version
    assert len(scenario_trace(load_scenario(scenario_file)).requests) == 13 and len(reads) == 2
