"""cache_qualify.stats.sequential: the boundary's false-positive rate, plans, and the sequential gate by simulation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import special

from cache_qualify import cachedir
from cache_qualify.errors import PlanError
from cache_qualify.stats import sequential
from cache_qualify.stats.sequential import (DEFAULT_BOUNDARY, Boundary, fractions_of, nominal_alpha, plan_looks,
                                           units_per_look)
from cache_qualify.sizing.design import SEARCHED_TRIALS, Design
from cache_qualify.sizing.planning import planned_trials, sequential_design
from cache_qualify.validation.savings import at_power
from cache_qualify.validation.simulate import SHAPES, correlation
from cache_qualify.validation.promises import binomial_bound
from cache_qualify.stats.verdict import Assertion, Trials, Verdict, carry, decided, evaluate

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


@pytest.mark.parametrize("boundary", [DEFAULT_BOUNDARY, Boundary(rho=1.0, futility_z=0.0)])
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
    assert "more trials follow" in undecided[0].reason and undecided[0].trials_needed is None
    failed = _verdicts(-0.004, 4, look=2, looks=looks)
    assert failed[0].outcome == "fail" and decided(failed)
    assert "a regression is shown, not any gain" in failed[0].reason
    later = _verdicts(0.02, 5, look=3, looks=looks)
    assert later[0].outcome == "pass"
    assert carry(failed, later) == failed  # a decided verdict stays decided
    assert carry(undecided, later) == later


def test_binding_futility_fails_a_gain_whose_estimate_is_not_above_min_effect() -> None:
    a = Assertion("hit_rate", "B-new-start", "gain", True, min_effect=0.001)
    offsets = np.array([-0.002, 0.002, -0.001, 0.001])
    samples = {a.id: (0.86 + offsets, 0.8605 + offsets[::-1])}   # 0.0005 better: not above min_effect
    [v] = evaluate([a], samples, alpha=ALPHA, look=2, looks=(3, 4, 5, 6), boundary=Boundary(futility_z=0.0))
    assert v.outcome == "fail" and "binding futility" in v.reason
    [w] = evaluate([a], samples, alpha=ALPHA, look=2, looks=(3, 4, 5, 6))   # the default has none
    assert w.outcome == "inconclusive"


def test_the_default_boundary_spends_little_early_without_futility() -> None:
    assert (DEFAULT_BOUNDARY.rho, DEFAULT_BOUNDARY.has_futility) == (2.0, False)
    nominal = DEFAULT_BOUNDARY.nominal_levels(0.01, plan_looks(initial=3, block=1, max_trials=10))
    assert nominal[0] < 0.001 and 0.004 < nominal[-1] < 0.01


# --- the t-scale boundary: the sequential paired t test keeps alpha (vectorized, many runs) -------

NULL_RUNS = 100_000
SHIPPED = plan_looks(initial=4, block=1, max_trials=12)            # the shipped scenarios' design
PLANNED = plan_looks(initial=3, block=1, max_trials=22)            # what `plan` prints at 1.5 SD, four gains


def _null_passes(levels: tuple[float, ...], units: tuple[int, ...], *, paired: bool = True,
                 tail_df: float = math.inf, seed: int = 11) -> int:
    """Null runs (no difference) of the sequential t test on the units so far, look by look, that
    pass at some look: p below the look's level. Student's t noise with `tail_df` for heavy tails."""
    rng = np.random.default_rng(seed)
    n = np.asarray(units, float)
    at = np.asarray(units) - 1
    shape = (1 if paired else 2, NULL_RUNS, units[-1])
    draws = rng.standard_normal(shape) if math.isinf(tail_df) else rng.standard_t(tail_df, shape)
    sums, squares = np.cumsum(draws, axis=2)[..., at], np.cumsum(draws * draws, axis=2)[..., at]
    means = sums / n
    ss = squares - sums * means
    if paired:
        t, df = means[0] / np.sqrt(ss[0] / (n - 1) / n), n - 1
    else:
        t, df = (means[1] - means[0]) / np.sqrt((ss[0] + ss[1]) / (2 * n - 2) * 2 / n), 2 * n - 2
    return int((special.stdtr(df, -t) < np.asarray(levels)).any(axis=1).sum())


@pytest.mark.parametrize(("alpha", "looks", "paired", "tail_df"), [
    (0.01, SHIPPED, True, math.inf), (0.05, SHIPPED, True, math.inf), (0.01, PLANNED, True, math.inf),
    (0.01, SHIPPED, True, 3.0), (0.01, SHIPPED, False, math.inf)],
    ids=["0.01-4..12", "0.05-4..12", "0.01-3..22", "0.01-heavy-tails", "0.01-unpaired"])
def test_the_sequential_t_test_passes_a_null_at_most_alpha_of_the_time(
        alpha: float, looks: tuple[int, ...], paired: bool, tail_df: float) -> None:
    """100,000 null runs: a level a tenth above alpha (0.011 at 0.01) is beyond the bound and fails."""
    levels = DEFAULT_BOUNDARY.nominal_levels(alpha, looks, paired=paired)
    passes = _null_passes(levels, looks, paired=paired, tail_df=tail_df)
    assert passes <= binomial_bound(NULL_RUNS, alpha, 0.999), passes / NULL_RUNS


def test_a_boundary_computed_for_z_statistics_passes_too_many_nulls_of_a_t_test() -> None:
    """Why the boundary is on the t scale: the normal-scale one, carried over by p-values, exceeds alpha."""
    levels = DEFAULT_BOUNDARY.nominal_alphas(0.01, fractions_of(SHIPPED))
    assert _null_passes(levels, SHIPPED) > binomial_bound(NULL_RUNS, 0.01, 0.999)


def test_the_t_boundary_is_cached_deterministic_and_refuses_bad_units() -> None:
    first = DEFAULT_BOUNDARY.nominal_levels(0.01, SHIPPED)
    assert DEFAULT_BOUNDARY.nominal_levels(0.01, SHIPPED) == first
    assert first[0] == pytest.approx(0.01 * (4 / 12) ** 2)       # the first look: the exact t quantile
    assert DEFAULT_BOUNDARY.nominal_levels(0.01, (5,)) == (0.01,)
    with pytest.raises(PlanError, match=r"units per look must increase strictly from at least 2, got \[1, 3\]"):
        DEFAULT_BOUNDARY.nominal_levels(0.01, (1, 3))
    assert units_per_look((4, 6, 7), 2) == (2, 3, 4)



def test_t_levels_kept_on_disk_are_the_simulated_ones_and_any_change_simulates_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run of the gate asks for the same few designs' levels: they are read back from disk, digit
    for digit, by another process (here: with the in-process cache cleared); another design, alpha or
    boundary is simulated; a damaged file is simulated again; an unwritable folder only costs the time."""
    monkeypatch.setattr(cachedir, "_current", cachedir.CacheDir(tmp_path))   # levels in tmp_path/t-levels
    simulated: list[tuple[int, ...]] = []
    real = sequential._simulated_t_levels

    def counted(boundary: Boundary, alpha: float, units: tuple[int, ...], paired: bool,
                prior_df: int = 0) -> tuple[float, ...]:
        simulated.append(units)
        return real(boundary, alpha, units, paired, prior_df)

    monkeypatch.setattr(sequential, "_simulated_t_levels", counted)

    def levels(alpha: float, units: tuple[int, ...], boundary: Boundary = DEFAULT_BOUNDARY) -> tuple[float, ...]:
        sequential._t_levels.cache_clear()   # as a new process
        return boundary.nominal_levels(alpha, units)

    first = levels(0.01, (3, 5, 7))
    assert simulated == [(3, 5, 7)] and len(list((tmp_path / "t-levels").glob("*.json"))) == 1
    assert levels(0.01, (3, 5, 7)) == first and simulated == [(3, 5, 7)]          # read back
    assert first == real(DEFAULT_BOUNDARY, 0.01, (3, 5, 7), True)                  # the simulated digits
    levels(0.05, (3, 5, 7))
    levels(0.01, (3, 5, 8))
    levels(0.01, (3, 5, 7), Boundary(rho=3.0))
    assert len(simulated) == 4 and len(list((tmp_path / "t-levels").glob("*.json"))) == 4
    for stored in (tmp_path / "t-levels").glob("*.json"):
        stored.write_text("[0.001, ")                                              # cut short
    assert levels(0.01, (3, 5, 7)) == first and len(simulated) == 5
    monkeypatch.setattr(cachedir, "_current", cachedir.CacheDir(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("not a folder")
    assert levels(0.01, (3, 5, 7)) == first and len(simulated) == 6
    assert not list(tmp_path.glob("**/*.tmp"))


# --- the gate by simulation: tests/test_validation.py (cache_qualify.validation.promises) -----------


def test_more_trials_decide_what_the_fixed_design_left_inconclusive() -> None:
    """A wait gain of 3 x min_effect with start noise: inconclusive at 4 trials per build, decided by 12."""
    a = Assertion("readiness_wait_ns", "B-new-start", "gain", False, min_effect=2e8)
    rng = np.random.default_rng(12)
    base, cand = rng.normal(2.1e9, 2.5e8, 12), rng.normal(1.5e9, 2.5e8, 12)
    blocks = tuple(range(12))

    def trials(values: np.ndarray, n: int) -> Trials:
        return Trials(tuple(values[:n]), blocks[:n], blocks[:n])

    [fixed] = evaluate([a], {a.id: (trials(base, 4), trials(cand, 4))}, alpha=0.01)
    assert fixed.outcome == "inconclusive" and fixed.trials_needed is not None
    looks = plan_looks(initial=4, block=1, max_trials=12)
    verdicts: list[Verdict] | None = None
    for k, n in enumerate(looks, start=1):
        verdicts = carry(verdicts, evaluate([a], {a.id: (trials(base, n), trials(cand, n))}, alpha=0.01,
                                            look=k, looks=looks))
        if decided(verdicts):
            break
    assert verdicts is not None and decided(verdicts)


# --- the design `plan` prints against the fixed design, vectorized (normal noise, paired t) -------

DESIGN_RUNS = 20_000
GAIN_SHAPES = {1: "single-gain", 2: "two-gain", 4: "reread-1g"}


def _gain_correlation(gains: int) -> np.ndarray:
    items = SHAPES[GAIN_SHAPES[gains]]
    keep = [k for k, item in enumerate(items) if item.kind == "gain"]
    return correlation(items)[np.ix_(keep, keep)]


def _runs_to_decide(effect_sd: float, looks: tuple[int, ...], levels: tuple[float, ...], gains: int,
                    seed: int) -> tuple[float, float]:
    """(power, mean trials per build) of `gains` gains of `effect_sd` (per-trial SDs) that must all pass,
    each carried once passed, the run stopping when all have (the gate's rule); the block differences
    correlated as the simulated lab's gains are (its two waits, a request's hit rate and wait)."""
    rng = np.random.default_rng(seed)
    n = np.asarray(looks, float)
    chol = np.linalg.cholesky(_gain_correlation(gains))
    z = np.einsum("ij,rjt->rit", chol, rng.standard_normal((DESIGN_RUNS, gains, looks[-1])))
    diffs = math.sqrt(2) * z + effect_sd
    at = np.asarray(looks) - 1
    sums, squares = np.cumsum(diffs, axis=2)[..., at], np.cumsum(diffs * diffs, axis=2)[..., at]
    means = sums / n
    t = means / np.sqrt((squares - sums * means) / (n - 1) / n)
    passed = special.stdtr(n - 1, -t) < np.asarray(levels)
    when = np.where(passed.any(axis=2), passed.argmax(axis=2), len(looks)).max(axis=1)
    all_passed = when < len(looks)
    used = np.where(all_passed, n[np.minimum(when, len(looks) - 1)], looks[-1])
    return float(all_passed.mean()), float(used.mean())


@pytest.mark.parametrize("alpha", [0.01, 0.05])
@pytest.mark.parametrize("gains", [1, 2, 4])
def test_the_planned_sequential_design_never_costs_more_than_the_fixed_design_at_power_0_9(
        alpha: float, gains: int) -> None:
    """For effects of 1.5 to 3 SD: the design `plan` prints (chosen per plan: first look, maximum, spending
    shape) reaches the planned power 0.9 (within simulation error, 99 %), and its mean trials are at most
    those of the fixed design at exactly power 0.9: interpolated between the two whole numbers of trials
    whose simulated power brackets 0.9 (a random choice between them), so below the fixed design `plan`
    prints too. The runs here are seeded apart from the plan's own."""
    tolerance = 2.33 * math.sqrt(0.9 * 0.1 / DESIGN_RUNS)
    for k, effect in enumerate((1.5, 2.0, 2.5, 3.0)):
        fixed = planned_trials(effect, 1.0, alpha=alpha, gains=gains, correlation=_gain_correlation(gains))
        assert fixed is not None
        design = sequential_design(fixed, effect, alpha=alpha, gains=gains, correlation=_gain_correlation(gains))
        curve = [(_runs_to_decide(effect, (n,), (alpha,), gains, seed=100 * k + n)[0], float(n))
                 for n in range(max(2, fixed - 3), fixed + 2)]
        at_0_9 = at_power(curve, 0.9)
        assert at_0_9 is not None, (effect, curve)
        power, trials = _runs_to_decide(effect, design.looks, design.boundary.nominal_levels(alpha, design.looks),
                                        gains, seed=k + 10)
        assert power >= 0.9 - tolerance, (effect, design, power)
        assert trials <= min(at_0_9, fixed), (effect, design, trials, at_0_9)


def test_the_design_is_the_fixed_one_where_nothing_sequential_is_cheaper() -> None:
    """Two blocks leave no look before the last, a noiseless plan has nothing to search, and no lab runs a
    design of more than `SEARCHED_TRIALS` trials (82,000 with four gains once asked the search for 59 GiB):
    the fixed design."""
    assert sequential_design(2, 5.0, alpha=0.05) == Design(2, 2)
    assert sequential_design(6, math.inf, alpha=0.05) == Design(6, 6)
    assert sequential_design(82_000, 0.0126, alpha=0.01, gains=4) == Design(82_000, 82_000)
    assert sequential_design(SEARCHED_TRIALS + 1, 0.25, alpha=0.01) == Design(SEARCHED_TRIALS + 1, SEARCHED_TRIALS + 1)
    chosen = sequential_design(4, 3.0, alpha=0.05)
    assert chosen.first < chosen.maximum and chosen.mean_trials < 4 and chosen.power >= 0.9
