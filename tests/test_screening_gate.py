"""Screening (`--tournament`) at its level, measured through the gate's own `Tournament.look`: the
bad-start flag rule applied once per look for the family (the candidates share its rate), and the
family-wise false pass within the binomial bound of alpha for equal and unequal variances. The full
grid (K = 2-4, 3-10 trials, both alphas, 2,000 runs a cell) is `cache-qualify validate --check screening`."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from cache_qualify.stats.manytoone import Tournament
from cache_qualify.validation.robustness import screening_rates
from cache_qualify.validation.simulate import SHAPES, binomial_bound
from cache_qualify.stats.starts import FALSE_FLAG_RATE
from cache_qualify.stats.verdict import Assertion, Trials, VerdictWarning


def _one_look(gain: Assertion, names: list[str], values: np.ndarray) -> Tournament:
    """A screening tournament of `names` after its one look: row 0 of `values` the baseline's blocks,
    row j + 1 candidate j's."""
    blocks = tuple(range(values.shape[1]))
    base = Trials(tuple(values[0]), blocks, blocks)
    arms = Tournament(names, [gain], alpha=0.05, mode="screening", looks=(len(blocks),))
    arms.look(1, {c: {gain.id: (base, Trials(tuple(values[j + 1]), blocks, blocks))} for j, c in enumerate(names)})
    return arms


@pytest.mark.slow
def test_screening_flags_normal_noise_no_more_often_than_one_gate() -> None:
    """Four null candidates, 10 blocks: runs in which normal noise flags a start in any comparison. Each
    comparison flagging at the run's full rate flagged K times as many (10 of 1,200 runs where one
    comparison flags 2-3; screening's excess false passes came from there); sharing the rate keeps the
    family at one comparison's."""
    item = SHAPES["reread-1g"][0]
    gain = item.assertion(0.0)
    rng = np.random.default_rng(33)
    runs, k, n = 1200, 4, 10
    names = [f"c{j}" for j in range(k)]
    flagged = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VerdictWarning)
        for _ in range(runs):
            arms = _one_look(gain, names, item.mean + item.sd * rng.standard_normal((k + 1, n)))
            flagged += any(arms.verdicts(c)[0].flagged for c in names)
    # Bonferroni's 1 % is a bound: one comparison flags about 0.25 % of runs, and so must the family
    assert flagged <= binomial_bound(runs, FALSE_FLAG_RATE / k), flagged


def test_screening_flags_the_shared_baseline_alike_in_every_comparison() -> None:
    """A baseline start 5 SD out, candidates 3x as noisy: flagged per comparison, the baseline's starts were
    set aside in some candidates' comparisons and not in others of the same look; flagged once per look, every
    comparison sets aside the same ones, and a candidate's own flags stay its own."""
    item = SHAPES["reread-1g"][0]
    gain = item.assertion(0.0)
    rng = np.random.default_rng(32)
    runs, k, n = 200, 3, 8
    names = [f"c{j}" for j in range(k)]
    scale = np.sqrt(np.r_[1.0, np.full(k, 3.0)])[:, None]
    baseline_flagged = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VerdictWarning)
        for _ in range(runs):
            values = item.mean + item.sd * scale * rng.standard_normal((k + 1, n))
            values[0, 2] -= 5 * item.sd
            arms = _one_look(gain, names, values)
            seen = {tuple((f.start, f.excluded) for f in arms.verdicts(c)[0].flagged if f.arm == "baseline")
                    for c in names}
            assert len(seen) == 1, seen
            baseline_flagged += bool(next(iter(seen)))
    assert baseline_flagged > 0, "no baseline start was flagged: the check saw nothing to compare"


@pytest.mark.slow
@pytest.mark.parametrize("variance", [1.0, 3.0])
def test_screening_family_wise_false_pass_within_the_bound(variance: float) -> None:
    runs = 500
    passes = screening_rates(5, runs=runs, seed=int(variance), alpha=0.05, candidates=3, variance=variance)
    assert passes <= binomial_bound(runs, 0.05), passes
