"""cache_qualify.methods.yuen: Yuen's trimmed-mean t test equals scipy's (unpaired) and the one-sample trimmed t
built from scipy's trimming and winsorizing (paired); a spread that trimming removes is never a certainty; the
gate names it and sizes it for the power it prints. The promises every method keeps are in
tests/test_method_promises.py, which runs over every registered method."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from scipy.stats import mstats

from cache_qualify.methods import method
from cache_qualify.methods.yuen import TRIM
from cache_qualify.stats import exact
from cache_qualify.stats.power import POWER, trials_for_power
from cache_qualify.stats.verdict import Assertion, Trials, evaluate

YUEN = method("yuen")
WAIT = Assertion("readiness_wait", "B-new-start", "gain", False, unit="s")


def _blocked(base: np.ndarray, cand: np.ndarray) -> tuple[Trials, Trials]:
    blocks = tuple(range(base.size))
    return Trials(tuple(base), blocks=blocks), Trials(tuple(cand), blocks=blocks)


def _one_sample_trimmed_t(d: np.ndarray) -> float:
    """The reference: Yuen's one-sample statistic from scipy's trimmed mean and winsorized values."""
    n = d.size
    kept = n - 2 * int(math.floor(TRIM * n))
    winsorized = np.asarray(mstats.winsorize(d, limits=(TRIM, TRIM)), float)
    se = math.sqrt((n - 1) * float(np.var(winsorized, ddof=1)) / (kept * (kept - 1)))
    return float(stats.t.sf(stats.trim_mean(d, TRIM) / se, kept - 1))


def test_yuen_p_equals_scipys_trimmed_t_unpaired_and_the_reference_paired() -> None:
    rng = np.random.default_rng(11)
    for _ in range(200):
        n, m = rng.integers(3, 16, 2)
        x, y = rng.normal(0.3, 1, n), rng.standard_t(3, m)
        reference = stats.ttest_ind(x, y, trim=TRIM, equal_var=False, alternative="greater").pvalue
        assert YUEN.p_unpaired(x, y, seed=0) == pytest.approx(reference, rel=1e-9, abs=1e-15)
        d = rng.normal(0.3, 1, n)
        assert YUEN.p_paired(d, seed=0) == pytest.approx(_one_sample_trimmed_t(d), rel=1e-9)
    short = rng.normal(0.3, 1, 4)      # fewer than 5 values: nothing trimmed, the t test
    assert YUEN.p_paired(short, seed=0) == pytest.approx(stats.ttest_1samp(short, 0, alternative="greater").pvalue)


def test_a_spread_that_trimming_removes_is_never_a_certainty() -> None:
    d = np.array([0.1, 0.1, 0.1, 0.1, 0.1, 3.0])     # the middle values equal: their spread is not the noise
    # the plain variance in the winsorized one's place: 6 values, 4 kept, 3 df
    expected = stats.t.sf(stats.trim_mean(d, TRIM) / math.sqrt(5 * np.var(d, ddof=1) / (4 * 3)), 3)
    assert YUEN.p_paired(d, seed=0) == pytest.approx(expected, rel=1e-9) and expected > 0.4
    assert math.isnan(YUEN.p_paired(np.full(6, 0.1), seed=0))      # no spread at all: no test possible
    base = np.array([2.0, 2.4, 1.8, 2.2, 2.6, 2.1])
    with pytest.warns(UserWarning, match="block differences were all equal"):
        [v] = evaluate([WAIT], {WAIT.id: _blocked(base, (base - 0.3).round(2))}, alpha=0.05, method="yuen")
    assert v.outcome == "inconclusive" and "No test was possible." in v.reason


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
    n = trials_for_power(effect, 1.0, alpha=alpha, method="yuen", paired=paired)
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
