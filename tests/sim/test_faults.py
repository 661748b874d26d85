"""Fault flags: parsing, and which rank and which request or scrape each acts on."""

from __future__ import annotations

import pytest

from cache_qualify.sim.faults import Fault, FaultKind, FaultState, RequestAction, ScrapeAction, parse_fault


@pytest.mark.parametrize(("text", "fault"), [
    ("exit-at-start", Fault(FaultKind.EXIT_AT_START)),
    ("crash-on-request:3", Fault(FaultKind.CRASH_ON_REQUEST, 3)),
    ("hang-on-request:1", Fault(FaultKind.HANG_ON_REQUEST, 1)),
    ("metrics-missing", Fault(FaultKind.METRICS_MISSING)),
    ("metrics-500", Fault(FaultKind.METRICS_500, 1)),
    ("metrics-garbage:4", Fault(FaultKind.METRICS_GARBAGE, 4)),
    ("prefix-reuse", Fault(FaultKind.PREFIX_REUSE)),
])
def test_every_kind_parses_and_prints_back(text: str, fault: Fault) -> None:
    assert parse_fault(text) == fault
    assert str(fault) == text


@pytest.mark.parametrize(("text", "match"), [
    ("crash", "unknown fault 'crash'; expected one of exit-at-start, crash-on-request:N"),
    ("hang-on-request", "fault 'hang-on-request' needs a request number, e.g. hang-on-request:3"),
    ("exit-at-start:2", "fault 'exit-at-start' takes no number, found 'exit-at-start:2'"),
    ("crash-on-request:0", "needs a whole number >= 1 after ':', found '0'"),
    ("metrics-500:x", "needs a whole number >= 1 after ':', found 'x'"),
])
def test_bad_faults_say_what_is_allowed(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_fault(text)


def test_a_counted_fault_acts_on_its_request_of_its_rank_only() -> None:
    fault = parse_fault("crash-on-request:2")
    mine = FaultState(fault, fault_rank=1, rank=1)
    other = FaultState(fault, fault_rank=1, rank=0)
    assert [mine.on_request()[0] for _ in range(3)] == [RequestAction.SERVE, RequestAction.CRASH,
                                                        RequestAction.SERVE]
    assert {other.on_request()[0] for _ in range(3)} == {RequestAction.SERVE}


def test_metrics_faults_start_at_their_scrape() -> None:
    state = FaultState(parse_fault("metrics-garbage:2"), fault_rank=0, rank=0)
    assert [state.on_scrape() for _ in range(3)] == [ScrapeAction.SERVE, ScrapeAction.GARBAGE,
                                                     ScrapeAction.GARBAGE]
    assert FaultState(parse_fault("metrics-500"), fault_rank=0, rank=0).on_scrape() is ScrapeAction.ERROR_500


def test_prefix_reuse_is_server_wide_and_metrics_missing_is_per_rank() -> None:
    assert FaultState(parse_fault("prefix-reuse"), fault_rank=2, rank=0).content_keyed_prefix_cache
    assert not FaultState(parse_fault("metrics-missing"), fault_rank=2, rank=0).drops_readiness_metric
    assert FaultState(parse_fault("metrics-missing"), fault_rank=2, rank=2).drops_readiness_metric
    assert not FaultState(None, fault_rank=0, rank=0).exits_at_start
