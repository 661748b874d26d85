"""Many-to-one decisions: Dunnett's level, each candidate decided as if alone, losing arms dropped,
the ranking, and the validation harness's promises (tests/tournament_sim.py) on seeded simulations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from cache_qualify.errors import PlanError
from cache_qualify.stats.manytoone import (Standing, Tournament, lab_time, level_for, ranked, recommended,
                                           screening_level, tournament_starts)
from cache_qualify.stats.sequential import plan_looks
from cache_qualify.stats.verdict import Verdict, carry, evaluate
from tests import tournament_sim as sim
from tests.stats_sim import HIT_RATE, LAB, Design, binomial_bound

RUNS = 400          # per harness row: a few seconds each
ALPHA = 0.05        # the harness's level: rates near 0.01 would need far more runs to check


@pytest.mark.parametrize("candidates", [2, 3, 4])
@pytest.mark.parametrize("alpha", [0.01, 0.05])
def test_screening_level_is_dunnetts(alpha: float, candidates: int) -> None:
    level = screening_level(alpha, candidates)
    assert alpha / candidates < level < alpha  # less strict than Bonferroni, stricter than none
    c = stats.norm.isf(level)
    cov = np.full((candidates, candidates), 0.5) + 0.5 * np.eye(candidates)
    exceeds = 1 - stats.multivariate_normal(np.zeros(candidates), cov).cdf(np.full(candidates, c), rng=1)
    assert exceeds == pytest.approx(alpha, rel=0.01)


def test_levels_by_mode() -> None:
    assert level_for("gate", 0.01, 4) == 0.01
    assert level_for("screening", 0.01, 1) == 0.01
    assert level_for("screening", 0.01, 3) == screening_level(0.01, 3)
    with pytest.raises(PlanError, match="mode"):
        level_for("best-of", 0.01, 3)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="alpha"):
        screening_level(1.5, 3)


def _alone(draws: dict[str, tuple[np.ndarray, np.ndarray]], looks: tuple[int, ...]) -> list[Verdict]:
    """A two-arm run of one candidate, as the gate did before tournaments: carry look by look."""
    verdicts: list[Verdict] | None = None
    for k, n in enumerate(looks, start=1):
        current = evaluate([HIT_RATE.assertion], {a: (b[:n], c[:n]) for a, (b, c) in draws.items()},
                           alpha=ALPHA, look=k, looks=looks)
        verdicts = carry(verdicts, current)
        if all(v.outcome != "inconclusive" for v in verdicts):
            break
    assert verdicts is not None
    return verdicts


@pytest.mark.parametrize("design", [Design(5), Design(3, 13)], ids=str)
def test_gate_decides_each_candidate_exactly_as_alone(design: Design) -> None:
    rng = np.random.default_rng(11)
    looks = design.looks
    aid = HIT_RATE.assertion.id
    for _ in range(30):
        base = rng.normal(HIT_RATE.mean, HIT_RATE.sd, looks[-1])
        cands = {f"c{j}": rng.normal(HIT_RATE.mean + e, HIT_RATE.sd, looks[-1])
                 for j, e in enumerate((0.0, 0.0008, 0.002))}
        arms = Tournament(list(cands), [HIT_RATE.assertion], alpha=ALPHA, looks=looks)
        for k, n in enumerate(looks, start=1):
            arms.look(k, {c: {aid: (base[:n], cands[c][:n])} for c in arms.running})
            if not arms.running:
                break
        for c, values in cands.items():
            alone = _alone({aid: (base, values)}, looks)
            together = arms.verdicts(c)
            assert [(v.outcome, v.p_value, len(v.candidate)) for v in together] == \
                [(v.outcome, v.p_value, len(v.candidate)) for v in alone]


def test_a_failed_candidate_stops_receiving_starts_while_others_continue() -> None:
    rng = np.random.default_rng(5)
    looks = plan_looks(initial=3, block=1, max_trials=8)
    aid = HIT_RATE.assertion.id
    base = rng.normal(HIT_RATE.mean, HIT_RATE.sd, looks[-1])
    cands = {"worse": rng.normal(HIT_RATE.mean - 0.01, HIT_RATE.sd, looks[-1]),
             "slightly-better": rng.normal(HIT_RATE.mean + 0.0009, HIT_RATE.sd, looks[-1])}
    arms = Tournament(list(cands), [HIT_RATE.assertion], alpha=ALPHA, looks=looks)
    starts = dict.fromkeys(cands, 0)
    for k, n in enumerate(looks, start=1):
        for c in arms.running:
            starts[c] = n
        arms.look(k, {c: {aid: (base[:n], cands[c][:n])} for c in arms.running})
        if not arms.running:
            break
    assert arms.stopped["worse"] == f"look 1, after 3 trials per build: failed {aid}"
    assert starts["worse"] == 3 < starts["slightly-better"]
    assert arms.decisions["worse"].outcome == "fail"
    assert arms.stopped["slightly-better"].startswith(f"look {looks.index(starts['slightly-better']) + 1},")


def test_one_candidate_keeps_running_until_every_assertion_is_decided() -> None:
    """Alone, a failed assertion does not stop the run: the others are still decided (as before)."""
    failing = LAB[0].assertion
    kv = LAB[4].assertion
    looks = (3, 4, 5)
    # the hit rate is clearly worse; KV pages sit within the margin but too noisy to show it yet
    base = {failing.id: [0.861, 0.860, 0.859], kv.id: [41_300.0, 41_000.0, 41_600.0]}
    cand = {failing.id: [0.851, 0.850, 0.849], kv.id: [41_310.0, 41_010.0, 41_610.0]}
    arms = Tournament(["only"], [failing, kv], alpha=ALPHA, looks=looks)
    arms.look(1, {"only": {a: (base[a], cand[a]) for a in base}})
    assert [v.outcome for v in arms.verdicts("only")] == ["fail", "inconclusive"]
    assert arms.running == ["only"] and not arms.stopped


def test_ranking_and_recommendation() -> None:
    standings = [Standing("set8", "pass", 0.06), Standing("lru4", "fail", -0.02),
                 Standing("two_choice", "pass", 0.11), Standing("set16", "pass", 0.10),
                 Standing("broken", "inconclusive", math.nan)]
    assert [s.candidate for s in ranked(standings)] == ["two_choice", "set16", "set8", "lru4", "broken"]
    best = recommended(standings)
    assert best is not None and best.candidate == "two_choice"
    assert recommended([Standing("lru4", "fail", 0.2), Standing("x", "inconclusive", 0.3)]) is None


def test_lab_time_counts_a_shared_baseline_once() -> None:
    time = lab_time({"set4": 3, "set8": 3, "set16": 2, "lru4": 2}, "set4")
    assert (time.starts, time.separate, time.candidates) == (10, 14, 3)
    assert time.saving == pytest.approx(1 - 10 / 14)
    assert tournament_starts([3, 2, 2]) == (10, 14)
    assert tournament_starts([4, 4, 4]) == (16, 24)


# --- the validation harness's figures (python -m tests.tournament_sim prints them at 2000 runs) ----------

@pytest.mark.parametrize("design", [sim.FIXED, sim.SEQUENTIAL], ids=str)
def test_gate_aa_false_pass_per_candidate_within_its_bound(design: Design) -> None:
    s = sim.simulate([HIT_RATE], sim.null_effects(1), design, runs=RUNS, alpha=ALPHA, mode="gate", seed=21)
    bound = binomial_bound(RUNS, ALPHA)
    assert all(n <= bound for n in s.passes.values()), (s.passes, bound)
    assert sum(s.passes.values()) > 0  # the hardest case (one gain, no minimum effect) does pass at times


@pytest.mark.parametrize("design", [sim.FIXED, sim.SEQUENTIAL], ids=str)
def test_screening_false_recommendation_within_its_bound(design: Design) -> None:
    screening = sim.simulate([HIT_RATE], sim.null_effects(1), design, runs=RUNS, alpha=ALPHA, mode="screening",
                             seed=31)
    gate = sim.simulate([HIT_RATE], sim.null_effects(1), design, runs=RUNS, alpha=ALPHA, mode="gate", seed=31)
    assert screening.any_pass <= binomial_bound(RUNS, ALPHA) < gate.any_pass  # the control is what holds it


def test_tournament_of_the_study_candidates_saves_starts_at_equal_power() -> None:
    noise = sim.scenario_noise()
    s = sim.simulate(noise, sim.study_effects(noise), sim.DEFAULT, runs=200, alpha=0.01, mode="gate", seed=41)
    assert all(n >= 0.9 * s.runs for n in s.passes.values()), s.passes  # power 0.9 each, as alone
    assert s.saving >= 0.30, (s.starts, s.separate)


def test_fixed_design_saves_a_third_with_three_candidates() -> None:
    s = sim.simulate([HIT_RATE], sim.moderate_effects(ALPHA), sim.MODERATE_FIXED, runs=100, alpha=ALPHA,
                     mode="gate", seed=51)
    assert s.saving == pytest.approx(1 / 3)
    assert all(n >= 0.8 * s.runs for n in s.passes.values()), s.passes
