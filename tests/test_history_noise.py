"""The lab's noise from its history: the prior, the change-point and consistency checks, and the whole
decision with it, measured on seeded simulated qualifications."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from scipy import stats

from cache_qualify.cli import main
from cache_qualify.validation import history_promises as hv
from cache_qualify.stats.known_noise import CHECK_LEVEL, POOLED_DF, EarlierRun, build_noise, pooled, prior
from cache_qualify.sizing.lab_time import Simulated, Truth, history_design, simulate
from cache_qualify.stats.power import POWER
from cache_qualify.validation.simulate import binomial_bound
from cache_qualify.stats.verdict import Assertion, Trials, evaluate


def _runs(rng: np.random.Generator, sds: list[float], starts: int = 4, mean: float = 10.0) -> list[EarlierRun]:
    return [EarlierRun(f"r{k}", tuple(mean + k + sd * rng.standard_normal(starts))) for k, sd in enumerate(sds)]


def test_the_prior_is_the_pooled_within_run_variance_whatever_the_runs_levels() -> None:
    runs = [EarlierRun("a", (1.0, 2.0, 3.0)), EarlierRun("b", (101.0, 103.0)), EarlierRun("c", (5.0,))]
    noise = build_noise(runs)
    assert noise is not None and noise.df == 3 and noise.runs == ("a", "b")   # a single start measures no noise
    assert noise.variance == pytest.approx((2.0 + 2.0) / 3)                    # each run about its own mean
    known = prior(runs, min_df=3)
    assert known is not None and known.variance == pytest.approx(2 * noise.variance) and known.df == 3
    assert "taken as the baseline's" in known.note and known.starts == 5
    assert prior(runs) is None                                                 # fewer than MIN_DF df


def test_the_candidates_own_history_adds_its_variance_with_satterthwaites_df() -> None:
    base = [EarlierRun(f"b{k}", (0.0, 1.0, 2.0)) for k in range(4)]           # variance 1, 8 df
    cand = [EarlierRun(f"c{k}", (0.0, 2.0, 4.0)) for k in range(3)]           # variance 4, 6 df
    known = prior(base, cand)
    assert known is not None and known.variance == pytest.approx(5.0)
    assert known.df == math.floor(25 / (1 / 8 + 16 / 6)) and len(known.runs) == 7 and known.note == ""


def test_a_step_change_in_the_noise_drops_the_runs_before_it() -> None:
    rng = np.random.default_rng(3)
    runs = _runs(rng, [0.3] * 6 + [1.0] * 4)
    noise = build_noise(runs)
    assert noise is not None and noise.dropped == tuple(f"r{k}" for k in range(6))
    assert noise.runs == tuple(f"r{k}" for k in range(6, 10)) and noise.change_p < 0.01
    steady = build_noise(_runs(np.random.default_rng(4), [1.0] * 10))
    assert steady is not None and steady.dropped == () and steady.df == 30
    known = prior(runs)
    assert known is not None and "before a change in its noise" in known.note


def test_the_check_pools_only_a_history_that_agrees_with_the_run() -> None:
    known = prior(_runs(np.random.default_rng(5), [1.0] * 5))
    assert known is not None
    agree = pooled(known, 0.8 * known.variance, 3.0)     # calmer than the history: the check at 0.5 agrees
    assert known.df == 15 and known.pooled_df == POOLED_DF == agree.prior_df     # counted as 4 df, not 15
    assert agree.used and agree.df == 3 + POOLED_DF and agree.variance == pytest.approx((2.4 + POOLED_DF) * known.variance / agree.df)
    assert f"15 df, counted as {POOLED_DF}" in agree.note
    assert "agrees" in agree.note and agree.check_p >= CHECK_LEVEL
    off = pooled(known, 30 * known.variance, 3.0)
    assert not off.used and off.df == 3.0 and off.variance == 30 * known.variance
    assert "this run's spread alone decides" in off.note and "one-sided F test" in off.note
    calm = pooled(known, known.variance / 30, 3.0)      # a spread below the history's is tested more strictly
    assert calm.used and calm.variance > known.variance / 30 and calm.check_p > 0.9


def test_the_verdict_names_the_history_and_decides_after_two_blocks() -> None:
    known = prior(_runs(np.random.default_rng(6), [1.0] * 6))
    assert known is not None
    a = Assertion("m", "R", "gain", True, min_effect=0.0)
    # a gain of about 20 SDs of a block difference: at 2 blocks it needs the history's 2 df
    base, cand = Trials((10.1, 9.5), (0, 2), (0, 1)), Trials((40.2, 39.3), (1, 3), (0, 1))
    looks = tuple(range(2, 13))
    with_history = evaluate([a], {a.id: (base, cand)}, alpha=0.01, looks=looks, priors={a.id: known})[0]
    alone = evaluate([a], {a.id: (base, cand)}, alpha=0.01, looks=looks)[0]
    assert with_history.outcome == "pass" and alone.outcome == "inconclusive"
    assert with_history.history_used and with_history.history_runs == known.runs
    assert with_history.history_df == known.df and with_history.history_sd == pytest.approx(known.sd)
    assert "earlier starts" in with_history.reason and "agrees" in with_history.reason
    figures = with_history.as_dict()
    assert figures["history_runs"] == list(known.runs) and figures["history_used"] is True
    assert math.isnan(alone.history_sd) and not alone.history_used


def test_the_reason_gives_the_historys_sd_in_the_unit_of_the_rest() -> None:
    """The reason gave the history's SD in raw ns (`sd 1.437e+08 of a block difference`) beside figures in s."""
    known = prior([EarlierRun(r.run_id, tuple(1e8 * v for v in r.values))
                   for r in _runs(np.random.default_rng(6), [1.0] * 6)])
    assert known is not None
    a = Assertion("readiness_wait_ns", "R", "gain", False, min_effect=0.0, unit="ns")
    base, cand = Trials((2.22e9, 2.13e9), (0, 2), (0, 1)), Trials((1.01e9, 0.95e9), (1, 3), (0, 1))
    verdict = evaluate([a], {a.id: (base, cand)}, alpha=0.01, looks=tuple(range(2, 13)), priors={a.id: known})[0]
    assert verdict.history_used, verdict.reason
    sds = re.findall(r"\bsd ([^ ,]+(?: [a-z]+)?)", verdict.reason)
    assert len(sds) == 3 and all(sd.endswith(" s") for sd in sds), verdict.reason   # history's, run's, pooled
    assert f"sd {known.sd / 1e9:.2g}" in verdict.reason, verdict.reason


RUNS = 240    # per cell: the 99 % binomial bound of alpha 0.01 is 7 passes


@functools.cache
def _aa_looks(effect: float) -> tuple[int, ...]:
    """The design plan --history sizes for both gains `effect` SDs better: 2..10 for 2 SD, 2..5 for 3 SD."""
    return hv.designs("two-gain", effect, 0.01).history


@pytest.mark.slow
@pytest.mark.parametrize("effect", [2.0, 3.0], ids=["2..10", "2..5"])
@pytest.mark.parametrize("case", [hv.Case(1.0), hv.Case(2.0)], ids=["right SD", "2 x SD"])
def test_aa_with_a_history_stays_within_the_binomial_bound_of_alpha(case: hv.Case, effect: float) -> None:
    """With the history's SD right (or larger), the gate's A/A false-pass rate stays within the 99 %
    binomial bound of alpha in the designs plan --history sizes for 2 and 3 SD (2 blocks, then one per
    look up to 10 or 5), and the rule does use the history: the one-sided check sets it aside only for a
    run noisier than it (the two-sided check it replaced also set it aside for the calmest runs, which
    then decided alone on 1 to 3 df: 8 of 240 in the 2..5 design)."""
    result = hv.run_cell("two-gain", 0.0, _aa_looks(effect), alpha=0.01, case=case, runs=RUNS, seed=11)
    assert result.worst_gain <= binomial_bound(RUNS, 0.01)
    assert result.used > 0.4     # the check at 0.5 against 2 df sets aside about half of the right histories


# per alpha: (runs, the most passes allowed). At 0.01 the 99 % binomial bound of 2 x alpha (1,000 runs measure
# 1.65 x too coarsely for 20 outright; `hv.aa_table` at 4,000 runs gives the rate), at 0.05 2 x alpha outright.
# Counted with all its df and checked at 0.1 the rule passed 5.8 x alpha at 0.01 and about 12 % at 0.05.
CALM = {0.01: (1000, binomial_bound(1000, 0.02)), 0.05: (400, 40)}


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0.01, 0.05])
@pytest.mark.parametrize("case", hv.CALM, ids=["15 df", "30 df"])
def test_a_history_too_small_by_half_passes_at_most_twice_alpha_however_long(case: hv.Case, alpha: float) -> None:
    """The worst case bounded: a history whose SD is half the truth, 15 or 30 df, counts for `POOLED_DF` df
    and is set aside at `CHECK_LEVEL`, so the gate's A/A passes of a gain stay within 2 x alpha in the
    shortest design plan --history sizes (3 SD), the longer history no worse."""
    runs, most = CALM[alpha]
    looks = hv.designs("two-gain", 3.0, alpha).history
    result = hv.run_cell("two-gain", 0.0, looks, alpha=alpha, case=case, runs=runs, seed=12)
    assert result.worst_gain <= most, result


@pytest.mark.slow
def test_the_history_design_is_plan_historys_own_sizing() -> None:
    """validate runs the design `plan --history` prints: looks from 2 blocks up to the maximum
    `lab_time.history_design` sizes for the history's SD, shorter than the current-only design's."""
    cell = hv.designs("two-gain", 3.0, 0.01)
    looks, predicted = history_design(hv.truths("two-gain", 3.0), cell.current.looks, alpha=0.01, power=POWER,
                                      block_size=1, early=True)
    assert cell.history == looks and looks[0] == 2 and predicted.power >= POWER
    assert looks[-1] <= cell.current.maximum        # with the history counted as 2 df: 2..8 beside 5..8
    shorter = simulate(hv.truths("two-gain", 3.0), looks[:-1], alpha=0.01, history=True)
    assert shorter.power < POWER                    # the fewest that reach the planned power



def test_the_history_design_is_found_by_halving_the_range_not_block_by_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """A noisy gain beside fifteen sure ones: the known-SD guess sizes every assertion for the family's
    power, far above the noisy one's need (as a history's set8 was, 380 starts for 283). The search still
    returns the fewest maximum that reaches the power, with log2 of the range's simulations, not one per
    block from the guess (each is a whole design's simulation: hundreds of looks for a noisy wait)."""
    import cache_qualify.sizing.lab_time as lab_time   # the real simulation, counted where it is called
    calls: list[int] = []
    real = lab_time.simulate

    def counted(truths: list[Truth], looks: tuple[int, ...], **kw: Any) -> Simulated:
        calls.append(looks[-1])
        return real(truths, looks, **kw)

    monkeypatch.setattr(lab_time, "simulate", counted)
    noisy = [t for t in hv.truths("two-gain", 1.0) if t.kind == "gain"][0]
    truths = [noisy] + [replace(noisy, id=f"sure{k}", effect=6 * noisy.sd) for k in range(15)]
    looks, found = history_design(truths, (20, 40), alpha=0.01, power=POWER, block_size=1, early=True, runs=400)
    assert found.power >= POWER and looks[0] == 2
    assert real(truths, looks[:-1], alpha=0.01, history=True, runs=400).power < POWER   # the fewest
    distance = abs(calls[0] - looks[-1])
    assert distance >= 10, calls                                                        # a guess far off
    assert len(calls) <= math.ceil(math.log2(3 * 40 - 2)) + 2 < distance + 1, calls    # LONGEST x 40, from 2

SAVING_RUNS = 300
POWER_FLOOR = stats.binom.ppf(0.01, SAVING_RUNS, POWER) / SAVING_RUNS   # 99 % binomial tolerance of 0.9
SAVING_ERROR = 0.09       # about 3 standard errors of a saving interpolated from 300 runs per design


@pytest.mark.slow
@pytest.mark.parametrize("effect, documented", [(2.0, 0.02), (3.0, 0.01)])
def test_the_history_saves_starts_at_the_planned_power(effect: float, documented: float) -> None:
    """Both gains better by `effect` SDs, the history's SD right: the design plan --history sizes reaches
    the planned power within its binomial tolerance, and at exactly power 0.9 (each design interpolated
    with its neighbour) it runs the documented share fewer mean trials per build than the current-only
    design plan prints (docs/statistics.md, within the simulation's error; another seed than the docs')."""
    cell = hv.designs("two-gain", effect, 0.01)
    now = hv.at_planned_power("two-gain", effect, cell.current.looks, alpha=0.01, case=None, runs=SAVING_RUNS,
                              seed=41, boundary=cell.current.boundary)
    known = hv.at_planned_power("two-gain", effect, cell.history, alpha=0.01, case=hv.RIGHT, runs=SAVING_RUNS,
                                seed=43)
    assert known.outcome.power >= POWER_FLOOR
    assert now.mean is not None and known.mean is not None, (now, known)
    assert 1 - known.mean / now.mean >= documented - SAVING_ERROR


@pytest.mark.slow
def test_validate_prints_both_history_tables_in_the_plans_designs(capsys: pytest.CaptureFixture[str]) -> None:
    """`cache-qualify validate --check history history-savings` prints the A/A rows and the savings row of
    the cell asked for, each naming the designs plan and plan --history print."""
    assert main(["validate", "--runs", "4", "--alpha", "0.01", "--check", "history", "history-savings",
                 "--shape", "two-gain", "--effect", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    history = f"{_aa_looks(3.0)[0]}..{_aa_looks(3.0)[-1]}"       # 2..6 (docs/statistics.md)
    aa = [line for line in lines if line.startswith(f"| two-gain | 0.01 | 3 SD | 5..8 rho 1 / {history} |")]
    assert len(aa) == len(hv.CASES)
    saving = [line for line in lines if line.startswith("| two-gain | 0.01 | 3 SD | 5..8 rho 1 (")]
    assert len(saving) == 1 and f"| {history} (" in saving[0]
