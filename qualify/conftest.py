"""Parametrization of the qualification tests: one test per scenario, candidate and assertion.

Each scenario is one xdist group (`--dist loadgroup`), so its tests run on one
worker, which claims a free host group and runs the scenario's trials once.
Test ids carry the scenario when several run, and the candidate when several
are compared with the baseline: ``reread-1g:two_choice:hit_rate-gain[B-new-start]``.
Without an inventory the run stops before collecting, with one usage line.
"""

from __future__ import annotations

import pytest

from cache_qualify.plugin import state_of


@pytest.hookimpl(tryfirst=True)   # before pytest's header: the usage line is the only output
def pytest_sessionstart(session: pytest.Session) -> None:
    """`pytest qualify` without an inventory stops here, with one usage line and exit status 4."""
    state_of(session.config)


def pytest_collectstart(collector: pytest.Collector) -> None:
    """The same when collection finds these tests (a bare `pytest` above this folder), before
    pytest_generate_tests would raise it once per module, each with a traceback."""
    if isinstance(collector, pytest.Module):
        state_of(collector.config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """An assertion's test is also selected (`-k`) by the id earlier versions gave it, by the recorded
    quantity's name (``readiness_wait_ns-gain[B-new-start]``)."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        given = params.get("assertion_id")
        if isinstance(given, str) and given in _RECORDED_IDS:
            item.extra_keyword_matches.add(_RECORDED_IDS[given])


_RECORDED_IDS: dict[str, str] = {}   # an assertion's id -> its id by the recorded quantity's name


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "scenario_name" not in metafunc.fixturenames:
        return
    state = state_of(metafunc.config)
    several = len(state.scenarios) > 1
    if "assertion_id" in metafunc.fixturenames:
        from cache_qualify.qualification import arm_labels, assertions_for

        inventory = state.inventory
        _, arms = arm_labels(inventory.baseline, inventory.candidates)
        per = metafunc.definition.get_closest_marker("assertions_per")
        # the assertions on quantities read per request, or per start, or the bad-start check
        wanted = per.args[0] if per else None
        model = inventory.measurement
        params = []
        for given in state.scenarios:
            scenario = state.qualifier().scenario(given)
            for arm in arms:
                for a in assertions_for(scenario, model):
                    read = "bad_starts" if a.kind == "no_excess" else model.quantities[a.metric].per
                    if wanted is None or read == wanted:
                        _RECORDED_IDS[a.id] = a.recorded_id
                        parts = [scenario.name] * several + [arm] * (len(arms) > 1) + [a.id]
                        params.append(pytest.param(given, arm, a.id, id=":".join(parts),
                                                   marks=pytest.mark.xdist_group(scenario.name)))
        metafunc.parametrize(("scenario_name", "candidate", "assertion_id"), params)
    else:
        params = []
        for given in state.scenarios:
            name = state.qualifier().scenario(given).name
            params.append(pytest.param(given, id=name, marks=pytest.mark.xdist_group(name)))
        metafunc.parametrize("scenario_name", params)
