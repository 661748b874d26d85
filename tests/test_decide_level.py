"""`decide` at its level: a pair named before a sequential run, decided after it, on the blocks no
look selected (`cache_qualify.stats.pairwise.decide_trials`), and every figure its reasons print read
from the starts its decision read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cache_qualify.cli.decide import lines
from cache_qualify.report.tables import fmt
from cache_qualify.samples.records import ArmRecord, ArmsRecord, Plan
from cache_qualify.samples.rundata import RunData
from cache_qualify.samples.store import ALL
from cache_qualify.stats.frames import assertion_samples
from cache_qualify.stats.pairwise import PairDecision, decide_pair, decide_trials
from cache_qualify.stats.verdict import Assertion, Trials, evaluate
from cache_qualify.validation.simulate import binomial_bound
from cache_qualify.methods import method
from tests.support.pair_sim import clopper_pearson, simulate

WELCH = method("welch")

WAIT = Assertion("readiness_wait_s", "B", "gain", False, min_effect=0.0, unit="s")


def _arm(values: list[float], first: int) -> Trials:
    n = len(values)
    return Trials(tuple(values), tuple(range(first, first + n)), tuple(range(n)))


def test_a_sequential_run_is_decided_on_its_first_look_s_blocks() -> None:
    """The copy stopped at 5 trials, the build ran 9: only the first look's 4 blocks are read."""
    rng = np.random.default_rng(3)
    base, cand = _arm(list(1 + 0.1 * rng.standard_normal(9)), 0), _arm(list(1 + 0.1 * rng.standard_normal(5)), 100)
    verdicts, notes = decide_trials([WAIT], {WAIT.id: (base, cand)}, alpha=0.05, method=WELCH, seed=0,
                                    first_look=4)
    r = verdicts[0].record
    assert (r.trials_baseline, r.trials_candidate) == (4, 4), r.reason
    assert r.baseline_mean == pytest.approx(float(np.mean(base.values[:4])))
    assert len(notes) == 1 and "decided on the 4 block(s) of its first look (4 trials per build)" in notes[0]


def test_every_printed_figure_is_of_the_starts_the_decision_read() -> None:
    """Blocks only one build ran (it went on after the other stopped) and a slow start among them are
    in no figure of the reason: the means, the start counts and the flagged starts are the shared blocks'."""
    rng = np.random.default_rng(5)
    base_values = list(1 + 0.05 * rng.standard_normal(10))
    base_values[8] = 9.0          # a slow start in a block the candidate never ran
    base, cand = _arm(base_values, 0), _arm(list(1.2 + 0.05 * rng.standard_normal(6)), 100)
    verdicts, notes = decide_trials([WAIT], {WAIT.id: (base, cand)}, alpha=0.05, method=WELCH, seed=0)
    r = verdicts[0].record
    shared = float(np.mean(base_values[:6]))
    assert (r.trials_baseline, r.trials_candidate) == (6, 6) and not r.flagged_starts, r.reason
    assert r.baseline_mean == pytest.approx(shared) and r.difference == pytest.approx(r.candidate_mean - shared)
    text = "\n".join(lines(PairDecision("s", "a", "b", tuple(verdicts), notes)))
    assert f"{fmt(shared, 's')} -> {fmt(r.candidate_mean, 's')}" in text, text
    assert fmt(float(np.mean(base_values)), "s") not in text and "9.000 s" not in text, text
    assert "(6 and 6 starts" in text and "decided on the 6 block(s) both builds ran" in text, text


@pytest.mark.slow
@pytest.mark.parametrize(("alpha", "runs"), [(0.05, 1000), (0.01, 200)])
def test_pairs_named_before_a_sequential_run_keep_alpha(alpha: float, runs: int) -> None:
    """A copy of the baseline in a 4..12 gate run (the gate's own Tournament, look by look); both ordered
    pairs of the two builds decided as `decide` decides them pass at most alpha: pooled and per pair within
    their 99 % binomial bounds. Decided on every block both ran (the rule before), this seed passed
    137 of 2,000 at 0.05 (6.85 %, bound 123): the copy that stopped early was chosen by its luck."""
    r = simulate(runs=runs, alpha=alpha, seed=2, candidates=1)
    pooled = sum(r.first_look.values())
    low, high = clopper_pearson(pooled, runs * r.pairs)
    assert pooled <= binomial_bound(runs * r.pairs, alpha), (pooled, low, high, r.first_look)
    worst = max(r.first_look.values())
    assert worst <= binomial_bound(runs, alpha, 1 - 0.01 / r.pairs), r.first_look


def _run(schedule: tuple[int, ...], starts: dict[str, int]) -> RunData:
    """A run folder's data in memory: builds a, b, c in interleaved blocks (one start each), build b
    stopped after `starts["b"]`, the verdicts of one gain on the readiness wait, the arms' schedule."""
    rng = np.random.default_rng(2)
    rows, trials = [], []
    number = 0
    for block in range(max(starts.values())):
        for build, n in starts.items():
            if block < n:
                value = float(1 + 0.1 * rng.standard_normal())
                rows.append(dict(scenario="s", build=build, trial=number, block=block, request="B", host=ALL,
                                 metric=WAIT.metric, value=value, group=""))
                trials.append(dict(scenario="s", build=build, trial=number, block=block, outcome="ok"))
                number += 1
    samples = pd.DataFrame(rows)
    pairs = assertion_samples(samples, [WAIT], scenario="s", baseline="a", candidate="c")
    verdicts = evaluate([WAIT], pairs, alpha=0.05, method=WELCH, arm="c")
    arms = ArmsRecord(looks=len(schedule), schedule=schedule,
                      arms=(ArmRecord("a", "a", "baseline"), ArmRecord("b", "b", "candidate"),
                            ArmRecord("c", "c", "candidate")))
    return RunData(Path("run"), Plan(run_id="run", seed=0, baseline="a", candidates=("b", "c"), scenarios=("s",)),
                   samples, pd.DataFrame(trials), {"s": tuple(v.record for v in verdicts)}, {}, {"s": arms})


def test_decide_pair_reads_a_sequential_run_s_first_look() -> None:
    """A 4..9 run in which b stopped at 6 starts and a, c ran 9: the pair b against c is decided on the
    first look's 4 blocks, and says so; a one-look run's pair on the blocks both ran, with no note."""
    decision = decide_pair(_run(tuple(range(4, 10)), {"a": 9, "b": 6, "c": 9}), "b", "c")
    r = decision.verdicts[0].record
    assert (r.trials_baseline, r.trials_candidate) == (4, 4), r.reason
    assert len(decision.notes) == 1 and "first look (4 trials per build)" in decision.notes[0], decision.notes
    fixed = decide_pair(_run((9,), {"a": 9, "b": 9, "c": 9}), "b", "c")
    assert fixed.verdicts[0].record.trials_baseline == 9 and fixed.notes == (), fixed.notes
