"""cache_qualify.stats.verdict: tests against scipy's reference numbers, outcomes, degenerate data, plans, A/A."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from scipy import stats

from cache_qualify.errors import PlanError
from cache_qualify.stats.verdict import (Assertion, VerdictWarning, _holm, check_plan, evaluate, power_of,
                              trials_for_power)
from tests import stats_sim

ALPHA = 0.05
HIT = Assertion("hit_rate", "B-new-start", "gain", True)
WAIT = Assertion("readiness_wait_ns", "B-new-start", "gain", False)
KV = Assertion("kv_pages", "startup", "no_regression", True, margin=0.02)


def _normal(mean: float, sd: float, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(mean, sd, n)


def test_assertion_id_and_validation() -> None:
    assert HIT.id == "hit_rate-gain[B-new-start]"
    assert KV.id == "kv_pages-no_regression[startup]"
    with pytest.raises(PlanError, match=r"hit_rate-loss\[A\]: `kind` must be 'gain' or 'no_regression', got 'loss'"):
        Assertion("hit_rate", "A", "loss", True)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"`min_effect` and `margin` must be >= 0, got -0.1 and 0.0"):
        Assertion("hit_rate", "A", "gain", True, min_effect=-0.1)


def test_welch_p_value_and_interval_match_scipy() -> None:
    base, cand = _normal(0.86, 0.002, 6, 1), _normal(0.862, 0.001, 5, 2)
    [v] = evaluate([HIT], {HIT.id: (base, cand)}, alpha=ALPHA)
    reference = stats.ttest_ind(cand, base, equal_var=False, alternative="greater")
    assert v.p_value == pytest.approx(reference.pvalue, rel=1e-9)
    two_sided = stats.ttest_ind(cand, base, equal_var=False).confidence_interval(0.90)
    assert (v.ci.low, v.ci.high, v.ci.level) == pytest.approx((two_sided.low, two_sided.high, 0.90))
    assert v.difference == pytest.approx(cand.mean() - base.mean())


def test_lower_is_better_is_oriented_and_the_rank_test_matches_scipy() -> None:
    base, cand = _normal(2.0e9, 6e7, 6, 3), _normal(1.8e9, 6e7, 6, 4)
    [v] = evaluate([WAIT], {WAIT.id: (base, cand)}, alpha=ALPHA, method="mannwhitney")
    reference = stats.mannwhitneyu(base, cand, alternative="greater")  # candidate lower = better
    assert v.p_value == pytest.approx(reference.pvalue)
    assert v.outcome == "pass" and v.difference < 0


def test_holm_adjusted_p_values_match_the_textbook() -> None:
    adjusted, ranks = _holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert ranks == [1, 3, 2, 0]


def test_holm_decides_over_the_gain_family_only() -> None:
    # each gain alone would pass at 0.05; over two, the weaker one needs p <= 0.05 after the first
    base = _normal(0.86, 0.001, 8, 5)
    strong, weak = base + 0.004, base + 0.0009 + _normal(0, 0.0006, 8, 6)
    second = Assertion("hit_rate", "A-third-read", "gain", True)
    samples = {HIT.id: (base, strong), second.id: (base, weak), KV.id: (np.full(8, 41300.0) +
               _normal(0, 30, 8, 7), np.full(8, 41290.0) + _normal(0, 30, 8, 8))}
    verdicts = evaluate([HIT, second, KV], samples, alpha=ALPHA)
    by_id = {v.assertion.id: v for v in verdicts}
    ps = sorted([by_id[HIT.id].p_value, by_id[second.id].p_value])
    assert by_id[HIT.id].p_adjusted == pytest.approx(2 * ps[0])
    assert by_id[second.id].p_adjusted == pytest.approx(max(2 * ps[0], ps[1]))
    assert by_id[KV.id].p_adjusted == by_id[KV.id].p_value
    assert by_id[KV.id].outcome == "pass"


def test_the_report_s_gain_passes_with_a_reason_and_json_figures() -> None:
    base, cand = _normal(0.86, 0.001, 5, 9), _normal(0.99, 0.001, 5, 10)
    [v] = evaluate([HIT], {HIT.id: (base, cand)}, alpha=ALPHA, method="permutation")
    assert v.outcome == "pass" and v.trials_needed is None
    assert re.match(r"Pass: the improvement 0\.1\d+ is significant \(one-sided p 0\.00397 <= 0\.05\)", v.reason)
    assert "permutation one-sided p" in v.reason and "5 and 5 trials" in v.reason
    figures = json.loads(json.dumps(v.as_dict(), allow_nan=False))
    assert figures["id"] == HIT.id and figures["baseline"] == list(base)
    assert figures["ci_level"] == pytest.approx(0.9)


def test_kv_pages_regression_fails_and_a_small_loss_inside_the_margin_passes() -> None:
    base = _normal(41_300, 30, 5, 11)
    [lost] = evaluate([KV], {KV.id: (base, 0.75 * base)}, alpha=ALPHA)
    assert lost.outcome == "fail"
    assert "no significant non-inferiority: the estimated difference is already past the margin" in lost.reason
    [small] = evaluate([KV], {KV.id: (base, base - 100)}, alpha=ALPHA)
    assert small.outcome == "pass"


def test_a_worse_candidate_fails_saying_it_was_not_better() -> None:
    third_read = Assertion("hit_rate", "A-third-read", "gain", True)
    [v] = evaluate([third_read], {third_read.id: (_normal(0.864, 0.001, 5, 12), _normal(0.696, 0.001, 5, 13))},
                   alpha=ALPHA)
    assert v.outcome == "fail"
    assert v.reason.startswith("Fail: no significant gain: the candidate was not better on average.")


def test_a_gain_that_cannot_reach_the_minimum_effect_fails() -> None:
    needy = Assertion("hit_rate", "B-new-start", "gain", True, min_effect=0.05)
    [v] = evaluate([needy], {needy.id: (_normal(0.86, 0.001, 5, 14), _normal(0.87, 0.001, 5, 15))}, alpha=ALPHA)
    assert v.outcome == "fail"
    assert "below the minimum effect 0.05" in v.reason


def test_an_underpowered_gain_is_inconclusive_naming_the_trials_that_would_decide() -> None:
    needy = Assertion("hit_rate", "B-new-start", "gain", True, min_effect=0.003)
    offsets = np.array([-0.002, 0.002, -0.001, 0.001])
    base, cand = 0.86 + offsets, 0.8615 + offsets[::-1]   # 0.0015 better, sd 0.0018: not significant
    [v] = evaluate([needy], {needy.id: (base, cand)}, alpha=ALPHA)
    assert v.outcome == "inconclusive"
    sd = math.sqrt((base.var(ddof=1) + cand.var(ddof=1)) / 2)
    assert v.trials_needed == trials_for_power(0.003, sd, alpha=ALPHA)
    assert v.trials_needed is not None and 4 < v.trials_needed <= 16
    assert power_of(0.003, sd, v.trials_needed, alpha=ALPHA) >= 0.9
    assert f"about {v.trials_needed} trials per build would give power 90% for 0.003" in v.reason


def test_trials_for_power_reaches_the_power() -> None:
    n = trials_for_power(0.0013, 0.001, alpha=ALPHA)
    assert n is not None
    assert power_of(0.0013, 0.001, n, alpha=ALPHA) >= 0.9 > power_of(0.0013, 0.001, n - 1, alpha=ALPHA)
    assert trials_for_power(-0.1, 0.001, alpha=ALPHA) is None


def test_zero_variance_is_decided_by_the_values_with_a_warning() -> None:
    same = [41_300.0] * 4
    with pytest.warns(VerdictWarning, match=r"zero variance"):
        verdicts = evaluate([KV, HIT], {KV.id: (same, same), HIT.id: ([0.9] * 4, [0.9] * 4)}, alpha=ALPHA)
    kv, hit = verdicts
    assert kv.outcome == "pass" and "the values decide without a test" in kv.reason
    assert hit.outcome == "fail" and "not better on average" in hit.reason


def test_one_trial_or_nan_is_inconclusive_and_explained() -> None:
    with pytest.warns(VerdictWarning, match=r"1 usable trial\(s\) on a side cannot estimate the noise"):
        [v] = evaluate([HIT], {HIT.id: ([0.86], [0.99])}, alpha=ALPHA)
    assert v.outcome == "inconclusive" and v.trials_needed == 2 and math.isnan(v.p_value)
    assert json.loads(json.dumps(v.as_dict(), allow_nan=False))["p_value"] is None
    with pytest.warns(VerdictWarning, match=r"2 non-finite candidate sample\(s\) were ignored"):
        [w] = evaluate([HIT], {HIT.id: ([0.86, 0.861, 0.859], [0.99, math.nan, 0.991, math.nan])}, alpha=ALPHA)
    assert w.outcome == "pass" and "2 non-finite candidate sample(s) were ignored." in w.reason
    with pytest.warns(VerdictWarning, match=r"0 usable trial"):
        [missing] = evaluate([HIT], {}, alpha=ALPHA)
    assert missing.outcome == "inconclusive"


@pytest.mark.parametrize(("method", "trials", "family", "message"), [
    ("mannwhitney", 3, 1, r"mannwhitney cannot reach alpha 0.01 .* smallest possible p is 0.05; "
                          r"it needs at least 5 trials per build"),
    ("mannwhitney", 4, 4, r"over 4 gain assertion\(s\) \(Holm: first at 0.0025\).*at least 6 trials"),
    ("permutation", 3, 1, r"permutation cannot reach .* at least 5 trials per build"),
    ("welch", 1, 1, r"welch cannot reach alpha 0.01 .* with 1 trial\(s\) per build; .*at least 2"),
])
def test_check_plan_refuses_plans_that_cannot_reach_alpha(method: str, trials: int, family: int,
                                                          message: str) -> None:
    with pytest.raises(PlanError, match=message):
        check_plan(method=method, alpha=0.01, trials_per_build=trials, family_size=family)  # type: ignore[arg-type]


def test_check_plan_accepts_reachable_plans_and_checks_the_last_sequential_look() -> None:
    check_plan(method="mannwhitney", alpha=0.01, trials_per_build=5, family_size=1)
    check_plan(method="welch", alpha=0.01, trials_per_build=2, family_size=8)
    with pytest.raises(PlanError, match=r"last sequential look at nominal"):
        check_plan(method="mannwhitney", alpha=0.05, trials_per_build=4, family_size=3, looks=(2, 3, 4))
    check_plan(method="mannwhitney", alpha=0.05, trials_per_build=4, family_size=3)
    with pytest.raises(PlanError, match=r"`method` must be one of welch, mannwhitney, permutation, got 'ks'"):
        check_plan(method="ks", alpha=0.05, trials_per_build=5, family_size=1)  # type: ignore[arg-type]


def test_fixed_a_a_declares_a_gain_at_most_alpha_of_the_time_and_reports_no_significant_gain() -> None:
    runs = 2000
    zero = [0.0] * len(stats_sim.LAB)
    result = stats_sim.simulate(stats_sim.LAB, zero, stats_sim.AA_FIXED, runs=runs, alpha=ALPHA, seed=1)
    assert result.gains_declared <= stats_sim.binomial_bound(runs, ALPHA)
    gains = sum(result.outcomes.values())
    assert result.outcomes["fail"] >= 0.9 * gains  # "fail: no significant gain", inconclusive only near the line
