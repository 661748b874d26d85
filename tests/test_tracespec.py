"""A scenario's `trace:` section (cache_qualify.config.tracespec and the scenario's checks of it), and a bad
trace refused by the run's setup in one line before any run folder or host."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache_qualify.config.options import overrides_given, with_options
from cache_qualify.config.scenario import load_scenario
from cache_qualify.errors import ScenarioError
from cache_qualify.trials.runner import scenario_requests
from tests.support.labfixtures import REPO, edited, run_qualify, write_file
from tests.support.traces import TRACE_SCENARIO, mooncake, write_trace

USAGE_ERROR = 4   # pytest.ExitCode.USAGE_ERROR


def scenario_file(tmp_path: Path, text: str = TRACE_SCENARIO) -> Path:
    write_trace(tmp_path, [mooncake(0, 1000, [0, 1]), mooncake(10, 600, [0, 2])])
    return write_file(tmp_path, text, "replay.yaml")


def with_trace(extra: str) -> str:
    """The trace scenario with `extra` lines added to its trace section (after block_tokens, line 7)."""
    return edited(TRACE_SCENARIO, "  block_tokens: 16\n", "  block_tokens: 16\n" + extra)


def test_a_trace_section_s_defaults(tmp_path: Path) -> None:
    spec = load_scenario(scenario_file(tmp_path)).trace
    assert spec is not None
    assert (spec.format, spec.size, spec.tokens_per_block, spec.records, spec.time_scale, spec.max_output_tokens,
            spec.seed, spec.open_loop, spec.stream, spec.warm) == ("mooncake", 512, 16, None, 1.0, None, 0, True,
                                                                  True, None)
    assert spec.selected(7) == (0, 6)


def test_records_schedule_and_warm_as_written(tmp_path: Path) -> None:
    text = with_trace("  records: {first: 0, last: 1}\n  clients: 4\n  stream: false\n  warm: {first: 1, last: 1}\n")
    spec = load_scenario(scenario_file(tmp_path, text)).trace
    assert spec is not None and spec.records is not None
    assert (spec.records.first, spec.records.last, spec.clients, spec.open_loop, spec.stream) == (0, 1, 4, False, False)
    assert spec.selected(None) == (0, 1) and 1 in spec.records and 2 not in spec.records
    assert spec.warm_records() == (1, 1)
    counted = load_scenario(scenario_file(tmp_path, with_trace("  records: 2\n  warm: second_half\n"))).trace
    assert counted is not None and counted.selected(None) == (0, 1) and counted.warm_records() is None
    assert counted.warm is not None and counted.warm.second_half
    plain = load_scenario(scenario_file(tmp_path, edited(TRACE_SCENARIO, "  block_tokens: 16\n", "  format: plain\n")))
    assert plain.trace is not None and (plain.trace.size, plain.trace.tokens_per_block) == (16, 16)


SECTION_PROBLEMS: list[tuple[str, str, str]] = [
    ("both loops", with_trace("  schedule: trace\n  clients: 2\n"),
     r":9: trace\.clients: `schedule: trace` \(open loop\) and `clients` \(closed loop\) exclude each other: give one"),
    ("another schedule", with_trace("  schedule: poisson\n"), r":8: trace\.schedule: expected 'trace', found 'poisson'"),
    ("no clients", with_trace("  clients: 0\n"), r":8: trace\.clients: expected a value greater than or equal to 1"),
    ("stream as text", with_trace("  stream: 'yes'\n"), r":8: trace\.stream: expected a boolean, found 'yes'"),
    ("another format", with_trace("  format: sharegpt\n"), r":8: trace\.format: expected 'mooncake' or 'plain'"),
    ("blocks grow", with_trace("  block_size: 8\n"),
     r":7: trace\.block_tokens: expected block_tokens <= block_size \(8\), found 16"),
    ("plain blocks scaled", with_trace("  format: plain\n  block_size: 32\n"),
     r":7: trace\.block_tokens: a plain trace's prompts are sent as written: expected no block_tokens \(or "
     r"block_size, 32\), found 16"),
    ("no record", with_trace("  records: 0\n"), r":8: trace\.records: expected at least 1 record, found 0"),
    ("a window backwards", with_trace("  records: {first: 5, last: 2}\n"),
     r":8: trace\.records\.last: expected last >= first \(5\), found 2"),
    ("warm outside", with_trace("  records: 10\n  warm: {first: 5, last: 12}\n"),
     r":9: trace\.warm: expected a window within the replayed records \(0\.\.9\), found 5\.\.12"),
    ("another warm", with_trace("  warm: first_half\n"),
     r":8: trace\.warm: expected second_half or \{first, last\} \(record indices\), found 'first_half'"),
    ("half a warm window", with_trace("  warm: {first: 3}\n"),
     r":8: trace\.warm\.last: a warm window needs `first` and `last` \(record indices\)"),
    ("records as text", with_trace("  records: all\n"),
     r":8: trace\.records: expected a number of records or \{first, last\}, found 'all'"),
    ("no time", with_trace("  time_scale: 0\n"), r":8: trace\.time_scale: expected a value greater than 0, found 0"),
    ("a misspelt key", with_trace("  max_output: 10\n"),
     r":8: trace\.max_output: unknown key \(did you mean 'max_output_tokens'\?\)"),
    ("no file", edited(TRACE_SCENARIO, "  file: trace.jsonl\n", ""), r":5: trace\.file: required field is missing"),
    ("a missing file", edited(TRACE_SCENARIO, "trace.jsonl", "other.jsonl"),
     r":6: trace\.file: file not found: .*other\.jsonl$"),
    ("requests and a trace", edited(TRACE_SCENARIO, "trials: 4\n", "requests:\n  - {name: A, start: 0, stop: 10}\n"
                                    "trials: 4\n"), r":8: requests: expected either named `requests` or a `trace`, "
     r"found both"),
    ("neither", TRACE_SCENARIO.replace("trace:\n  file: trace.jsonl\n  block_tokens: 16\n", ""),
     r":1: requests: expected either named `requests` or a `trace`, found neither"),
    ("a named request", edited(TRACE_SCENARIO, "kind: gain", "request: A, kind: gain"),
     r":10: expectations\[0\]\.request: a trace has no named requests: expected \"\*\" \(the whole replay\), "
     r"found 'A'"),
]


@pytest.mark.parametrize(("case", "text", "message"), SECTION_PROBLEMS, ids=[c[0] for c in SECTION_PROBLEMS])
def test_a_bad_trace_section_is_one_line_naming_the_field(tmp_path: Path, case: str, text: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=r"replay\.yaml" + message) as caught:
        load_scenario(scenario_file(tmp_path, text))
    assert "\n" not in str(caught.value)


def test_an_override_keeps_the_trace_and_its_lines(tmp_path: Path) -> None:
    scenario = with_options(load_scenario(scenario_file(tmp_path)), overrides_given({"trials": 6}))
    assert scenario.trials == 6 and scenario.trace is not None
    assert str(scenario.error(("trace", "records"), "x")).endswith("replay.yaml:5: trace.records: x")


def test_a_caller_of_named_requests_refuses_a_trace_scenario_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"replay\.yaml: trace: a trace scenario has no named requests: its "
                       r"trials replay the trace; run it with pytest qualify, or give a scenario of named requests$"):
        scenario_requests(load_scenario(scenario_file(tmp_path)))


@pytest.mark.parametrize(("lines", "message"), [
    ([mooncake(0, 1000, [0, 1]), {"timestamp": 5, "input_length": 10, "output_length": 1}],
     "trace.jsonl:2: hash_ids: required field is missing"),
    ([mooncake(10, 1000, [0, 1]), mooncake(5, 1000, [0, 2])],
     "trace.jsonl:2: timestamp: expected timestamps in arrival order: 5 ms is before 10 ms of the record before it "
     "(line 1)"),
    ([mooncake(0, 1000, [0, 1]), mooncake(5, 1600, [0, 2])],
     "trace.jsonl:2: hash_ids: expected 4 ids, one per 512-token block of input_length 1600 (ceil(1600 / 512)), "
     "found 2"),
])
def test_pytest_qualify_refuses_a_bad_trace_before_any_run_folder(tmp_path: Path, lines: list[dict[str, object]],
                                                                  message: str) -> None:
    """The run's setup reads and checks the trace: one line naming file:line and the field, exit status 4,
    no run folder made, no host touched."""
    scenario = write_file(tmp_path, TRACE_SCENARIO, "replay.yaml")
    trace = write_trace(tmp_path, lines)
    reports = tmp_path / "reports"
    run = run_qualify(REPO / "hosts.yaml", reports, "--scenario", str(scenario))
    assert run.returncode == USAGE_ERROR, run.output
    assert [line for line in run.output.splitlines() if line.strip()] == [
        f"ERROR: {trace.parent}/{message}"], run.output
    assert not reports.exists()
