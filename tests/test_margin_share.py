"""A margin that is a share of the baseline's mean (`no_regression`, `margin: N %`, absolute) tested with
that mean's noise (`cache_qualify.stats.compare.margin_tested`): the level holds at the boundary for
margins from 1 % to 100 %, the shipped scenarios' among them (1, 2, 5 and 90 %)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from cache_qualify.stats.starts import FALSE_FLAG_RATE
from cache_qualify.stats.verdict import Assertion, Trials, VerdictWarning, evaluate
from cache_qualify.validation.simulate import binomial_bound
from tests.support.pair_sim import clopper_pearson

BLOCKS = 6


def at_the_boundary(margin: float, *, runs: int, alpha: float, seed: int, method: str = "welch",
                    higher_is_better: bool = False) -> int:
    """Passes of a candidate exactly at the margin ((1 + m) x the baseline's mean for a time, (1 - m) x
    for a rate), 6 blocks, each build's starts with a CV of 10 %."""
    return boundary_runs(margin, runs=runs, alpha=alpha, seed=seed, method=method,
                         higher_is_better=higher_is_better)[0]


def boundary_runs(margin: float, *, runs: int, alpha: float, seed: int, method: str = "welch",
                  higher_is_better: bool = False) -> tuple[int, int]:
    """`at_the_boundary`'s passes, and the runs in which a start was flagged (normal noise only)."""
    rng = np.random.default_rng(seed)
    a = Assertion("ttft_s" if not higher_is_better else "hit_rate", "r", "no_regression", higher_is_better,
                  margin=margin, unit="s" if not higher_is_better else "fraction")
    factor = 1 - margin if higher_is_better else 1 + margin
    ids = tuple(range(BLOCKS))
    passes = flagged = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VerdictWarning)
        for _ in range(runs):
            b = 1 + 0.1 * rng.standard_normal(BLOCKS)
            c = factor * (1 + 0.1 * rng.standard_normal(BLOCKS))
            v, = evaluate([a], {a.id: (Trials(tuple(b), ids, ids), Trials(tuple(c), tuple(100 + i for i in ids), ids))},
                          alpha=alpha, method=method)
            passes += v.outcome == "pass"
            flagged += bool(v.flagged)
    return passes, flagged


@pytest.mark.slow
@pytest.mark.parametrize(("margin", "runs"), [(0.01, 400), (0.05, 400), (0.2, 400), (0.5, 600), (0.9, 1000),
                                              (1.0, 1000)])
def test_the_level_holds_at_the_margin(margin: float, runs: int) -> None:
    """Taking the boundary as known passed 91 of 1,000 at 90 % and 96 at 100 % (bound 67)."""
    passes = at_the_boundary(margin, runs=runs, alpha=0.05, seed=int(margin * 100))
    assert passes <= binomial_bound(runs, 0.05), (margin, passes)


@pytest.mark.slow
def test_starts_are_flagged_on_the_quantity_the_margin_tests() -> None:
    """At the boundary of a 90 % and a 100 % margin the candidate's starts vary (1 + m) x the baseline's;
    flagged on the recorded values, normal starts were flagged in 128 of 8,000 runs (1.6 %, above the
    documented 1 %; bound 101) and a run with one set aside passed about a fifth of the time: 5.37 % at
    alpha 0.05 in an audit of 8,000. Flagged on c and k x b (what the test reads), the two builds' starts
    are alike at the boundary: 4,000 runs a margin, 6 blocks, CV 10 %."""
    runs, passes, flagged, seen = 4000, 0, 0, []
    for margin in (0.9, 1.0):
        p, f = boundary_runs(margin, runs=runs, alpha=0.05, seed=52 + int(margin * 10))
        seen.append(f"{margin:.0%}: passed {p} ({_interval(p, runs)}), flagged {f} ({_interval(f, runs)})")
        assert p <= binomial_bound(runs, 0.05), seen
        passes, flagged = passes + p, flagged + f
    assert flagged <= binomial_bound(2 * runs, FALSE_FLAG_RATE), seen
    assert passes <= binomial_bound(2 * runs, 0.05), seen


def _interval(count: int, runs: int) -> str:
    low, high = clopper_pearson(count, runs)
    return f"{count / runs:.2%}, 95 % CI {low:.2%}-{high:.2%}"


def test_the_shipped_trace_check_holds_at_0_01() -> None:
    """trace-replay.yaml's TTFT check: margin 90 %, alpha 0.01."""
    passes = at_the_boundary(0.9, runs=300, alpha=0.01, seed=90)
    assert passes <= binomial_bound(300, 0.01), passes


@pytest.mark.parametrize("method", ["welch", "yuen", "permutation", "mannwhitney"])
@pytest.mark.parametrize("higher_is_better", [False, True])
def test_the_interval_agrees_with_the_decision(method: str, higher_is_better: bool) -> None:
    """Each method: the interval's end is past the boundary exactly when the verdict passes, in the
    metric's direction, on candidates near the margin."""
    rng = np.random.default_rng(7)
    a = Assertion("q", "r", "no_regression", higher_is_better, margin=0.3, unit="s")
    ids = tuple(range(8))
    seen = set()
    for shift in (0.55, 0.7, 0.85, 1.0, 1.15, 1.3, 1.45):
        b = 1 + 0.05 * rng.standard_normal(8)
        c = shift * (1 + 0.05 * rng.standard_normal(8))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", VerdictWarning)
            v, = evaluate([a], {a.id: (Trials(tuple(b), ids, ids), Trials(tuple(c), tuple(10 + i for i in ids), ids))},
                          alpha=0.05, method=method)
        past = v.ci.low > v.boundary if higher_is_better else v.ci.high < v.boundary
        assert (v.outcome == "pass") == past, (shift, v.reason)
        assert v.boundary == pytest.approx((-0.3 if higher_is_better else 0.3) * float(np.mean(b)))
        seen.add(v.outcome)
    assert "pass" in seen and seen != {"pass"}, seen
