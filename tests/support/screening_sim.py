"""Screening's family-wise false pass on a grid, vectorized: many more runs a cell than the gate's own loop.

Each run draws a baseline and K null candidates (normal noise, the candidates' variance `variance`
times the baseline's) over n blocks; a candidate passes when its paired t test of its block
differences with the shared baseline reaches the one-look level, and the run counts when any does.
With ``--level screening`` the level is the gate's (`cache_qualify.stats.manytoone.screening_level`);
with ``--level equal-variances`` it is the many-to-one level sized for equal variances (Dunnett's on
the t scale, the order statistic of the largest of K shared-baseline t statistics over 400,000 seeded
runs), the gate's level before it held for every variance ratio. The gate's own loop on the same rule
is `cache-qualify validate --check screening`; on identical draws the two count the same runs.

``python -m tests.support.screening_sim --runs 1000000 --seed 12345`` prints the figures quoted in
docs/statistics.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np
from scipy import special

from cache_qualify.stats.manytoone import screening_level

CANDIDATES = (2, 3, 4)
BLOCKS = tuple(range(3, 11))
_CHUNK = 4_000_000     # normal draws at once


def _max_t(rng: np.random.Generator, runs: int, candidates: int, blocks: int, variance: float) -> np.ndarray:
    """The largest of the candidates' paired t statistics in each of `runs` null runs."""
    out = np.empty(runs)
    chunk = max(1, _CHUNK // (blocks * (candidates + 1)))
    for lo in range(0, runs, chunk):
        m = min(chunk, runs - lo)
        d = np.sqrt(variance) * rng.standard_normal((m, candidates, blocks)) - rng.standard_normal((m, 1, blocks))
        out[lo:lo + m] = (d.mean(axis=2) / (d.std(axis=2, ddof=1) / np.sqrt(blocks))).max(axis=1)
    return out


def critical_t(alpha: float, candidates: int, blocks: int, level: str) -> float:
    """The critical t each candidate's statistic must reach: the gate's level, or the equal-variance one."""
    if level == "screening":
        return float(-special.stdtrit(blocks - 1, screening_level(alpha, candidates, units=blocks)))
    null = _max_t(np.random.default_rng(20_261_130), 400_000, candidates, blocks, 1.0)
    return float(np.quantile(null, 1 - alpha))


def family_rate(alpha: float, candidates: int, blocks: int, *, variance: float, runs: int, seed: int,
                level: str = "screening") -> float:
    """The share of `runs` null runs in which any candidate passes."""
    critical = critical_t(alpha, candidates, blocks, level)
    return float(np.mean(_max_t(np.random.default_rng(seed), runs, candidates, blocks, variance) >= critical))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.screening_sim", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--alpha", type=float, nargs="+", default=[0.05, 0.01])
    parser.add_argument("--variance", type=float, nargs="+", default=[1.0, 3.0, 100.0])
    parser.add_argument("--level", choices=("screening", "equal-variances"), default="screening")
    args = parser.parse_args(argv)
    print(f"{args.runs} null runs a cell (seed {args.seed} onwards), level {args.level}: the share in which any "
          "candidate passes\n")
    print("| alpha | candidates | variance ratio | " + " | ".join(f"{n} blocks" for n in BLOCKS) + " | range |")
    print("|---|---|---|" + "---|" * (len(BLOCKS) + 1))
    cell = 0
    for alpha in args.alpha:
        for k in CANDIDATES:
            for variance in args.variance:
                rates = []
                for n in BLOCKS:
                    rates.append(family_rate(alpha, k, n, variance=variance, runs=args.runs, seed=args.seed + cell,
                                             level=args.level))
                    cell += 1
                print(f"| {alpha:g} | {k} | {variance:g} | " + " | ".join(f"{r:.2%}" for r in rates)
                      + f" | {min(rates):.2%}-{max(rates):.2%} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
