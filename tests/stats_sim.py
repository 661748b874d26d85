"""The gate's false-positive rate and power, measured by simulation on the verdict code alone.

Each simulated qualification draws per-trial values with noise shaped like the
simulated lab's (hit rates with sd 0.1 pp between starts, readiness wait with
3 % noise, about 41,300 KV pages with sd 30) and calls the real
`cache_qualify.stats.verdict.evaluate`, look by look in sequential mode, exactly as the
gate does. Run ``python -m tests.stats_sim`` to print the figures quoted in
docs/statistics.md; the tests in tests/test_verdict.py and
tests/test_sequential.py check them.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from cache_qualify.stats.sequential import plan_looks
from cache_qualify.stats.verdict import Assertion, Verdict, VerdictWarning, carry, decided, evaluate, power_of


@dataclass(frozen=True)
class Noise:
    """One assertion and the baseline's per-trial distribution (normal)."""

    assertion: Assertion
    mean: float
    sd: float


def _gain(metric: str, request: str, higher: bool, min_effect: float = 0.0) -> Assertion:
    return Assertion(metric, request, "gain", higher, min_effect=min_effect)


# The default scenario's shape: four gains, two non-inferiority checks. Gains carry no minimum
# effect, the hardest case for the false-positive rate (any significant gain passes).
LAB: tuple[Noise, ...] = (
    Noise(_gain("hit_rate", "B-new-start", True), 0.860, 0.001),
    Noise(_gain("hit_rate", "A-third-read", True), 0.864, 0.001),
    Noise(_gain("readiness_wait_ns", "B-new-start", False), 2.1e9, 0.03 * 2.1e9),
    Noise(_gain("readiness_wait_ns", "A-third-read", False), 6.5e8, 0.03 * 6.5e8),
    Noise(Assertion("kv_pages", "startup", "no_regression", True, margin=0.01), 41_300.0, 30.0),
    Noise(Assertion("hit_rate", "A-new-start", "no_regression", True, margin=0.01), 0.200, 0.001),
)
HIT_RATE = LAB[0]


@dataclass(frozen=True)
class Design:
    """Trials per build: fixed (`max_trials` None) or sequential from `trials` up to `max_trials`."""

    trials: int
    max_trials: int | None = None
    block: int = 1

    @property
    def looks(self) -> tuple[int, ...]:
        if self.max_trials is None:
            return (self.trials,)
        return plan_looks(initial=self.trials, block=self.block, max_trials=self.max_trials)

    def __str__(self) -> str:
        if self.max_trials is None:
            return f"fixed {self.trials}"
        return f"sequential {self.trials}..{self.max_trials} (block {self.block})"


@dataclass(frozen=True)
class Result:
    runs: int
    gains_declared: int         # runs where at least one gain assertion passed
    all_gains_passed: int       # runs where every gain assertion passed
    mean_trials: float          # per build, at the stop
    max_trials_used: int
    min_trials_used: int
    outcomes: dict[str, int]    # over every gain verdict

    @property
    def rate(self) -> float:
        return self.gains_declared / self.runs

    @property
    def power(self) -> float:
        return self.all_gains_passed / self.runs


def qualify(noise: Sequence[Noise], effects: Sequence[float], design: Design, *, alpha: float,
            rng: np.random.Generator) -> tuple[list[Verdict], int]:
    """One simulated qualification: the verdicts at the stop and the trials per build used."""
    looks = design.looks
    draws = {}
    for item, effect in zip(noise, effects):
        better = effect if item.assertion.higher_is_better else -effect
        base = rng.normal(item.mean, item.sd, looks[-1])
        cand = rng.normal(item.mean + better, item.sd, looks[-1])
        draws[item.assertion.id] = (base, cand)
    assertions = [item.assertion for item in noise]
    verdicts: list[Verdict] | None = None
    for k, n in enumerate(looks, start=1):
        prefix = {key: (b[:n], c[:n]) for key, (b, c) in draws.items()}
        verdicts = carry(verdicts, evaluate(assertions, prefix, alpha=alpha, look=k, looks=looks))
        if decided(verdicts):
            return verdicts, n
    assert verdicts is not None
    return verdicts, looks[-1]


def simulate(noise: Sequence[Noise], effects: Sequence[float], design: Design, *, runs: int,
             alpha: float, seed: int) -> Result:
    """Repeat `qualify` `runs` times from one seed."""
    rng = np.random.default_rng(seed)
    declared = every = 0
    used: list[int] = []
    outcomes = {"pass": 0, "fail": 0, "inconclusive": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("error", VerdictWarning)  # continuous noise must never be degenerate
        for _ in range(runs):
            verdicts, n = qualify(noise, effects, design, alpha=alpha, rng=rng)
            gains = [v for v in verdicts if v.assertion.kind == "gain"]
            passed = [v.outcome == "pass" for v in gains]
            declared += any(passed)
            every += all(passed)
            used.append(n)
            for v in gains:
                outcomes[v.outcome] += 1
    return Result(runs, declared, every, float(np.mean(used)), max(used), min(used), outcomes)


def binomial_bound(runs: int, alpha: float, confidence: float = 0.99) -> int:
    """Most declared gains an A/A batch may show if the true rate is alpha (one-sided `confidence`)."""
    return int(stats.binom.ppf(confidence, runs, alpha))


def moderate_effect(sd: float, *, alpha: float, trials: int = 10, power: float = 0.9) -> float:
    """The effect that the fixed design needs `trials` per build to detect with `power`."""
    return float(optimize.brentq(lambda e: power_of(e, sd, trials, alpha=alpha) - power, 1e-9 * sd, 10 * sd))


# Designs the figures are quoted for: the moderate effect's fixed design and its sequential rival.
FIXED_MODERATE = Design(10)
SEQUENTIAL_MODERATE = Design(3, 13)
AA_FIXED = Design(5)
AA_SEQUENTIAL = Design(3, 13)
LARGE = Design(3, 13)          # the RowCache study's hit rate 86 % -> 99 %


def arguments(module: str, doc: str | None, argv: Sequence[str] | None) -> argparse.Namespace:
    """--runs, --alpha and --seed of a harness run as ``python -m <module>``."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=(doc or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments("tests.stats_sim", __doc__, argv)
    runs, alpha = args.runs, args.alpha
    bound = binomial_bound(runs, alpha)
    print(f"{runs} runs per row, alpha {alpha}; A/A may declare a gain at most {bound} times "
          f"({bound / runs:.2%}, the 99 % binomial bound)\n")
    print("| case | design | gain declared | power (all gains pass) | mean trials/build | min..max |")
    print("|---|---|---|---|---|---|")
    zero = [0.0] * len(LAB)
    effect = moderate_effect(HIT_RATE.sd, alpha=alpha)
    rows = [("A/A, default scenario", LAB, zero, AA_FIXED),
            ("A/A, default scenario", LAB, zero, AA_SEQUENTIAL),
            (f"moderate gain {effect:.5f} (hit rate)", [HIT_RATE], [effect], FIXED_MODERATE),
            (f"moderate gain {effect:.5f} (hit rate)", [HIT_RATE], [effect], SEQUENTIAL_MODERATE),
            ("large gain 0.86 -> 0.99 (hit rate)", [HIT_RATE], [0.13], LARGE)]
    for seed, (name, noise, effects, design) in enumerate(rows, start=args.seed):
        start = time.perf_counter()
        r = simulate(noise, effects, design, runs=runs, alpha=alpha, seed=seed)
        print(f"| {name} | {design} | {r.gains_declared} ({r.rate:.2%}) | {r.power:.3f} | "
              f"{r.mean_trials:.2f} | {r.min_trials_used}..{r.max_trials_used} |"
              f"  <!-- {time.perf_counter() - start:.1f} s, gain outcomes {r.outcomes} -->")
    print(f"\nfixed design power at 10 per build for {effect:.5f} (noncentral t): "
          f"{power_of(effect, HIT_RATE.sd, 10, alpha=alpha):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
