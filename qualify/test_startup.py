"""Startup: every rank of both builds starts in every trial, what the runtime measures once per start
(its KV cache's size, say) holds, and the candidate has no more bad starts than the baseline."""

from __future__ import annotations

import pytest

from cache_qualify.gate import RecordProperty, check_started, check_verdict
from cache_qualify.qualification import Qualifier


def test_all_ranks_started(qualifier: Qualifier, scenario_name: str) -> None:
    """Every rank of both builds started in every trial (a failure names host, rank, exit status, log)."""
    check_started(qualifier.result(scenario_name))


@pytest.mark.assertions_per("start")
def test_start_quantity(qualifier: Qualifier, scenario_name: str, candidate: str, assertion_id: str,
                        record_property: RecordProperty) -> None:
    """Named after the quantity (``test_kv_pages[kv_pages-no_regression[startup]]``): the candidate's
    starts show the gain asked for, or no regression beyond the margin, at the scenario's alpha."""
    check_verdict(qualifier.result(scenario_name), assertion_id, record_property, candidate)


@pytest.mark.assertions_per("bad_starts")
def test_bad_starts(qualifier: Qualifier, scenario_name: str, candidate: str, assertion_id: str,
                    record_property: RecordProperty) -> None:
    """Not shown to have more bad starts than the baseline: a user of the build pays for every start."""
    check_verdict(qualifier.result(scenario_name), assertion_id, record_property, candidate)
