"""Every method `plan` offers reaches the power its sizes print, for every effect, and `plan` recommends
no design that `check_plan` refuses before any lab time.

Yuen's sign-flip p on the block differences lies on a coarse lattice: at 8 blocks it is 1/64 in 17-27 %
of data sets however large the effect, so the t test's count times 1.3 reached 72-83 % where 90 % was
printed (`cache_qualify.stats.power` now sizes it on its own p's distribution)."""

from __future__ import annotations

import numpy as np
import pytest

from cache_qualify.methods import METHODS, NAMES
from cache_qualify.sizing.design import Design
from cache_qualify.sizing.planning import size
from cache_qualify.stats.compare import Sample, compare
from cache_qualify.stats.power import trials_for_power
from cache_qualify.stats.levels import check_plan, nominal_levels
from cache_qualify.validation.promises import power_tolerance

# true distance from the boundary, in SDs of a block difference: the few blocks where a p's lattice is coarse
DISTANCES = (1.5, 2.5, 6.0)


def gate_power(method: str, blocks: int, distance_sd: float, alpha: float, *, runs: int, seed: int) -> float:
    """Share of seeded normal data sets of `blocks` blocks that the gate's comparison passes at `alpha`."""
    rng = np.random.default_rng(seed)
    ids = tuple(range(blocks))
    passes = 0
    for _ in range(runs):
        d = distance_sd + rng.standard_normal(blocks)
        sample = Sample(np.zeros(blocks), d, ids, ids)
        passes += compare("gain", 0.0, 0.0, sample, sample, METHODS[method], seed=0).p < alpha
    return passes / runs


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0.01, 0.05])
@pytest.mark.parametrize("method", NAMES)
def test_each_method_reaches_the_power_of_its_sizes(method: str, alpha: float) -> None:
    runs = 400
    for k, distance in enumerate(DISTANCES):
        blocks = trials_for_power(distance, 1.0, alpha=alpha, method=METHODS[method], paired=True)
        assert blocks is not None
        got = gate_power(method, blocks, distance, alpha, runs=runs, seed=k + int(alpha * 1000))
        assert got >= 0.9 - power_tolerance(runs), (method, alpha, distance, blocks, got)


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0.01, 0.05])
@pytest.mark.parametrize("method", NAMES)
def test_plan_recommends_only_designs_the_gate_runs(method: str, alpha: float) -> None:
    """The fixed count and the sequential design `plan` prints for each effect pass `check_plan`."""
    chosen = METHODS[method]
    for distance in (*DISTANCES, 20.0):
        s = size("q", "r", sd=1.0, alpha=alpha, power=0.9, method=chosen, family_size=1, min_effect=1.0,
                 effect=1.0 + distance * np.sqrt(2))
        assert s.trials_per_build is not None and s.first_look_sequential is not None
        check_plan(method=chosen, alpha=alpha, trials_per_build=s.trials_per_build, paired=True)
        if s.max_trials_sequential is not None and s.max_trials_sequential > s.first_look_sequential:
            d = Design(s.first_look_sequential, s.max_trials_sequential, s.spending_rho_sequential or 2.0)
            check_plan(method=chosen, alpha=alpha, trials_per_build=d.maximum, looks=d.looks, boundary=d.boundary,
                       paired=True)


def sequential_power(method: str, design: Design, distance_sd: float, alpha: float, *, runs: int,
                     seed: int) -> float:
    """Share of seeded runs of `design` that pass a gain whose block differences are `distance_sd` SDs past
    its boundary: a look after every block, each look's p (the gate's comparison) against the level the gate
    gives that look (the design's boundary has no futility rule, and a pass is carried)."""
    assert not design.boundary.has_futility
    levels = nominal_levels(design.looks, {}, paired=True, block_size=1)(design.boundary, alpha)
    rng = np.random.default_rng(seed)
    passes = 0
    for _ in range(runs):
        d = distance_sd + rng.standard_normal(design.maximum)
        for n, level in zip(design.looks, levels):
            ids = tuple(range(n))
            sample = Sample(np.zeros(n), d[:n], ids, ids)
            if compare("gain", 0.0, 0.0, sample, sample, METHODS[method], seed=0).p < level:
                passes += 1
                break
    return passes / runs


@pytest.mark.slow
@pytest.mark.parametrize("method", ["welch", "yuen", "permutation", "mannwhitney"])
@pytest.mark.parametrize("alpha", [0.01, 0.05])
def test_the_design_plan_prints_reaches_its_power_through_the_gate(method: str, alpha: float) -> None:
    """The design `plan --method M` prints (fixed or sequential), run look by look through the gate,
    reaches 0.9 at its effect, for every method plan offers. The sequential designs the t test's search chose
    at 1.5 SDs passed, through `evaluate` look by look: Yuen 70.8 % and 74.8 % of 400 runs (6..11 at 0.01,
    4..7 at 0.05); the permutation and Mann-Whitney tests 88.9 % and 88.2 % (6..11 at 0.01) and 83.7 % (4..7
    at 0.05) of 2,000."""
    runs = 300
    for k, distance in enumerate(DISTANCES):
        s = size("q", "r", sd=1.0, alpha=alpha, power=0.9, method=METHODS[method], family_size=1, min_effect=1.0,
                 effect=1.0 + distance * np.sqrt(2))
        assert s.first_look_sequential is not None and s.max_trials_sequential is not None
        design = Design(s.first_look_sequential, s.max_trials_sequential, s.spending_rho_sequential or 2.0)
        got = sequential_power(method, design, distance, alpha, runs=runs, seed=52 + k)
        assert got >= 0.9 - power_tolerance(runs), (alpha, distance, design.looks, got)
