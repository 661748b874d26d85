"""`cache-qualify decide` on sequential runs: pairs named before the run, decided after it.

Each simulated run is a gate-mode tournament of three candidates identical to the baseline
(`tests.support.tournament_sim`, the gate's own `Tournament` look by look), one gain with
`min_effect` 0, so every pair of its builds is at its null boundary. After the run every ordered
pair of builds (an A/A of a build and its copy, in either order) is decided as `decide` decides it
(`cache_qualify.stats.pairwise.decide_trials`): on the blocks of the run's first look, and, for
comparison, on every block both builds ran (the rule `decide` had before, which passed pairs in
5.69 % of runs at 0.05). A pass of any pair is a false pass.

``python -m tests.support.pair_sim --runs 2000`` prints the figures quoted in docs/statistics.md.
"""

from __future__ import annotations

import argparse
import itertools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from cache_qualify.stats.pairwise import decide_trials
from cache_qualify.stats.verdict import VerdictWarning
from cache_qualify.methods import method
from tests.support.tournament_sim import hit_rate_gain, null_effects, tournament

WELCH = method("welch")

LOOKS = tuple(range(4, 13))     # the default scenario's 4..12


@dataclass(frozen=True)
class PairRates:
    runs: int
    pairs: int                           # ordered pairs per run
    first_look: dict[tuple[str, str], int]   # per ordered pair (baseline, candidate): passes, decided as decide does
    all_shared: dict[tuple[str, str], int]   # the same, on every block both ran


def simulate(*, runs: int, alpha: float, seed: int, looks: Sequence[int] = LOOKS, candidates: int = 3) -> PairRates:
    sh = hit_rate_gain()
    rng = np.random.default_rng(seed)
    builds = ("baseline", *(f"c{j + 1}" for j in range(candidates)))
    pairs = list(itertools.permutations(builds, 2))
    first = dict.fromkeys(pairs, 0)
    shared = dict.fromkeys(pairs, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VerdictWarning)
        for _ in range(runs):
            run = tournament(sh, null_effects(sh, candidates), looks, alpha=alpha, mode="gate", noise="normal", rng=rng)
            for b, c in pairs:
                samples = {i: (run.ran[b][i], run.ran[c][i]) for i in run.ran[b]}
                for tally, at in ((first, looks[0] if len(looks) > 1 else None), (shared, None)):
                    verdicts, _ = decide_trials(sh.assertions, samples, alpha=alpha, method=WELCH, seed=0,
                                                first_look=at)
                    tally[(b, c)] += all(v.outcome == "pass" for v in verdicts)
    return PairRates(runs, len(pairs), first, shared)


def clopper_pearson(passes: int, runs: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact two-sided interval of a binomial rate."""
    tail = (1 - confidence) / 2
    low = float(stats.beta.ppf(tail, passes, runs - passes + 1)) if passes else 0.0
    high = float(stats.beta.ppf(1 - tail, passes + 1, runs - passes)) if passes < runs else 1.0
    return low, high


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.pair_sim", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    for alpha in (0.05, 0.01):
        r = simulate(runs=args.runs, alpha=alpha, seed=args.seed)
        for name, tally in (("first look (decide)", r.first_look), ("every shared block (before)", r.all_shared)):
            total = sum(tally.values())
            low, high = clopper_pearson(total, r.runs * r.pairs)
            worst = max(tally, key=lambda k: tally[k])
            wl, wh = clopper_pearson(tally[worst], r.runs)
            print(f"alpha {alpha}, {name}: pooled {total} of {r.runs * r.pairs} = {total / (r.runs * r.pairs):.2%} "
                  f"(95 % CI {low:.2%}-{high:.2%}); worst pair {worst[1]} against {worst[0]}: {tally[worst]} of "
                  f"{r.runs} = {tally[worst] / r.runs:.2%} ({wl:.2%}-{wh:.2%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
