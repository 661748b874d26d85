"""Row cache: one test per assertion of the scenario, plus the checks that make the data trustworthy."""

from __future__ import annotations

import pytest

from cache_qualify.gate import FAILED, INVALID, RecordProperty, check_trials_valid, check_verdict
from cache_qualify.qualification import Qualifier


def test_no_prefix_cache_reuse(qualifier: Qualifier, scenario_name: str) -> None:
    """cached_tokens was 0 in every response and no counter was reset: every request read its rows."""
    check_trials_valid(qualifier.result(scenario_name), INVALID, "trials whose measurements cannot be trusted")


def test_trials_completed(qualifier: Qualifier, scenario_name: str) -> None:
    """No rank died, hung or lost its metrics during a request sequence."""
    check_trials_valid(qualifier.result(scenario_name), FAILED, "trials that failed mid-sequence")


def test_counter_consistency(qualifier: Qualifier, scenario_name: str) -> None:
    """Per request and host: misses = rows added + evictions + refused, with refused >= 0."""
    from cache_qualify.report.consistency import counter_problems

    result = qualifier.result(scenario_name)
    problems = counter_problems(qualifier.store, result.scenario, qualifier.inventory.measurement)
    assert not problems, "row cache counters do not add up:\n" + "\n".join(problems)


@pytest.mark.assertions_per("request")
def test_row_cache(qualifier: Qualifier, scenario_name: str, candidate: str, assertion_id: str,
                   record_property: RecordProperty) -> None:
    check_verdict(qualifier.result(scenario_name), assertion_id, record_property, candidate)
