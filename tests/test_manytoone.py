"""Many-to-one decisions: the many-to-one level, each candidate decided as if alone, losing arms dropped,
the ranking, and the validation harness's promises (tests/support/tournament_sim.py) on seeded simulations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from cache_qualify.errors import PlanError
from cache_qualify.stats.manytoone import (CANNOT_PASS, MORE_TRIALS, Standing, Tournament, boundary_for, ranked,
                                           recommended, screening_level)
from cache_qualify.sizing.lab_time import tournament_starts
from cache_qualify.tournament_time import lab_time
from cache_qualify.stats.sequential import DEFAULT_BOUNDARY, Boundary, plan_looks
from cache_qualify.validation.simulate import SHAPES
from cache_qualify.validation.promises import binomial_bound
from cache_qualify.stats.verdict import Verdict, VerdictWarning, carry, evaluate
from tests.support import tournament_sim as sim

RUNS = 400          # per fixed-design harness row: a second or two each
ALPHA = 0.05        # the harness's level: rates near 0.01 would need far more runs to check
HIT_RATE = SHAPES["reread-1g"][0]                     # the B re-read's hit rate: mean 0.86, its SD between starts
KV_PAGES = SHAPES["reread-1g"][5]
GAIN = HIT_RATE.assertion(0.0)


NULL_RUNS = 200_000


def _any_null_passes(level: float, trials: int, candidates: int, seed: int, variance: float = 1.0) -> int:
    """Null runs (every candidate equal to the baseline in mean, normal noise, the candidates' variance
    `variance` times the baseline's) in which any candidate's paired t test of its block differences with
    the shared baseline passes at `level`."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((NULL_RUNS, 1, trials))
    d = math.sqrt(variance) * rng.standard_normal((NULL_RUNS, candidates, trials)) - base
    t = d.mean(axis=2) / (d.std(axis=2, ddof=1) / math.sqrt(trials))
    return int((stats.t.sf(t, trials - 1) < level).any(axis=1).sum())


def _z_dunnett(alpha: float, candidates: int) -> float:
    """Dunnett's level for z statistics (correlation 0.5), as screening used before the t-scale level."""
    cov = np.full((candidates, candidates), 0.5) + 0.5 * np.eye(candidates)
    law = stats.multivariate_normal(np.zeros(candidates), cov)
    c = optimize.brentq(lambda x: law.cdf(np.full(candidates, x), rng=np.random.default_rng(1)) - (1 - alpha),
                        1.0, 5.0, xtol=1e-6)
    return float(stats.norm.sf(c))


@pytest.mark.parametrize("trials", [3, 5, 10])
@pytest.mark.parametrize("alpha", [0.01, 0.05])
def test_screening_holds_the_family_wise_rate_at_alpha_whatever_the_candidates_variances(alpha: float,
                                                                                        trials: int) -> None:
    """Three null candidates sharing one baseline: the chance that any passes its paired t test at the
    screening level is alpha when the candidates are far noisier than the baseline (their comparisons
    nearly independent, the worst case), and at most alpha with equal or 3x variances (200,000 runs a
    case: within the 99.9 % binomial bounds); less strict than Bonferroni's alpha / 3."""
    level = screening_level(alpha, 3, units=trials)
    assert alpha / 3 < level < alpha
    low, high = stats.binom.ppf(0.001, NULL_RUNS, alpha), stats.binom.ppf(0.999, NULL_RUNS, alpha)
    worst = _any_null_passes(level, trials, 3, seed=trials, variance=100.0)
    assert low <= worst <= high, worst / NULL_RUNS
    for variance in (1.0, 3.0):
        passes = _any_null_passes(level, trials, 3, seed=trials + 1, variance=variance)
        assert passes <= high, (variance, passes / NULL_RUNS)


def test_screening_holds_its_level_with_candidates_noisier_than_the_baseline() -> None:
    """The cell where a level sized for equal variances (correlation 0.5 between the comparisons) ran
    furthest above alpha: four candidates three times as noisy as the baseline, 10 blocks, 5.5 % at 0.05
    (1,000,000 runs); the level of independent comparisons holds it."""
    passes = _any_null_passes(screening_level(0.05, 4, units=10), 10, 4, seed=2026, variance=3.0)
    assert passes <= stats.binom.ppf(0.999, NULL_RUNS, 0.05), passes / NULL_RUNS


@pytest.mark.parametrize("variance", [1.0, 100.0])
def test_sequential_screening_holds_the_family_wise_rate(variance: float) -> None:
    """Looks at 3, 5, 7 and 9 blocks, three null candidates: runs in which any candidate passes at any look,
    at most alpha (200,000 runs; the worst case, candidates far noisier than the baseline, at alpha)."""
    looks = (3, 5, 7, 9)
    levels = Boundary(comparisons=3).nominal_levels(0.05, looks)
    rng = np.random.default_rng(17 + int(variance))
    base = rng.standard_normal((NULL_RUNS, 1, looks[-1]))
    d = math.sqrt(variance) * rng.standard_normal((NULL_RUNS, 3, looks[-1])) - base
    passed = np.zeros(NULL_RUNS, bool)
    for n, level in zip(looks, levels):
        t = d[:, :, :n].mean(axis=2) / (d[:, :, :n].std(axis=2, ddof=1) / math.sqrt(n))
        passed |= (stats.t.sf(t, n - 1) < level).any(axis=1)
    high = stats.binom.ppf(0.999, NULL_RUNS, 0.05)
    assert passed.sum() <= high, passed.mean()
    if variance > 1:
        assert passed.sum() >= stats.binom.ppf(0.001, NULL_RUNS, 0.05), passed.mean()


def test_the_screening_level_of_one_look_is_sidaks() -> None:
    """One look: each candidate's exact t law at Sidak's share, for blocks and trials alike."""
    for k in (2, 3, 4):
        for units in (3, 6, 10):
            assert screening_level(0.05, k, units=units) == pytest.approx(1 - 0.95 ** (1 / k), rel=1e-12)
            assert screening_level(0.01, k, units=units, paired=False) == pytest.approx(1 - 0.99 ** (1 / k),
                                                                                      rel=1e-12)


def test_dunnetts_z_scale_level_passes_too_many_null_candidates_of_t_tests() -> None:
    """Why the level is on the t scale: Dunnett's z-scale level, applied to the candidates' own t tests,
    passes more than alpha of null families (the audit: 5.2-5.4 % at 0.05 with 4 to 10 trials)."""
    z_level = _z_dunnett(0.05, 3)
    assert z_level > screening_level(0.05, 3, units=5)
    assert _any_null_passes(z_level, 5, 3, seed=99) > stats.binom.ppf(0.999, NULL_RUNS, 0.05)


def test_boundaries_by_mode() -> None:
    assert boundary_for("gate", 4) == DEFAULT_BOUNDARY
    assert boundary_for("screening", 3).comparisons == 3
    assert screening_level(0.01, 1, units=5) == 0.01
    with pytest.raises(PlanError, match="the tournament mode must be one of gate, screening, got 'best-of'"):
        boundary_for("best-of", 3)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"`alpha` must be between 0 and 1, got 1.5"):
        screening_level(1.5, 3, units=5)
    with pytest.raises(PlanError, match=r"`comparisons` \(candidates sharing the baseline\) must be a whole "
                                        r"number >= 1, got 0"):
        boundary_for("screening", 3).__class__(comparisons=0)


def _alone(draws: dict[str, tuple[np.ndarray, np.ndarray]], looks: tuple[int, ...]) -> list[Verdict]:
    """A two-arm run of one candidate: carry look by look, stop when decided or failed."""
    verdicts: list[Verdict] | None = None
    for k, n in enumerate(looks, start=1):
        current = evaluate([GAIN], {a: (b[:n], c[:n]) for a, (b, c) in draws.items()},
                           alpha=ALPHA, look=k, looks=looks)
        verdicts = carry(verdicts, current)
        if all(v.outcome != "inconclusive" for v in verdicts) or any(v.outcome == "fail" for v in verdicts):
            break
    assert verdicts is not None
    return verdicts


@pytest.mark.slow
@pytest.mark.parametrize("looks", [(5,), tuple(range(3, 14))], ids=["fixed", "sequential"])
def test_gate_decides_each_candidate_exactly_as_alone(looks: tuple[int, ...]) -> None:
    rng = np.random.default_rng(11)
    aid = GAIN.id
    for _ in range(30):
        base = rng.normal(HIT_RATE.mean, HIT_RATE.sd, looks[-1])
        cands = {f"c{j}": rng.normal(HIT_RATE.mean + e * HIT_RATE.sd, HIT_RATE.sd, looks[-1])
                 for j, e in enumerate((0.0, 0.8, 2.0))}
        arms = Tournament(list(cands), [GAIN], alpha=ALPHA, looks=looks)
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
    aid = GAIN.id
    base = rng.normal(HIT_RATE.mean, HIT_RATE.sd, looks[-1])
    cands = {"worse": rng.normal(HIT_RATE.mean - 10 * HIT_RATE.sd, HIT_RATE.sd, looks[-1]),
             "slightly-better": rng.normal(HIT_RATE.mean + 0.9 * HIT_RATE.sd, HIT_RATE.sd, looks[-1])}
    arms = Tournament(list(cands), [GAIN], alpha=ALPHA, looks=looks)
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


def test_a_failed_assertion_stops_a_lone_candidate_and_says_so() -> None:
    """Every assertion must pass: once one failed, the others get no more trials, and their reasons say why."""
    failing, kv = GAIN, KV_PAGES.assertion(0.0)
    looks = (3, 4, 5)
    # the hit rate is clearly worse; KV pages sit within the margin but too noisy to show it yet
    base = {failing.id: [0.861, 0.860, 0.859], kv.id: [41_300.0, 40_300.0, 42_300.0]}
    cand = {failing.id: [0.821, 0.820, 0.819], kv.id: [41_310.0, 40_310.0, 42_310.0]}
    arms = Tournament(["only"], [failing, kv], alpha=ALPHA, looks=looks)
    assert arms.look(1, {"only": {a: (base[a], cand[a]) for a in base}}) == ["only"]
    assert [v.outcome for v in arms.verdicts("only")] == ["fail", "inconclusive"]
    assert CANNOT_PASS in arms.verdicts("only")[1].reason and MORE_TRIALS not in arms.verdicts("only")[1].reason
    assert arms.stopped["only"] == f"look 1, after 3 trials per build: failed {failing.id}"


def test_a_warning_is_said_once_an_assertion_with_the_look_it_first_applied_to() -> None:
    """Every start of both builds gave the same KV pages at each of three looks, whose notes differ only
    by their figures (the blocks so far): one warning for the run, naming look 1, not one a look."""
    kv = KV_PAGES.assertion(0.0)
    arms = Tournament(["only"], [kv], alpha=ALPHA, looks=(3, 4, 5))
    with pytest.warns(VerdictWarning) as caught:
        for k, n in enumerate((3, 4, 5), start=1):
            arms.look(k, {"only": {kv.id: ([41_300.0] * n, [41_300.0] * n)}})
    said = [str(w.message) for w in caught if issubclass(w.category, VerdictWarning)]
    assert len(said) == 1 and said[0].startswith(f"{kv.id}: every start of both builds gave the same value"), said
    assert "(look 1, the first it applied to; not said again)" in said[0], said


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


# --- the validation harness's figures (python -m tests.support.tournament_sim prints them at more runs) ----------

@pytest.mark.slow
@pytest.mark.parametrize("mode", ["gate", "screening"])
def test_aa_false_pass_per_candidate_within_its_bound(mode: str) -> None:
    one = sim.hit_rate_gain()
    s = sim.simulate(one, sim.null_effects(one), sim.FIXED, runs=RUNS, alpha=ALPHA, mode=mode,  # type: ignore[arg-type]
                     seed=21)
    bound = binomial_bound(RUNS, ALPHA, 0.999)   # the candidates share a baseline: their counts move together
    assert all(n <= bound for n in s.passes.values()), (s.passes, bound)
    assert sum(s.passes.values()) > 0  # the hardest case (one gain, no minimum effect) does pass at times


@pytest.mark.slow
@pytest.mark.parametrize(("noise", "trials"), [("normal", 5), ("normal", 10), ("heavy-tailed", 10)])
def test_screening_false_recommendation_within_its_bound(noise: str, trials: int) -> None:
    """The gate's own Tournament, three null candidates: screening holds the family within its bound, a gate
    of each does not."""
    one = sim.hit_rate_gain()
    screening = sim.simulate(one, sim.null_effects(one), (trials,), runs=RUNS, alpha=ALPHA, mode="screening",
                             seed=31, noise=noise)
    gate = sim.simulate(one, sim.null_effects(one), (trials,), runs=RUNS, alpha=ALPHA, mode="gate", seed=31,
                        noise=noise)
    assert screening.any_pass <= binomial_bound(RUNS, ALPHA, 0.999) < gate.any_pass  # the control holds it


@pytest.mark.slow
def test_screening_false_recommendation_sequential() -> None:
    one = sim.hit_rate_gain()
    s = sim.simulate(one, sim.null_effects(one), sim.SEQUENTIAL, runs=100, alpha=ALPHA, mode="screening", seed=33)
    assert s.any_pass <= binomial_bound(100, ALPHA)


@pytest.mark.slow
def test_tournament_of_the_study_candidates_at_equal_power() -> None:
    """The study's candidates on the default scenario: each passes as alone would, and the tournament saves
    starts; sequentially, candidates stop at different looks, so less than a fixed design's third."""
    study = sim.scenario_shape()
    s = sim.simulate(study, sim.study_effects(study), sim.DEFAULT, runs=60, alpha=0.01, mode="gate", seed=41)
    assert all(n >= 0.85 * s.runs for n in s.passes.values()), s.passes
    assert 0.25 <= s.saving < 1 / 3, (s.starts, s.separate)


def test_fixed_design_saves_a_third_with_three_candidates() -> None:
    lab = sim.shape("reread-1g")
    s = sim.simulate(lab, sim.moderate_effects(lab, 3.0), (8,), runs=40, alpha=ALPHA, mode="gate", seed=51)
    assert (s.starts, s.separate) == (32, 48)


def test_the_run_s_spending_shape_reaches_every_look_s_level() -> None:
    """A scenario's `spending_rho` is the boundary its arms are decided at: the first look's level is the
    exact t quantile of alpha x (first / maximum)^rho, for one candidate and, screening, over the family."""
    looks = (3, 4, 5)
    for rho in (1.0, 3.0):
        arms = Tournament(["c"], [], alpha=0.05, looks=looks, boundary=Boundary(rho=rho))
        assert arms.boundary.rho == rho
        assert arms.boundary.nominal_levels(0.05, looks)[0] == pytest.approx(0.05 * (3 / 5) ** rho)
    screening = Tournament(["a", "b"], [], alpha=0.05, mode="screening", looks=looks, boundary=Boundary(rho=1.0))
    assert (screening.boundary.rho, screening.boundary.comparisons) == (1.0, 2)
