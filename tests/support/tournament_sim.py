"""Validation harness of tournaments: several candidates against one baseline, on the decision code alone.

Each simulated run draws per-trial values from the calibrated noise model of
`cache_qualify.validation.promises` (`cache-qualify validate`: its shapes, SDs and
noise variants), shares one baseline sample among the candidates, and drives the
gate's own `cache_qualify.stats.manytoone.Tournament` look by look, dropping arms
as the gate does. It measures what the tournament promises:

* lab time: server starts of a gate-mode tournament of three candidates against
  three separate two-arm runs of the same candidates (each deciding alike, so at
  equal per-candidate error rate and power);
* gate mode: each candidate's A/A false-pass rate (three candidates identical
  to the baseline) against its binomial bound of alpha;
* screening mode (``--tournament``): the family-wise false-recommendation rate
  with three candidates identical to the baseline, against the same bound.

``python -m tests.support.tournament_sim`` prints the figures quoted in
docs/statistics.md; tests/test_manytoone.py checks quick versions.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from cache_qualify.sizing.lab_time import tournament_starts
from cache_qualify.stats.manytoone import Mode, Tournament
from cache_qualify.validation.simulate import NOISE, SHAPES, Item, draw
from cache_qualify.validation.promises import binomial_bound
from cache_qualify.stats.verdict import Assertion, Trials, VerdictWarning


@dataclass(frozen=True)
class Shape:
    """Assertions with their baseline noise (validation's items), possibly with the scenario's own
    minimum effects and margins in place of the items' (`assertions`)."""

    items: tuple[Item, ...]
    assertions: tuple[Assertion, ...]


def shape(name: str, *, min_effect_sd: float = 0.0) -> Shape:
    """One of validation's shapes with gains' minimum effect `min_effect_sd` SDs (0: the hardest case)."""
    items = SHAPES[name]
    return Shape(items, tuple(item.assertion(min_effect_sd) for item in items))


def hit_rate_gain() -> Shape:
    """One gain on the B re-read's hit rate, `min_effect` 0: the hardest A/A case for a metric whose
    starts the verdicts never flag as bad (readiness waits are; see docs/statistics.md)."""
    item = SHAPES["reread-1g"][0]
    return Shape((item,), (item.assertion(0.0),))


# the first read of A with a new start re-reads at 99.4 % in the study (validation's shape has it too;
# kept here so that the study's row does not depend on the shape's choice)
STUDY_MEANS = {("hit_rate", "A-new-start"): 0.994}


def scenario_shape(scenario: str = "reread-1g") -> Shape:
    """validation's reread-1g noise at the study's means, with the shipped scenario's own assertions
    (minimum effects and margins)."""
    from cache_qualify.config.scenario import find_scenario, load_scenario
    from cache_qualify.config.profiles import resolve
    from cache_qualify.stats.scenario_assertions import assertions_for

    own = {(a.metric, a.request): a for a in assertions_for(load_scenario(find_scenario(scenario)), resolve("flare"))}
    items = tuple(replace(i, mean=STUDY_MEANS.get((i.metric, i.request), i.mean)) for i in SHAPES["reread-1g"])
    return Shape(items, tuple(own.get((i.metric, i.request), i.assertion(0.0)) for i in items))


@dataclass(frozen=True)
class TournamentRun:
    """One simulated tournament: each candidate's outcome and trials per build, and its starts."""

    outcomes: dict[str, str]
    trials: dict[str, int]            # per candidate, at its stop
    starts: int                       # the tournament's: baseline + every candidate
    separate: int                     # one two-arm run per candidate, deciding alike
    # every build's starts as the run ran them (the baseline's until the last arm stopped), per assertion id
    ran: dict[str, dict[str, Trials]]


def _prefix(pair: tuple[Trials, Trials], n: int) -> tuple[Trials, Trials]:
    return tuple(Trials(t.values[:n], t.starts[:n], t.blocks[:n]) for t in pair)  # type: ignore[return-value]


def tournament(sh: Shape, effects_sd: Sequence[Sequence[float]], looks: Sequence[int], *, alpha: float,
               mode: Mode, noise: str, rng: np.random.Generator) -> TournamentRun:
    """One run: `effects_sd[j]` are candidate j's true improvements in SDs, one per item of `sh`."""
    names = [f"c{j + 1}" for j in range(len(effects_sd))]
    # each candidate drawn with its own copy of the baseline; the first copy is the shared baseline
    drawn = [draw(sh.items, effects, NOISE[noise], looks[-1], rng, 0.0) for effects in effects_sd]
    ids = [item.assertion(0.0).id for item in sh.items]   # draw's keys; the shape's assertions share them
    baseline = {i: drawn[0][i][0] for i in ids}
    arms = Tournament(names, sh.assertions, alpha=alpha, mode=mode, looks=looks)
    trials: dict[str, int] = {}
    for k, n in enumerate(looks, start=1):
        samples: dict[str, dict[str, tuple[Trials, Trials]]] = {
            c: {i: _prefix((baseline[i], drawn[j][i][1]), n) for i in ids}
                   for j, c in enumerate(names) if c in arms.running}
        for c in arms.look(k, samples):
            trials[c] = n
        if not arms.running:
            break
    outcomes = {c: str(arms.decisions[c].outcome) for c in names}
    starts, separate = tournament_starts([trials[c] for c in names])
    ran = {"baseline": {i: _prefix((baseline[i], baseline[i]), max(trials.values()))[0] for i in ids}}
    ran.update({c: {i: _prefix((drawn[j][i][1], drawn[j][i][1]), trials[c])[0] for i in ids}
                for j, c in enumerate(names)})
    return TournamentRun(outcomes, trials, starts, separate, ran)


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


def simulate(sh: Shape, effects_sd: Sequence[Sequence[float]], looks: Sequence[int], *, runs: int, alpha: float,
             mode: Mode, seed: int, noise: str = "normal") -> Summary:
    """Repeat `tournament` `runs` times from one seed."""
    rng = np.random.default_rng(seed)
    passes = {f"c{j + 1}": 0 for j in range(len(effects_sd))}
    any_pass = 0
    starts: list[int] = []
    separate: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VerdictWarning)  # as `cache-qualify validate`: bad starts are flagged
        for _ in range(runs):
            run = tournament(sh, effects_sd, looks, alpha=alpha, mode=mode, noise=noise, rng=rng)
            for c, outcome in run.outcomes.items():
                passes[c] += outcome == "pass"
            any_pass += any(o == "pass" for o in run.outcomes.values())
            starts.append(run.starts)
            separate.append(run.separate)
    return Summary(runs, passes, any_pass, float(np.mean(starts)), float(np.mean(separate)))


def null_effects(sh: Shape, candidates: int = 3) -> list[list[float]]:
    """Candidates identical to the baseline on every assertion."""
    return [[0.0] * len(sh.items) for _ in range(candidates)]


# The RowCache study's emulated gains at 1 GiB (B new start, A third read) of the three candidates that
# should pass: hit rates rise by these, readiness waits fall in proportion to the misses saved.
STUDY_GAINS = {"set8": (0.062, 0.061), "set16": (0.105, 0.100), "two_choice": (0.131, 0.127)}


def study_effects(sh: Shape) -> list[list[float]]:
    """Improvements in SDs of set8, set16 and two_choice on every item of `sh`."""
    hit = {i.request: i.mean for i in sh.items if i.metric == "hit_rate"}
    out = []
    for gains in STUDY_GAINS.values():
        gain = dict(zip(("B-new-start", "A-third-read"), gains))
        out.append([0.0 if i.kind != "gain" else gain[i.request] / i.sd if i.metric == "hit_rate"
                    else i.mean * gain[i.request] / (1 - hit[i.request]) / i.sd for i in sh.items])
    return out


def moderate_effects(sh: Shape, effect_sd: float = 2.0, candidates: int = 3) -> list[list[float]]:
    """Candidates better by `effect_sd` SDs on every gain."""
    return [[effect_sd if i.kind == "gain" else 0.0 for i in sh.items] for _ in range(candidates)]


FIXED = (5,)
SEQUENTIAL = tuple(range(3, 14))         # 3..13, one trial per build between looks
DEFAULT = tuple(range(4, 13))            # the default scenario's trials and max_trials


def _design(looks: Sequence[int]) -> str:
    return f"fixed {looks[0]}" if len(looks) == 1 else f"sequential {looks[0]}..{looks[-1]}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.tournament_sim", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    runs, alpha, bound = args.runs, args.alpha, binomial_bound(args.runs, args.alpha)
    print("\n".join([f"{runs} runs per row, alpha {alpha}, three candidates; a rate of alpha gives at most "
                     f"{bound} ({bound / runs:.2%}, the 99 % binomial bound)", "",
                     "| case | mode | design | passes per candidate | any candidate passes "
                     "| starts: tournament / separate two-arm runs | fewer starts |",
                     "|---|---|---|---|---|---|---|"]))
    one, lab, study = hit_rate_gain(), shape("reread-1g"), scenario_shape()
    rows: list[tuple[str, Shape, Mode, tuple[int, ...], list[list[float]], str]] = [
        ("A/A x 3, one gain", one, "gate", FIXED, null_effects(one), "normal"),
        ("A/A x 3, one gain", one, "gate", (10,), null_effects(one), "normal"),
        ("A/A x 3, one gain", one, "screening", FIXED, null_effects(one), "normal"),
        ("A/A x 3, one gain", one, "screening", (10,), null_effects(one), "normal"),
        ("A/A x 3, one gain", one, "screening", SEQUENTIAL, null_effects(one), "normal"),
        ("A/A x 3, one gain, heavy tails", one, "screening", (10,), null_effects(one), "heavy-tailed"),
        ("A/A x 3, reread-1g shape", lab, "gate", SEQUENTIAL, null_effects(lab), "normal"),
        ("set8, set16, two_choice, reread-1g", study, "gate", DEFAULT, study_effects(study), "normal"),
        ("2 SD gains x 3, reread-1g shape", lab, "gate", (10,), moderate_effects(lab), "normal"),
        ("2 SD gains x 3, reread-1g shape", lab, "gate", SEQUENTIAL, moderate_effects(lab), "normal"),
    ]
    for seed, (name, sh, mode, looks, effects, noise) in enumerate(rows, start=args.seed):
        s = simulate(sh, effects, looks, runs=runs, alpha=alpha, mode=mode, seed=seed, noise=noise)
        per = " / ".join(str(n) for n in s.passes.values())
        print(f"| {name} | {mode} | {_design(looks)} | {per} | {s.any_pass} ({s.any_pass / runs:.2%}) | "
              f"{s.starts:.1f} / {s.separate:.1f} | {s.saving:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
