"""The cache under test, request by request: every trial's measurements can be trusted, its counters add
up, and each of the scenario's assertions on a quantity read per request holds (one test per assertion
and candidate, named after the runtime's cache: ``test_row_cache[hit_rate-gain[B-new-start]]``,
``test_prompt_cache[hit_rate-gain[A-again]]``)."""

from __future__ import annotations

import pytest

from cache_qualify.gate import (FAILED, INVALID, RecordProperty, check_counters, check_prediction, check_trials_valid,
                                check_verdict, record_predicted)
from cache_qualify.qualification import Qualifier


@pytest.mark.qualify_scenarios(prefix_reuse="forbid")
def test_no_prefix_cache_reuse(qualifier: Qualifier, scenario_name: str) -> None:
    """No response reported cached prompt tokens and no counter was reset: every request read the cache
    under test, not a prefix cache (scenarios that forbid prefix reuse)."""
    check_trials_valid(qualifier.result(scenario_name), INVALID, "trials whose measurements cannot be trusted")


@pytest.mark.qualify_scenarios(prefix_reuse="measure")
def test_no_counter_reset(qualifier: Qualifier, scenario_name: str) -> None:
    """No counter was reset during a request (scenarios whose cache under test is the prefix cache:
    its reuse is measured, not forbidden)."""
    check_trials_valid(qualifier.result(scenario_name), INVALID, "trials whose measurements cannot be trusted")


def test_trials_completed(qualifier: Qualifier, scenario_name: str) -> None:
    """No rank died, hung or lost its metrics during a request sequence."""
    check_trials_valid(qualifier.result(scenario_name), FAILED, "trials that failed mid-sequence")


def test_counter_consistency(qualifier: Qualifier, scenario_name: str) -> None:
    """Per request and host the counters add up as the runtime declares them (the row cache's: misses =
    rows added + evictions + refused inserts, refused >= 0; resident rows within capacity)."""
    check_counters(qualifier, scenario_name)


@pytest.mark.qualify_predictions
def test_prediction(qualifier: Qualifier, scenario_name: str, arm: str, record_property: RecordProperty) -> None:
    """The build's measured hit rate of every request equals what its cache's emulator predicts for the
    same starts, from the build's parameters as read from its flags and its start (within the profile's
    band where copies run at once): a cache the build claims but lacks fails here, naming both values.
    One per scenario of named requests and build, where the runtime's cache has an emulator."""
    check_prediction(qualifier, scenario_name, arm, record_property)


@pytest.mark.assertions_per("request")
def test_cache(qualifier: Qualifier, scenario_name: str, candidate: str, assertion_id: str,
               record_property: RecordProperty) -> None:
    """The candidate shows the gain the assertion asks for (at least its minimum effect), or no regression
    beyond its margin, at the scenario's alpha; its figures are the test's JUnit properties (a hit rate's
    with its predicted beside measured value, where the runtime's cache has an emulator)."""
    record_predicted(qualifier, scenario_name, candidate, assertion_id, record_property)
    check_verdict(qualifier.result(scenario_name), assertion_id, record_property, candidate)
