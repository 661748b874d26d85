"""Validation harness of tournaments: several candidates against one baseline, on the decision code alone.

Each simulated run draws per-trial values from the calibrated noise of
`tests.stats_sim` (the default scenario's assertions), shares one baseline
sample among the candidates, and drives the gate's own
`cache_qualify.stats.manytoone.Tournament` look by look, dropping arms as the gate
does. It measures what the tournament promises:

* lab time: server starts of a gate-mode tournament of three candidates against
  three separate two-arm runs of the same candidates (each run deciding alike, so
  at equal per-candidate error rate and power), fixed and sequential;
* gate mode: each candidate's A/A false-pass rate (three candidates identical
  to the baseline) against its binomial bound of alpha;
* screening mode (``--tournament``): the family-wise false-recommendation rate
  with three candidates identical to the baseline, against the same bound.

``python -m tests.tournament_sim`` prints the figures quoted in
docs/statistics.md; tests/test_manytoone.py checks quick versions.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cache_qualify.stats.manytoone import Mode, Tournament, tournament_starts
from cache_qualify.stats.verdict import VerdictWarning
from tests.stats_sim import HIT_RATE, LAB, Design, Noise, arguments, binomial_bound, moderate_effect

BASELINE = "baseline"


@dataclass(frozen=True)
class TournamentRun:
    """One simulated tournament: each candidate's outcome and trials per build, and its starts."""

    outcomes: dict[str, str]
    trials: dict[str, int]            # per candidate, at its stop
    starts: int                       # the tournament's: baseline + every candidate
    separate: int                     # one two-arm run per candidate, deciding alike


def tournament(noise: Sequence[Noise], effects: Sequence[Sequence[float]], design: Design, *, alpha: float,
               mode: Mode, rng: np.random.Generator) -> TournamentRun:
    """One run: `effects[j]` are candidate j's true improvements, one per assertion of `noise`."""
    looks = design.looks
    names = [f"c{j + 1}" for j in range(len(effects))]
    base = {item.assertion.id: rng.normal(item.mean, item.sd, looks[-1]) for item in noise}
    cands = {name: {item.assertion.id: rng.normal(
        item.mean + (e if item.assertion.higher_is_better else -e), item.sd, looks[-1])
        for item, e in zip(noise, effect)} for name, effect in zip(names, effects)}
    arms = Tournament(names, [item.assertion for item in noise], alpha=alpha, mode=mode, looks=looks)
    trials: dict[str, int] = {}
    for k, n in enumerate(looks, start=1):
        running = list(arms.running)
        samples = {c: {aid: (base[aid][:n], cands[c][aid][:n]) for aid in base} for c in running}
        for c in arms.look(k, samples):
            trials[c] = n
        if not arms.running:
            break
    outcomes = {c: str(arms.decisions[c].outcome) for c in names}
    starts, separate = tournament_starts([trials[c] for c in names])
    return TournamentRun(outcomes, trials, starts, separate)


@dataclass(frozen=True)
class Summary:
    runs: int
    passes: dict[str, int]            # per candidate: runs in which it passed
    any_pass: int                     # runs in which at least one candidate passed
    starts: float                     # mean starts per run, tournament
    separate: float                   # mean starts per run, separate two-arm runs

    @property
    def saving(self) -> float:
        return 1.0 - self.starts / self.separate


def simulate(noise: Sequence[Noise], effects: Sequence[Sequence[float]], design: Design, *, runs: int,
             alpha: float, mode: Mode, seed: int) -> Summary:
    """Repeat `tournament` `runs` times from one seed."""
    rng = np.random.default_rng(seed)
    passes = {f"c{j + 1}": 0 for j in range(len(effects))}
    any_pass = 0
    starts: list[int] = []
    separate: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", VerdictWarning)  # continuous noise must never be degenerate
        for _ in range(runs):
            run = tournament(noise, effects, design, alpha=alpha, mode=mode, rng=rng)
            for c, outcome in run.outcomes.items():
                passes[c] += outcome == "pass"
            any_pass += any(o == "pass" for o in run.outcomes.values())
            starts.append(run.starts)
            separate.append(run.separate)
    return Summary(runs, passes, any_pass, float(np.mean(starts)), float(np.mean(separate)))


def null_effects(assertions: int, candidates: int = 3) -> list[list[float]]:
    """Candidates identical to the baseline on every one of `assertions`."""
    return [[0.0] * assertions for _ in range(candidates)]


# The default scenario (reread-1g) as the gate runs it, its assertions with their minimum effects
# and margins, under the calibrated noise of tests.stats_sim (hit rates sd 0.1 pp between starts,
# readiness waits 3 %, KV pages sd 30) at the RowCache study's baseline means.
BASELINE_MEANS = {("hit_rate", "A"): 0.089, ("hit_rate", "A-new-start"): 0.994, ("hit_rate", "B"): 0.164,
                  ("hit_rate", "B-new-start"): 0.856, ("hit_rate", "A-third-read"): 0.864,
                  ("readiness_wait_ns", "B-new-start"): 2.1e9, ("readiness_wait_ns", "A-third-read"): 6.5e8,
                  ("kv_pages", "startup"): 41_300.0}
SDS = {"hit_rate": 0.001, "kv_pages": 30.0}
# The study's emulated gains at 1 GiB (B new start, A third read) of the three candidates that should
# pass: hit rates rise by these, readiness waits fall in proportion to the misses saved.
STUDY_GAINS = {"set8": (0.062, 0.061), "set16": (0.105, 0.100), "two_choice": (0.131, 0.127)}


def scenario_noise(name: str = "reread-1g") -> list[Noise]:
    from cache_qualify.config.scenario import find_scenario, load_scenario
    from cache_qualify.qualification import assertions_for

    out = []
    for a in assertions_for(load_scenario(find_scenario(name))):
        mean = BASELINE_MEANS[(a.metric, a.request)]
        out.append(Noise(a, mean, SDS.get(a.metric, 0.03 * mean)))
    return out


def study_effects(noise: Sequence[Noise]) -> list[list[float]]:
    """Improvements of set8, set16 and two_choice on every assertion of `noise`."""
    out = []
    for gains in STUDY_GAINS.values():
        gain = dict(zip(("B-new-start", "A-third-read"), gains))
        hit = {item.assertion.request: item.mean for item in noise if item.assertion.metric == "hit_rate"}
        out.append([0.0 if item.assertion.kind != "gain" else gain[item.assertion.request]
                    if item.assertion.metric == "hit_rate" else
                    item.mean * gain[item.assertion.request] / (1 - hit[item.assertion.request])
                    for item in noise])
    return out


def moderate_effects(alpha: float, candidates: int = 3) -> list[list[float]]:
    """Hit-rate-only candidates with the moderate effect of tests.stats_sim (power 0.9 at 10 trials)."""
    effect = moderate_effect(HIT_RATE.sd, alpha=alpha)
    return [[effect] for _ in range(candidates)]


# the designs quoted: the A/A and moderate-gain designs of tests.stats_sim
FIXED = Design(5)
SEQUENTIAL = Design(3, 13)
DEFAULT = Design(4, 12)          # the default scenario's trials and max_trials
MODERATE_FIXED = Design(10)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments("tests.tournament_sim", __doc__, argv)
    runs, alpha, bound = args.runs, args.alpha, binomial_bound(args.runs, args.alpha)
    print("\n".join([f"{runs} runs per row, alpha {alpha}, three candidates; a rate of alpha gives at most "
                     f"{bound} ({bound / runs:.2%}, the 99 % binomial bound)", "",
                     "| case | mode | design | passes per candidate | any candidate passes "
                     "| starts: tournament / separate two-arm runs | fewer starts |",
                     "|---|---|---|---|---|---|---|"]))
    one, lab, study = [HIT_RATE], list(LAB), scenario_noise()
    rows: list[tuple[str, Sequence[Noise], Mode, Design, list[list[float]]]] = [
        ("A/A x 3, one hit-rate gain", one, "gate", FIXED, null_effects(1)),
        ("A/A x 3, one hit-rate gain", one, "gate", SEQUENTIAL, null_effects(1)),
        ("A/A x 3, one hit-rate gain", one, "screening", FIXED, null_effects(1)),
        ("A/A x 3, one hit-rate gain", one, "screening", SEQUENTIAL, null_effects(1)),
        ("A/A x 3, default scenario", lab, "gate", SEQUENTIAL, null_effects(len(LAB))),
        ("set8, set16, two_choice, default scenario", study, "gate", DEFAULT, study_effects(study)),
        ("A/A x 3, default scenario", study, "screening", DEFAULT, null_effects(len(study))),
        ("moderate gain x 3 (hit rate)", one, "gate", MODERATE_FIXED, moderate_effects(alpha)),
        ("moderate gain x 3 (hit rate)", one, "gate", SEQUENTIAL, moderate_effects(alpha)),
    ]
    for seed, (name, noise, mode, design, effects) in enumerate(rows, start=args.seed):
        s = simulate(noise, effects, design, runs=runs, alpha=alpha, mode=mode, seed=seed)
        per = " / ".join(str(n) for n in s.passes.values())
        print(f"| {name} | {mode} | {design} | {per} | {s.any_pass} ({s.any_pass / runs:.2%}) | "
              f"{s.starts:.1f} / {s.separate:.1f} | {s.saving:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
