"""cache_qualify.stats.sequential: the boundary's false-positive rate, plans, and the sequential gate by simulation."""

from __future__ import annotations

import numpy as np
import pytest

from cache_qualify.errors import PlanError
from cache_qualify.stats.sequential import DEFAULT_BOUNDARY, Boundary, fractions_of, nominal_alpha, plan_looks
from cache_qualify.stats.verdict import Assertion, Verdict, carry, decided, evaluate
from tests import stats_sim

RUNS = 2000
ALPHA = 0.05


def test_plan_looks_adds_blocks_and_ends_at_the_maximum() -> None:
    assert plan_looks(initial=3, block=2, max_trials=10) == (3, 5, 7, 9, 10)
    assert plan_looks(initial=4, block=1, max_trials=4) == (4,)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(initial=1, block=1, max_trials=5), r"`initial` trials per build must be >= 2.*got 1"),
    (dict(initial=3, block=0, max_trials=5), r"`block`.*must be >= 1, got 0"),
    (dict(initial=6, block=1, max_trials=5), r"`max_trials` \(5\) must be >= the initial trials per build \(6\)"),
])
def test_plan_looks_refuses_impossible_plans(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_looks(**kwargs)


def test_single_look_tests_at_alpha_and_bad_looks_are_refused() -> None:
    assert nominal_alpha(0.05, 1, 1) == 0.05
    with pytest.raises(PlanError, match=r"`look` must be between 1 and 3, got 4"):
        nominal_alpha(0.05, 4, (3, 4, 5))
    with pytest.raises(PlanError, match=r"`looks` must be increasing positive trial counts, got \[5, 4\]"):
        fractions_of((5, 4))
    with pytest.raises(PlanError, match=r"`rho`.*must be > 0, got 0"):
        Boundary(rho=0)


def _crossing_rate(boundary: Boundary, alpha: float, fractions: tuple[float, ...], paths: int) -> float:
    """Monte Carlo: how often a null Brownian path crosses efficacy before futility stops it."""
    rng = np.random.default_rng(3)
    steps = np.diff(np.concatenate([[0.0], fractions]))
    scores = np.cumsum(rng.normal(size=(paths, len(fractions))) * np.sqrt(steps), axis=1)
    z = scores / np.sqrt(fractions)
    upper = np.asarray(boundary.critical_values(alpha, fractions))
    alive = np.ones(paths, bool)
    crossed = np.zeros(paths, bool)
    for k in range(len(fractions)):
        hit = alive & (z[:, k] >= upper[k])
        crossed |= hit
        alive &= ~hit
        if k < len(fractions) - 1:
            alive &= z[:, k] > boundary.futility_z
    return float(crossed.mean())


@pytest.mark.parametrize("boundary", [DEFAULT_BOUNDARY, Boundary(rho=3.0, futility_z=float("-inf"))])
def test_boundary_spends_exactly_alpha_on_the_normal_scale(boundary: Boundary) -> None:
    fractions = fractions_of(plan_looks(initial=3, block=1, max_trials=13))
    paths = 400_000
    rate = _crossing_rate(boundary, 0.05, fractions, paths)
    assert abs(rate - 0.05) < 3 * np.sqrt(0.05 * 0.95 / paths)


def test_o_brien_fleming_like_spending_is_strict_early_and_near_alpha_late() -> None:
    nominal = Boundary(rho=3.0, futility_z=float("-inf")).nominal_alphas(0.025, (0.2, 0.4, 0.6, 0.8, 1.0))
    assert nominal[0] < 0.001 < nominal[2] < nominal[-1] < 0.025


def _verdicts(effect: float, n: int, *, look: int, looks: tuple[int, ...]) -> list[Verdict]:
    a = Assertion("hit_rate", "B-new-start", "gain", True)
    rng = np.random.default_rng(4)
    samples = {a.id: (rng.normal(0.86, 0.001, n), rng.normal(0.86 + effect, 0.001, n))}
    return evaluate([a], samples, alpha=ALPHA, look=look, looks=looks)


def test_interim_look_continues_and_carry_keeps_decided_verdicts() -> None:
    looks = (3, 4, 5, 6)
    undecided = _verdicts(0.0012, 3, look=1, looks=looks)
    assert undecided[0].outcome == "inconclusive" and not decided(undecided)
    assert "more trials follow" in undecided[0].reason
    failed = _verdicts(-0.002, 4, look=2, looks=looks)
    assert failed[0].outcome == "fail" and decided(failed)
    later = _verdicts(0.02, 5, look=3, looks=looks)
    assert later[0].outcome == "pass"
    assert carry(failed, later) == failed  # binding futility: a fail stays a fail
    assert carry(undecided, later) == later


# --- the gate by simulation (tests/stats_sim.py; figures in docs/statistics.md) -----------------

def test_sequential_a_a_declares_a_gain_at_most_alpha_of_the_time() -> None:
    result = stats_sim.simulate(stats_sim.LAB, [0.0] * len(stats_sim.LAB), stats_sim.AA_SEQUENTIAL,
                                runs=RUNS, alpha=ALPHA, seed=2)
    assert result.gains_declared <= stats_sim.binomial_bound(RUNS, ALPHA)
    assert result.outcomes["inconclusive"] == 0  # every A/A gain ends decided: fail, or a rare false pass


def test_sequential_needs_fewer_trials_than_fixed_at_equal_power_for_a_moderate_effect() -> None:
    effect = stats_sim.moderate_effect(stats_sim.HIT_RATE.sd, alpha=ALPHA)
    fixed = stats_sim.simulate([stats_sim.HIT_RATE], [effect], stats_sim.FIXED_MODERATE,
                               runs=RUNS, alpha=ALPHA, seed=3)
    sequential = stats_sim.simulate([stats_sim.HIT_RATE], [effect], stats_sim.SEQUENTIAL_MODERATE,
                                    runs=RUNS, alpha=ALPHA, seed=4)
    # equal power within the simulation's error (99 %, two binomial proportions)
    tolerance = 2.58 * np.sqrt(2 * 0.9 * 0.1 / RUNS)
    assert abs(fixed.power - 0.9) < tolerance
    assert sequential.power >= fixed.power - tolerance
    # at least 30 % fewer trials per build on average, within the simulation's error (sd of N ~ 3)
    assert sequential.mean_trials <= 0.7 * 10 + 2.58 * 3 / np.sqrt(RUNS)
    assert sequential.mean_trials < 0.75 * fixed.mean_trials


def test_sequential_stops_at_the_minimum_for_the_report_s_large_effect() -> None:
    result = stats_sim.simulate([stats_sim.HIT_RATE], [0.13], stats_sim.LARGE, runs=RUNS, alpha=ALPHA, seed=5)
    assert result.power == 1.0
    assert result.max_trials_used == stats_sim.LARGE.trials
