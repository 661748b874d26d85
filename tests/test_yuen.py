"""cache_qualify.methods.yuen: Yuen's trimmed-mean t test equals scipy's (unpaired) and the one-sample trimmed t
built from scipy's trimming and winsorizing (paired); a spread that trimming removes is never a certainty; the
gate names it and sizes it for the power it prints. The promises every method keeps are in
tests/test_method_promises.py, which runs over every registered method."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats
from scipy.stats import mstats

from cache_qualify.errors import PlanError
from cache_qualify.methods import method
from cache_qualify.methods.yuen import TRIM
from cache_qualify.stats import exact
from cache_qualify.stats.levels import check_plan
from cache_qualify.stats.power import POWER, minimum_trials, trials_for_power
from cache_qualify.stats.verdict import Assertion, Trials, evaluate

YUEN = method("yuen")
WAIT = Assertion("readiness_wait", "B-new-start", "gain", False, unit="s")


def _blocked(base: np.ndarray, cand: np.ndarray) -> tuple[Trials, Trials]:
    blocks = tuple(range(base.size))
    return Trials(tuple(base), blocks=blocks), Trials(tuple(cand), blocks=blocks)


def _trimmed_t(d: np.ndarray, floor: float = 0.0) -> float:
    """The reference: Yuen's one-sample statistic from scipy's trimmed mean and winsorized values, its
    winsorized SD at least `floor`."""
    n = d.size
    kept = n - 2 * int(math.floor(TRIM * n))
    winsorized = np.asarray(mstats.winsorize(d, limits=(TRIM, TRIM)), float)
    # the middle values equal: the plain variance in the winsorized one's place
    spread = max(float(np.var(winsorized if np.ptp(winsorized) else d, ddof=1)), floor * floor)
    return float(stats.trim_mean(d, TRIM)) / math.sqrt((n - 1) * spread / (kept * (kept - 1)))


def _sign_flip_reference(d: np.ndarray, floor: float = 0.0) -> float:
    """The share of every sign vector of `d` whose trimmed t is at least the observed one, by enumeration."""
    observed = _trimmed_t(d, floor)
    flipped = [_trimmed_t(np.asarray(signs) * d, floor) for signs in itertools.product((1, -1), repeat=d.size)]
    return sum(t >= observed - 1e-9 * abs(observed) for t in flipped) / len(flipped)


def test_yuen_p_equals_scipys_trimmed_t_unpaired_and_the_sign_flip_p_below_five_blocks() -> None:
    rng = np.random.default_rng(11)
    for _ in range(200):
        n, m = rng.integers(3, 16, 2)
        x, y = rng.normal(0.3, 1, n), rng.standard_t(3, m)
        reference = stats.ttest_ind(x, y, trim=TRIM, equal_var=False, alternative="greater").pvalue
        assert YUEN.p_unpaired(x, y, seed=0) == pytest.approx(reference, rel=1e-9, abs=1e-15)
    for n in (2, 3, 4):      # fewer than 5 values: nothing trimmed, the t statistic's sign vectors
        short = rng.normal(0.3, 1, n)
        assert YUEN.p_paired(short, seed=0) == pytest.approx(_sign_flip_reference(short))


@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_no_count_of_blocks_below_the_minimum_can_pass_not_even_what_flags_leave(alpha: float) -> None:
    """`check_plan`'s minimum holds for every count a run can decide on: the blocks flagged starts leave
    included (on main the 2-4 left were read from Student's t, whose p has no floor)."""
    needed = minimum_trials(YUEN, alpha, paired=True)
    rng = np.random.default_rng(12)
    for n in range(2, needed):
        assert YUEN.minimum_p(n, paired=True) >= alpha, n
        steep = rng.normal(5.0, 0.1, n)      # every block far on the better side: the smallest p there is
        assert YUEN.p_paired(steep, seed=0) >= alpha, n
    with pytest.raises(PlanError, match=f"needs at least {needed} trials per build"):
        check_plan(method=YUEN, alpha=alpha, trials_per_build=needed - 1, paired=True)
    check_plan(method=YUEN, alpha=alpha, trials_per_build=needed, paired=True)


def test_a_six_block_run_at_001_does_not_pass_on_the_four_blocks_its_flags_leave() -> None:
    """Two baseline starts far out set their blocks aside; the four left cannot reach 0.01 (smallest p 1/16)."""
    base = np.array([0.5, 0.6, 9.9, 10.1, 10.05, 9.95])     # the first two: the lab's bad starts
    cand = np.array([10.0, 10.2, 9.9, 10.1, 10.05, 9.95]) + np.array([1.0, 1.1, 0.95, 1.05, 1.02, 0.98])
    gain = Assertion("readiness_wait", "B-new-start", "gain", True, unit="s")
    [v] = evaluate([gain], {gain.id: _blocked(base, cand)}, alpha=0.01, method="yuen")
    assert len(v.flagged) == 2 and "one-sided p 0.0625, 4 blocks" in v.reason, v.reason
    assert v.outcome != "pass", v.reason


def test_paired_p_is_the_share_of_sign_vectors_whose_trimmed_t_is_at_least_the_one_seen() -> None:
    """From 5 blocks the trimmed t's p is its exact sign-flip distribution (Student's t with h - 1 df passed
    5.9 % of equal builds at 5 blocks, alpha 0.05); its smallest p is 2 ** g over the sign vectors."""
    rng = np.random.default_rng(12)
    for n in (5, 6, 8):
        for _ in range(3):
            d = rng.normal(0.5, 1, n)
            assert YUEN.p_paired(d, seed=0) == pytest.approx(_sign_flip_reference(d), abs=1e-12)
    # flipping the one value trimmed from the bottom leaves the statistic as it was: 2 of 2 ** n vectors tie
    positive = np.array([0.9, 1.0, 1.1, 1.2, 1.3, 1.4])
    assert YUEN.p_paired(positive, seed=0) == YUEN.minimum_p(6, paired=True) == 2 / 64
    assert YUEN.minimum_p(5, paired=True) == 1 / 16 == YUEN.minimum_p(4, paired=True)
    assert minimum_trials(YUEN, 0.05, paired=True) == 6 and minimum_trials(YUEN, 0.01, paired=True) == 8


def test_the_resolution_floors_the_trimmed_spread_in_every_sign_vector() -> None:
    """Differences in whole steps whose winsorized SD (0.55) is below the step: the statistic takes 1 in the
    observed vector and in every other alike."""
    d = np.array([2, 3, 2, 3, 2, 3, 2])
    assert YUEN.p_paired(d, seed=0, floor=1.0) == pytest.approx(_sign_flip_reference(d.astype(float), 1.0))
    assert YUEN.p_paired(d, seed=0, floor=1.0) != YUEN.p_paired(d, seed=0)


@pytest.mark.parametrize(("base", "cand", "alpha"), [((0.80, 0.90), (0.83, 0.94), 0.05),
                                                      ((0.80, 0.90, 0.80), (0.82, 0.93, 0.82), 0.01)])
def test_yuen_applies_the_resolution_floor_its_reason_states(base: tuple[float, ...], cand: tuple[float, ...],
                                                           alpha: float) -> None:
    """Its reason said the test takes the block differences' sd as 0.01, but its p used 0.00707 (p 0.0452,
    a pass; the t test 0.0635) and 0.00577 (p 0.0099 at 0.01; the t test 0.0281). Below 5 blocks its p is
    the sign vectors' of the t statistic with that sd, as from 5."""
    gain = Assertion("hit_rate", "A-again", "gain", True, unit="fraction")
    samples = {gain.id: _blocked(np.array(base), np.array(cand))}
    with pytest.warns(UserWarning, match="so the test takes the block differences' sd as 0.01"):
        [y] = evaluate([gain], samples, alpha=alpha, method="yuen")
        [w] = evaluate([gain], samples, alpha=alpha, method="welch")
    diffs = np.array(cand) - np.array(base)
    assert y.p_value == pytest.approx(_sign_flip_reference(diffs, 0.01)) and y.outcome == w.outcome != "pass"
    assert y.noise_sd == pytest.approx(0.01)


def test_a_spread_that_trimming_removes_is_never_a_certainty() -> None:
    d = np.array([0.1, 0.1, 0.1, 0.1, 0.1, 3.0])     # the middle values equal: their spread is not the noise
    assert YUEN.p_paired(d, seed=0) == pytest.approx(_sign_flip_reference(d)) == 0.25
    assert math.isnan(YUEN.p_paired(np.full(6, 0.1), seed=0))      # no spread at all and no floor: no test


def test_the_gate_names_yuens_test_and_it_sets_a_slow_start_aside_in_p_not_in_the_mean() -> None:
    rng = np.random.default_rng(4)
    base = rng.uniform(1.0, 3.0, 10).round(2)
    cand = (base - 0.2 + rng.normal(0, 0.02, 10)).round(2)
    [paired] = evaluate([WAIT], {WAIT.id: _blocked(base, cand)}, alpha=0.05, method="yuen")
    assert paired.outcome == "pass"
    assert "Yuen's trimmed-mean t test of the block differences, one-sided p" in paired.reason
    [unpaired] = evaluate([WAIT], {WAIT.id: (Trials(tuple(base)), Trials(tuple(cand)))}, alpha=0.05, method="yuen")
    assert "Yuen's trimmed-mean t test, one-sided p" in unpaired.reason
    slow = cand.copy()
    slow[3] += 2.5      # worse by more than the nine blocks gain: the mean over every start is not better
    [v] = evaluate([WAIT], {WAIT.id: _blocked(base, slow)}, alpha=0.05, method="yuen")
    assert v.candidate_mean > v.baseline_mean and v.outcome != "pass" and v.ci.high > v.boundary


@pytest.mark.slow
@pytest.mark.parametrize("paired", [True, False])
@pytest.mark.parametrize("effect", [1.2, 0.8])
def test_yuen_at_the_trials_it_is_sized_for_reaches_the_power_printed(paired: bool, effect: float) -> None:
    """Seeded: at `trials_for_power(method="yuen")`, normal noise of SD 1, the power is at least `POWER`
    within the 99 % binomial bound of 1,000 runs."""
    rng = np.random.default_rng(int(effect * 10) + paired)
    alpha, runs = 0.01, 1000
    n = trials_for_power(effect, 1.0, alpha=alpha, method=YUEN, paired=paired)
    assert n is not None and n > trials_for_power(effect, 1.0, alpha=alpha, paired=paired)  # type: ignore[operator]
    hits = sum((YUEN.p_paired(rng.normal(effect, 1.0, n), seed=0) if paired else
                YUEN.p_unpaired(rng.normal(effect, 1.0, n), rng.normal(0.0, 1.0, n), seed=0)) < alpha
               for _ in range(runs))
    assert hits / runs >= POWER - 2.576 * math.sqrt(POWER * (1 - POWER) / runs), (n, hits / runs)


def test_p_is_the_same_on_the_values_lattice_however_fine() -> None:
    """The gate gives a data test its values on their lattice: for continuous figures Python integers far
    beyond a float's range of squares; Yuen's statistic does not depend on the scale."""
    rng = np.random.default_rng(2)
    values = rng.normal(2.0, 0.3, 24)
    both = exact.on_lattice([exact.rational(float(v)) for v in values])
    assert both.dtype == object and max(abs(int(v)) for v in both).bit_length() > 520   # squared: beyond 2 ** 1024
    x, y = both[:12], both[12:]
    assert YUEN.p_unpaired(x, y, seed=0) == pytest.approx(YUEN.p_unpaired(values[:12], values[12:], seed=0), rel=1e-9)
    assert YUEN.p_paired(x - y, seed=0) == pytest.approx(YUEN.p_paired(values[:12] - values[12:], seed=0), rel=1e-9)
