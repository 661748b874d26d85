"""Seeded simulations of relative assertions (`cache_qualify.stats.relative`): a time whose starts vary by
factors, as the project's noise model draws them (`cache_qualify.sim.noise`: a log-normal start factor,
bad starts several times slower), on a loaded machine (a block's level shared by both builds, a larger
start-to-start spread than the calibrated 0.09). The power the design promises is for this noise without
bad starts (as the validation harness's power cells are for its normal noise); with them it is less.

``python -m tests.support.relative_sim`` prints the figures docs/statistics.md quotes ("Relative effects").
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cache_qualify.stats import relative
from cache_qualify.stats.power import power_of, trials_for_power
from cache_qualify.stats.starts import FALSE_FLAG_RATE, flag_starts
from cache_qualify.stats.verdict import Assertion, Trials, Verdict, VerdictWarning, carry, evaluate
from cache_qualify.validation.simulate import binomial_bound

MEDIAN_S = 2.0        # the baseline's median wait
BLOCK_SD = 0.5        # log-SD of a block's level (the machine's load), shared by both builds of the block
START_SD = 0.25       # log-SD of one start's factor
BAD_RATE, BAD_FACTOR = 0.03, 4.0   # the simulated lab's bad starts (`cache_qualify.validation.simulate`)
DIFF_SD = math.sqrt(2) * START_SD  # the SD of a block's log ratio: the block's level cancels in it

GAIN = Assertion("readiness_wait_s", "B-new-start", "gain", False, min_effect=0.10, unit="s", relative=True)
# a gain the design sizes for a few dozen blocks at this noise (10 % needs about 400)
SIZED = Assertion("readiness_wait_s", "B-new-start", "gain", False, min_effect=0.40, unit="s", relative=True)
NO_REGRESSION = Assertion("readiness_wait_s", "A", "no_regression", False, margin=0.05, unit="s", relative=True)


@dataclass(frozen=True)
class Cell:
    """The outcomes of `runs` seeded runs of one assertion at one true log ratio (oriented: > 0 better)."""

    runs: int
    passes: int
    fails: int
    passes_not_better: int      # passes whose estimate over every start is not past the null boundary
    rule_broken: int            # verdicts whose outcome disagrees with their interval and boundary
    flagged: int = 0            # runs with a start set aside as far out

    @property
    def pass_rate(self) -> float:
        return self.passes / self.runs


def draw(rng: np.random.Generator, blocks: int, improvement: float, *, cand_bad_rate: float = BAD_RATE,
         base_bad_rate: float = BAD_RATE) -> tuple[Trials, Trials]:
    """One run: `blocks` blocks of one start per build; the candidate's median is the baseline's times
    exp(-improvement) (lower is better), each build's starts bad at its rate."""
    level = MEDIAN_S * np.exp(rng.normal(0, BLOCK_SD, blocks))
    arms = []
    for shift, rate in ((0.0, base_bad_rate), (improvement, cand_bad_rate)):
        factor = np.exp(rng.normal(0, START_SD, blocks) - shift)
        factor = np.where(rng.random(blocks) < rate, factor * BAD_FACTOR, factor)
        arms.append(Trials(tuple(float(v) for v in level * factor), blocks=tuple(range(blocks))))
    return arms[0], arms[1]


def _rule_broken(v: Verdict) -> bool:
    """The reading rule on the ratio scale (lower is better): a pass is exactly an upper end below the
    boundary, a shown failure a lower end above it, and the interval holds the estimate."""
    low, high, bound = v.ci.low, v.ci.high, v.boundary
    shown_worse = low > bound
    return ((v.outcome == "pass") != (high < bound) or (shown_worse and v.outcome != "fail")
            or not low <= v.difference <= high)


def _not_better(v: Verdict) -> bool:
    return v.outcome == "pass" and not v.difference < v.boundary


def run(a: Assertion, blocks: int, improvement: float, runs: int, *, seed: int, alpha: float,
        method: str = "welch", cand_bad_rate: float = BAD_RATE, base_bad_rate: float = BAD_RATE,
        looks: Sequence[int] = ()) -> Cell:
    """`runs` seeded runs of assertion `a` on `blocks` blocks, the true log ratio `improvement` past 0
    (oriented); `looks`: a sequential design (blocks at each look), else the fixed one."""
    rng = np.random.default_rng(seed)
    verdicts = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VerdictWarning)
        for i in range(runs):
            base, cand = draw(rng, max(looks or (blocks,)), improvement, cand_bad_rate=cand_bad_rate,
                              base_bad_rate=base_bad_rate)
            verdicts.append(_sequential(a, base, cand, tuple(looks) or (blocks,), alpha, method, i))
    return Cell(runs, sum(v.outcome == "pass" for v in verdicts), sum(v.outcome == "fail" for v in verdicts),
                sum(map(_not_better, verdicts)), sum(map(_rule_broken, verdicts)),
                sum(any(f.excluded for f in v.flagged) for v in verdicts))


def _sequential(a: Assertion, base: Trials, cand: Trials, looks: tuple[int, ...], alpha: float, method: str,
                seed: int) -> Verdict:
    decided: list[Verdict] | None = None
    for look, n in enumerate(looks, 1):
        first = {a.id: (base.in_blocks(set(range(n))), cand.in_blocks(set(range(n))))}
        decided = carry(decided, evaluate([a], first, alpha=alpha, method=method, look=look, looks=looks,
                                          seed=seed))
        if decided[0].outcome != "inconclusive":
            break
    assert decided is not None
    return decided[0]


def boundary_shift(a: Assertion) -> float:
    """The true log ratio (oriented) on the null boundary: where a pass has probability alpha at most."""
    return relative.log_null(a)


def sized_blocks(a: Assertion, alpha: float) -> int:
    """The blocks the design sizes a gain for (power 0.9 at 1.5 x the boundary's log ratio, the SD known)."""
    distance = relative.planned_distance(a)
    assert distance is not None
    blocks = trials_for_power(distance, DIFF_SD, alpha=alpha, paired=True)
    assert blocks is not None
    return blocks


def normal_flag_runs(blocks: int, runs: int, *, seed: int, metrics: int = 2) -> int:
    """Of `runs` seeded runs of normal noise (`metrics` metrics, the candidate 2 SD better), how many set a
    start aside: the false flags an absolute design (the validation harness's noise) pays a block for."""
    rng = np.random.default_rng(seed)
    order = tuple(range(blocks))
    hit = 0
    for _ in range(runs):
        hit += any(f.excluded for m in range(metrics) for f in flag_starts(
            f"m{m}", [("r", Trials(tuple(rng.normal(0, 1, blocks)), blocks=order),
                       Trials(tuple(rng.normal(2, 1, blocks)), blocks=order))], rate=FALSE_FLAG_RATE))
    return hit


def main() -> None:
    """The figures of docs/statistics.md's "Relative effects", measured."""
    for alpha, runs in ((0.05, 4000), (0.01, 8000)):
        aa = run(GAIN, 6, boundary_shift(GAIN), runs, seed=41, alpha=alpha)
        print(f"A/A on the boundary, gain 10 % faster, 6 blocks, alpha {alpha}: {aa.passes} of {runs} pass "
              f"({aa.pass_rate:.2%}; 99 % bound {binomial_bound(runs, alpha)}); rule broken {aa.rule_broken}")
        nr = run(NO_REGRESSION, 6, boundary_shift(NO_REGRESSION), runs, seed=42, alpha=alpha)
        print(f"A/A on the margin, no_regression 5 %, 6 blocks, alpha {alpha}: {nr.passes} of {runs} pass "
              f"({nr.pass_rate:.2%}); rule broken {nr.rule_broken}")
        n = sized_blocks(SIZED, alpha)
        pw = run(SIZED, n, 1.5 * boundary_shift(SIZED), 2000, seed=43, alpha=alpha, cand_bad_rate=0, base_bad_rate=0)
        exact = power_of(relative.planned_distance(SIZED) or math.nan, DIFF_SD, n, alpha=alpha, paired=True)
        print(f"power at the sized effect (1.5 x log(1/0.6)), {n} blocks (the t test's {exact:.4f}), "
              f"alpha {alpha}: {pw.passes} of 2000 "
              f"({pw.pass_rate:.2%}); rule broken {pw.rule_broken}; runs with a start set aside {pw.flagged}")
        pb = run(SIZED, n, 1.5 * boundary_shift(SIZED), 2000, seed=46, alpha=alpha)
        print(f"  the same with the lab's bad starts ({BAD_RATE:.0%} of either build's, x{BAD_FACTOR:g}): "
              f"{pb.passes} of 2000 ({pb.pass_rate:.1%})")
        seq = run(GAIN, 8, boundary_shift(GAIN), 2000, seed=44, alpha=alpha, looks=(4, 6, 8))
        print(f"A/A on the boundary, looks after 4, 6, 8 blocks, alpha {alpha}: {seq.passes} of 2000 "
              f"({seq.pass_rate:.2%})")
    bad = run(SIZED, 8, 1.2 * boundary_shift(SIZED), 4000, seed=45, alpha=0.05, cand_bad_rate=0.3)
    print(f"candidate with 30 % bad starts, 8 blocks, alpha 0.05: {bad.passes} passes, "
          f"{bad.passes_not_better} of them with the estimate over every start not past the boundary")
    for blocks in (7, 11):
        print(f"normal noise, two metrics, {blocks} blocks: {normal_flag_runs(blocks, 4000, seed=5)} of 4000 runs "
              "set a start aside")


if __name__ == "__main__":
    main()
