"""A deterministic metric (one value every start of each build) shows a gain only from 3 blocks, or from 2 with
the noise known from the history (the design sized for a first look there): two equal block differences
cannot tell a difference that never varies from one that varied little by chance. docs/statistics.md
states what such a metric needs to pass; these are its figures."""

from __future__ import annotations

import warnings

import pytest

from cache_qualify.stats.known_noise import Prior
from cache_qualify.stats.verdict import Assertion, Trials, Verdict, VerdictWarning, evaluate

GAIN = Assertion("kv_pages", "startup", "gain", True)
KEEP = Assertion("kv_pages", "startup", "no_regression", True, margin=0.02)


def _constant(step: int, blocks: int, assertion: Assertion = GAIN, *, alpha: float = 0.05,
              prior: Prior | None = None, looks: tuple[int, ...] | None = None) -> Verdict:
    """Every start of the baseline gives 1000 pages, every start of the candidate 1000 + `step`."""
    ids = tuple(range(blocks))
    pair = (Trials((1000.0,) * blocks, blocks=ids), Trials((1000.0 + step,) * blocks, blocks=ids))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VerdictWarning)
        [v] = evaluate([assertion], {assertion.id: pair}, alpha=alpha, looks=looks or (blocks,),
                       look=1, priors={assertion.id: prior} if prior else None)
    return v


@pytest.mark.parametrize("step", [5, 41, 1000])
def test_two_blocks_of_a_constant_difference_decide_nothing(step: int) -> None:
    """On today's rule before this one, 5 resolution steps passed from 2 blocks at alpha 0.05."""
    v = _constant(step, 2)
    assert v.outcome == "inconclusive" and v.trials_needed == 3, v.reason
    assert "at least 3 blocks are needed (or the noise known from the history)" in v.reason


def test_a_first_look_at_two_blocks_of_a_sequential_design_decides_nothing_either() -> None:
    v = _constant(41, 2, looks=(2, 3, 4, 5, 6))
    assert v.outcome == "inconclusive", v.reason
    assert _constant(41, 3, looks=(3, 4, 5, 6)).outcome == "pass"


def test_identical_values_still_need_three_blocks() -> None:
    assert _constant(0, 2, KEEP).outcome == "inconclusive"
    assert _constant(0, 3, KEEP).outcome == "pass"
    assert _constant(0, 3, GAIN).outcome == "fail"


# the fewest resolution steps a constant gain needs to pass (fixed design), by blocks 2-8 (None: never)
STEPS = {0.05: (None, 2, 2, 1, 1, 1, 1), 0.01: (None, 5, 3, 2, 2, 2, 2)}


@pytest.mark.parametrize("alpha", sorted(STEPS))
def test_what_a_constant_gain_needs_to_pass(alpha: float) -> None:
    """The table in docs/statistics.md: the spread is taken as the resolution, so a pass needs the difference
    in steps past t(1 - level, n - 1) / sqrt(n)."""
    found = []
    for blocks in range(2, 9):
        found.append(next((k for k in range(1, 60) if _constant(k, blocks, alpha=alpha).outcome == "pass"), None))
    assert tuple(found) == STEPS[alpha]


def test_with_the_history_s_noise_two_blocks_decide() -> None:
    """The history design (every assertion's noise known: a first look after 2 blocks, sized by plan
    --history) decides there: the variance is pooled with the history's."""
    prior = Prior(variance=4.0, df=10, runs=("r1", "r2"), starts=24)
    assert _constant(41, 2, prior=prior).outcome == "pass"
    assert _constant(41, 2).outcome == "inconclusive"


def test_values_equal_as_typed_are_one_value() -> None:
    """0.1 + 0.2 and 0.3 differ by one ulp in floating point: a build giving one and a build giving the
    other gave the same value every start, decided as identical values (a gain fails, a no_regression
    passes, each from 3 blocks), not read as a difference of 5.6e-17 without noise."""
    ids = tuple(range(3))
    pair = (Trials((0.3,) * 3, blocks=ids), Trials((0.1 + 0.2,) * 3, blocks=ids))
    gain, keep = (Assertion("hit_rate", "startup", kind, True, margin=0.02 if kind == "no_regression" else 0.0)
                  for kind in ("gain", "no_regression"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VerdictWarning)
        verdicts = evaluate([gain, keep], {gain.id: pair, keep.id: pair}, alpha=0.05, looks=(3,), look=1)
    assert [v.outcome for v in verdicts] == ["fail", "pass"], [v.reason for v in verdicts]
    for v in verdicts:
        assert v.difference == 0.0 and "exactly 0, without noise, over 3 blocks" in v.reason, v.reason
