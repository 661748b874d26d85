"""cache_qualify.methods.permutation: the permutation and sign-flip tests are exact with ties, on the data's own
lattice (cache_qualify.stats.exact), checked against full enumeration in exact rational arithmetic; the lattice
and the resolution."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from cache_qualify.methods.permutation import permutation_p, sign_flip_p
from cache_qualify.stats import exact
from cache_qualify.stats.compare import Sample
from cache_qualify.stats.exact import rational
from cache_qualify.stats.verdict import Assertion, Trials, evaluate

SAMPLES = 1000


def _enumerated_sign_flip(d: list[Fraction]) -> Fraction:
    observed = sum(d, Fraction(0))
    count = sum(sum((s * v for s, v in zip(signs, d)), Fraction(0)) >= observed
                for signs in itertools.product((1, -1), repeat=len(d)))
    return Fraction(count, 2 ** len(d))


def _enumerated_permutation(x: list[Fraction], y: list[Fraction]) -> Fraction:
    pooled = x + y
    observed = sum(x, Fraction(0))
    splits = list(itertools.combinations(range(len(pooled)), len(x)))
    count = sum(sum((pooled[i] for i in pick), Fraction(0)) >= observed for pick in splits)
    return Fraction(count, len(splits))


def _tied(rng: np.random.Generator, n: int) -> np.ndarray:
    """Values with ties of the kinds a lab records: counts (KV pages), figures rounded to three decimals
    (hit rates), ratios of small counts, waits in whole nanoseconds."""
    kind = rng.integers(4)
    if kind == 0:
        return 41_300.0 + rng.integers(0, 4, n)
    if kind == 1:
        return np.round(0.861 + 0.001 * rng.integers(0, 4, n), 3)
    if kind == 2:
        return rng.integers(0, 7, n) / 7
    return 2.0e9 + 1.0e8 * rng.integers(-2, 3, n) + rng.integers(0, 2, n)


def test_sign_flip_and_permutation_p_equal_full_enumeration_on_tied_samples() -> None:
    """1,000 tied samples, paired and unpaired: 0 mismatches with exact rational enumeration (a grid of
    1e-9 x the spread missed tied arrangements in 47 and 64 of 1,500, always too small, by up to 0.17)."""
    rng = np.random.default_rng(23)
    mismatches = []
    for k in range(SAMPLES):
        n = int(rng.integers(2, 6))
        base, cand = _tied(rng, n), _tied(rng, n)
        cand = base[:1].repeat(n) + (cand - cand[:1]) if rng.random() < 0.5 else cand   # same kind, offset
        blocks = tuple(range(n))
        sample = Sample(base, cand, blocks, blocks)
        d = sample.exact_diffs()
        paired = sign_flip_p(exact.on_lattice(d), seed=0)
        x, y = [rational(float(v)) for v in cand], [rational(float(v)) for v in base]
        both = exact.on_lattice(x + y)
        unpaired = permutation_p(both[:n], both[n:], seed=0)
        if paired != float(_enumerated_sign_flip(d)) or unpaired != float(_enumerated_permutation(x, y)):
            mismatches.append((k, base.tolist(), cand.tolist()))
    assert mismatches == []


def test_the_verdicts_exact_tests_are_the_enumeration() -> None:
    """Through `evaluate` (three trials per build: no start can be flagged): the p-value is the
    enumerated one at the null boundary, for the sign-flip and the permutation test."""
    rng = np.random.default_rng(29)
    gain = Assertion("hit_rate", "B-new-start", "gain", True)
    for _ in range(60):
        base, cand = _tied(rng, 3), _tied(rng, 3)
        ids = (0, 1, 2)
        [flip] = evaluate([gain], {gain.id: (Trials(tuple(base), ids, ids), Trials(tuple(cand), ids, ids))},
                          alpha=0.05, method="permutation")
        d = Sample(base, cand, ids, ids).exact_diffs()
        assert flip.p_value == float(_enumerated_sign_flip(d))
        [perm] = evaluate([gain], {gain.id: (base, cand)}, alpha=0.05, method="permutation")
        x, y = [rational(float(v)) for v in cand], [rational(float(v)) for v in base]
        assert perm.p_value == float(_enumerated_permutation(x, y))


def test_the_audits_tied_examples() -> None:
    assert sign_flip_p(np.array([-1, -1, 2, 3]), seed=0) == 5 / 16
    x, y = [41301.0, 41303.0, 41301.0], [41301.0, 41302.0, 41302.0]
    both = exact.on_lattice([rational(v) for v in x + y])
    assert permutation_p(both[:3], both[3:], seed=0) == pytest.approx(0.65, abs=0) == 13 / 20
    decimals = exact.on_lattice([rational(v) for v in (0.861, 0.863, 0.862, 0.862)])
    assert decimals[0] + decimals[1] == decimals[2] + decimals[3]


@pytest.mark.parametrize(("value", "expected"), [
    (41301.0, Fraction(41301)), (0.861, Fraction(861, 1000)), (2 / 3, Fraction(2, 3)), (-0.1, Fraction(-1, 10)),
    (2.0e9, Fraction(2 * 10 ** 9)), (0.8612345678901234, None)])
def test_a_recorded_float_stands_for_the_simplest_fraction_that_reads_back_as_it(value: float,
                                                                                   expected: Fraction | None) -> None:
    found = rational(value)
    assert float(found) == value
    if expected is not None:
        assert found == expected
    else:   # a float with all its digits stands for a fraction as fine as its last place allows
        assert found.denominator > 10 ** 6


def test_the_lattice_is_exact_and_names_its_resolution() -> None:
    values = [rational(v) for v in (0.86, 0.87, 0.865)]
    assert exact.lattice_step(values) == Fraction(1, 200)
    assert list(exact.on_lattice(values)) == [172, 174, 173]
    assert exact.resolution(np.array([41300.0, 41302.0])) == 1
    assert exact.resolution(np.array([0.86, 0.87])) == Fraction(1, 100)
    assert exact.smallest_gap(np.array([3.0, 3.0, 5.0, 4.0])) == 1.0
    assert math.isinf(exact.smallest_gap(np.array([2.0, 2.0])))
    big = exact.on_lattice([Fraction(10 ** 19), Fraction(1)])
    assert big.dtype == object and sign_flip_p(big, seed=0) == 0.25
    with pytest.raises(ValueError, match=r"a lattice needs finite values, got nan"):
        rational(math.nan)


def test_differences_are_one_value_when_their_range_is_within_half_the_resolution() -> None:
    """0.85 - 0.80 and 0.87 - 0.82 are both 5 points, but 1.1e-16 apart as floats; a step apart is a spread;
    continuous figures (no step coarser than their ulps) are one value within a few ulps of their scale."""
    rounded = np.array([0.85 - 0.80, 0.87 - 0.82])
    assert rounded[0] != rounded[1] and exact.spread_free(rounded, 0.01, 0.87)
    assert not exact.spread_free(np.array([0.05, 0.06]), 0.01, 0.87)
    scale = 1.234567891
    assert exact.spread_free(np.array([scale, scale + 4 * math.ulp(scale)]), math.ulp(scale), scale)
    assert not exact.spread_free(np.array([scale, scale + 1e-12]), math.ulp(scale), scale)
