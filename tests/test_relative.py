"""Relative effects (`cache_qualify.stats.relative`): `min_effect: 10 %` on a time or a count, decided on the
log of the per-block ratio, shown as ratios; the promises of the gate held on the ratio scale by seeded
simulations (`tests.support.relative_sim`), and a whole qualification deciding one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from cache_qualify.config.profiles import resolve
from cache_qualify.config.scenario import check_against, load_scenario
from cache_qualify.errors import PlanError, ScenarioError
from cache_qualify.gate import failure_message, junit_figures
from cache_qualify.methods.default import DEFAULT_METHOD
from cache_qualify.sizing.planning import planned_trials, render, size_from_pilot
from cache_qualify.stats import relative
from cache_qualify.stats.manytoone import Tournament
from cache_qualify.stats.scenario_assertions import assertions_for
from cache_qualify.stats.starts import FALSE_FLAG_RATE
from cache_qualify.stats.verdict import Assertion, Trials, evaluate
from cache_qualify.stats.wording import Wording
from cache_qualify.validation.simulate import binomial_bound
from tests.support import relative_sim as sim
from tests.support.labfixtures import REPO, run_qualify, write_file, write_inventory

# the llama-server run of the issue, a host-memory prompt cache: 7.08 s -> 0.12 s at each of 4 starts on a
# loaded machine (the baseline's prompt time ranging over seconds)
PROMPT = Assertion("prompt_time_ms", "re-send", "gain", False, min_effect=0.10, unit="ms", relative=True)
BASE_MS = (7080.0, 2900.0, 11200.0, 4100.0)
CAND_MS = (120.0, 45.0, 190.0, 70.0)


def _blocked(values: tuple[float, ...]) -> Trials:
    return Trials(values, blocks=tuple(range(len(values))))


def test_a_gain_in_per_cent_is_decided_on_the_log_ratio_and_shown_as_ratios() -> None:
    # the block differences in ms vary by thousands: the paired t test in ms is inconclusive at 0.01
    absolute = Assertion("prompt_time_ms", "re-send", "gain", False, min_effect=100.0, unit="ms")
    [plain] = evaluate([absolute], {absolute.id: (_blocked(BASE_MS), _blocked(CAND_MS))}, alpha=0.01)
    assert plain.outcome == "inconclusive"
    [v] = evaluate([PROMPT], {PROMPT.id: (_blocked(BASE_MS), _blocked(CAND_MS))}, alpha=0.01)
    assert v.outcome == "pass" and v.p_value < 1e-4
    ratios = np.log(np.array(CAND_MS) / np.array(BASE_MS))
    assert v.difference == pytest.approx(math.expm1(ratios.mean()))      # the ratio of geometric means
    assert v.boundary == pytest.approx(-0.10)
    assert v.ci.low < v.difference < v.ci.high < v.boundary
    assert v.baseline_mean == pytest.approx(np.mean(BASE_MS))             # means stay in the unit
    shown = f"{100 * v.difference:+.3g} % (98 % interval {100 * v.ci.low:+.3g} to {100 * v.ci.high:+.3g} %)"
    assert f"candidate / baseline - 1 {shown}" in v.reason, v.reason
    assert "the interval's upper end" in v.reason and "< -10 %" in v.reason


@pytest.mark.parametrize(("kind", "higher", "effect", "null"), [
    ("gain", False, 0.10, -math.log(0.9)), ("gain", True, 0.10, math.log(1.1)),
    ("no_regression", False, 0.05, -math.log(1.05)), ("no_regression", True, 0.05, math.log(0.95))])
def test_the_null_boundary_is_log_one_plus_or_minus_the_effect_on_the_better_side(
        kind: str, higher: bool, effect: float, null: float) -> None:
    a = Assertion("x_s", "r", kind, higher, **{"min_effect" if kind == "gain" else "margin": effect},  # type: ignore[arg-type]
                  unit="s", relative=True)
    assert relative.log_null(a) == pytest.approx(null)
    # on the boundary exactly, a large sample sits at p about 1/2; the verdict's boundary is the ratio
    rng = np.random.default_rng(5)
    base = np.exp(rng.normal(0, 0.1, 400))
    cand = base * math.exp(null if higher else -null) * np.exp(rng.normal(0, 1e-3, 400))
    [v] = evaluate([a], {a.id: (_blocked(tuple(base)), _blocked(tuple(cand)))}, alpha=0.05)
    assert v.boundary == pytest.approx(math.expm1(null if higher else -null))
    assert 0.01 < v.p_value < 0.99 and v.outcome != "pass"


def test_a_value_of_zero_leaves_a_relative_comparison_inconclusive_with_its_reason() -> None:
    base = (0.0,) + BASE_MS[1:]
    with pytest.warns(UserWarning, match="1 start\\(s\\) gave a value <= 0 ms, which has no logarithm"):
        [v] = evaluate([PROMPT], {PROMPT.id: (_blocked(base), _blocked(CAND_MS))}, alpha=0.01)
    assert v.outcome == "inconclusive" and math.isnan(v.p_value)
    assert "assert the effect in the quantity's unit instead" in v.reason


def test_a_relative_gain_of_a_time_of_100_per_cent_is_refused() -> None:
    with pytest.raises(PlanError, match="expected a min_effect below 100 %, found 100 %"):
        Assertion("x_s", "r", "gain", False, min_effect=1.0, unit="s", relative=True)


def test_the_ratio_is_worded_benchstats_way() -> None:
    assert relative.describe(-0.98412) == "-98.4 %"
    assert relative.describe(0.125) == "+12.5 %"
    assert relative.describe(0.0) == "0 %"
    assert relative.amount(0.1) == "10 %"


def test_verdicts_json_and_junit_carry_the_ratio_and_say_so() -> None:
    [v] = evaluate([PROMPT], {PROMPT.id: (_blocked(BASE_MS), _blocked(CAND_MS))}, alpha=0.01, arm="cand")
    record = v.record
    assert record.relative and record.difference == pytest.approx(v.difference)
    assert json.loads(json.dumps(v.as_dict()))["relative"] is True
    props = junit_figures(record)
    assert props["difference_unit"] == "%" and props["unit"] == "s" and props["noise_unit"] == "log"
    assert float(props["difference"]) == pytest.approx(100 * v.difference, rel=1e-5)   # type: ignore[arg-type]
    assert float(props["ci_high"]) < float(props["null_boundary"]) == pytest.approx(-10.0)  # type: ignore[arg-type]
    assert float(props["baseline_mean"]) == pytest.approx(np.mean(BASE_MS) / 1000, rel=1e-5)  # type: ignore[arg-type]
    [worse] = evaluate([PROMPT], {PROMPT.id: (_blocked(CAND_MS), _blocked(BASE_MS))}, alpha=0.01, arm="cand")
    assert "candidate / baseline - 1 +" in failure_message(PROMPT.id, "base", worse.record)


SCENARIO = """\
name: mini
description: a relative effect on a time
corpus:
  default: true
requests:
  - {name: A, start: 0, stop: 100}
  - {name: A2, start: 0, stop: 100, new_start: 1}
trials: 4
expectations:
  - {metric: readiness_wait_ns, request: A2, kind: gain, min_effect: 10 %}
  - {metric: readiness_wait_ns, request: A, kind: no_regression, margin: 5 %, relative: true}
  - {metric: kv_pages, kind: no_regression, margin: 0.02}
"""


def test_a_scenario_asks_for_a_relative_effect_on_a_time_in_per_cent(tmp_path: Path) -> None:
    scenario = load_scenario(write_file(tmp_path, SCENARIO, "mini.yaml"))
    check_against(scenario, resolve("flare"))
    gain, margin, pages, _ = assertions_for(scenario, resolve("flare"))
    assert gain.relative and margin.relative and margin.margin == 0.05
    assert gain.min_effect == pytest.approx(0.1)
    assert not pages.relative   # a bare fraction margin keeps its meaning: a share of the baseline's mean


@pytest.mark.parametrize(("old", "new", "line", "message"), [
    ("{metric: readiness_wait_ns, request: A2, kind: gain, min_effect: 10 %}",
     "{metric: hit_rate, request: A2, kind: gain, min_effect: 10 %}", 10,
     r"min_effect: hit_rate is a fraction, where '%' would be ambiguous with percentage points; write the "
     r"difference in pp \(e.g. '10 pp'\)"),
    ("margin: 5 %, relative: true}", "margin: 5 %, relative: true}\n  - {metric: hit_rate, request: A, kind: "
     "no_regression, margin: 5 %, relative: true}", 12, r"relative: hit_rate is a fraction"),
    ("min_effect: 10 %}", "min_effect: 100 %}", 10, r"min_effect: readiness_wait_ns: lower is better, so a "
     r"relative gain is a ratio below 1 - min_effect: expected a min_effect below 100 %"),
    ("min_effect: 10 %}", "min_effect: 0.2 s, relative: true}", 10,
     r"min_effect: readiness_wait_ns: a relative gain's min_effect is a share of the baseline in %, such as '10 %'"),
])
def test_a_per_cent_that_cannot_be_a_ratio_is_refused_in_one_line_with_its_line(
        tmp_path: Path, old: str, new: str, line: int, message: str) -> None:
    scenario = load_scenario(write_file(tmp_path, SCENARIO.replace(old, new, 1), "mini.yaml"))
    with pytest.raises(ScenarioError, match=rf"mini\.yaml:{line}: expectations\[\d\]\.{message}") as info:
        check_against(scenario, resolve("flare"))
    assert "\n" not in str(info.value)


def test_plan_sizes_a_relative_gain_on_the_log_scale() -> None:
    rng = np.random.default_rng(7)
    rows = [{"scenario": "s", "metric": sim.SIZED.metric, "request": sim.SIZED.request, "build": build,
             "trial": i, "value": value}
            for build, shift in (("base", 0.0), ("cand", -0.5))
            for i, value in enumerate(np.exp(rng.normal(shift, 0.3, 12)))]
    pilot = pd.DataFrame(rows)
    [s] = size_from_pilot(pilot, baseline="base", candidate="cand", alpha=0.05, power=0.9, method=DEFAULT_METHOD,
                          family_size=1, assertions=[sim.SIZED])
    logs = {b: np.log(pilot[pilot["build"] == b]["value"].to_numpy()) for b in ("base", "cand")}
    sd = math.sqrt((logs["base"].var(ddof=1) + logs["cand"].var(ddof=1)) / 2)
    assert s.relative and s.sd == pytest.approx(sd) and s.null == pytest.approx(-math.log(0.6))
    assert s.effect == pytest.approx(logs["base"].mean() - logs["cand"].mean())
    # sized as any assertion is, on the logs: the same count as an absolute one with these figures
    assert s.trials_per_build == planned_trials(s.effect - s.null, s.sd_sized, alpha=0.05, power=0.9)
    table = render([s], alpha=0.05, power=0.9, method=DEFAULT_METHOD, family_size=1)
    assert "| -40 % |" in table and " (log)" in table, table


def test_screening_decides_relative_gains_on_the_logs() -> None:
    """Several candidates against one baseline (`--screening`), looks after 4 and 8 blocks: the one 80 %
    faster passes, the one no faster does not, each verdict's figures ratios."""
    rng = np.random.default_rng(21)
    draws = {name: sim.draw(rng, 8, shift, cand_bad_rate=0.0) for name, shift in (("same", 0.0), ("fast", 1.6))}
    base = draws["same"][0]
    arms = Tournament(list(draws), [sim.GAIN], alpha=0.05, mode="screening", looks=(4, 8))
    for look, n in enumerate((4, 8), start=1):
        first = set(range(n))
        arms.look(look, {c: {sim.GAIN.id: (base.in_blocks(first), draws[c][1].in_blocks(first))}
                         for c in arms.running})
        if not arms.running:
            break
    [fast], [same] = arms.verdicts("fast"), arms.verdicts("same")
    assert fast.outcome == "pass" and fast.ci.high < fast.boundary == pytest.approx(-0.1)
    assert same.outcome != "pass" and -0.6 < same.difference < 0.6
    assert "candidate / baseline - 1" in fast.reason


# --- the promises, by seeded simulation -------------------------------------------------------------


def test_a_relative_gain_on_its_boundary_passes_at_most_alpha_quick() -> None:
    runs, alpha = 400, 0.05
    cell = sim.run(sim.GAIN, 6, sim.boundary_shift(sim.GAIN), runs, seed=11, alpha=alpha)
    assert cell.passes <= binomial_bound(runs, alpha), cell
    assert cell.rule_broken == 0 and cell.fails > 0


def test_the_sized_effect_passes_quick() -> None:
    n = sim.sized_blocks(sim.SIZED, 0.05)
    cell = sim.run(sim.SIZED, n, 1.5 * sim.boundary_shift(sim.SIZED), 100, seed=12, alpha=0.05, cand_bad_rate=0,
                   base_bad_rate=0)
    assert cell.pass_rate >= 0.8 and cell.rule_broken == 0, cell


def test_normal_starts_of_a_relative_assertion_are_set_aside_at_the_false_flag_rate_quick() -> None:
    """Flagged on the logs, where the noise by factors is normal: at most `FALSE_FLAG_RATE` of runs lose a
    normal start's block (flagged on the recorded values, 25 % of these runs did, and the sized design fell
    short of its power)."""
    runs = 200
    cell = sim.run(sim.SIZED, sim.sized_blocks(sim.SIZED, 0.05), 1.5 * sim.boundary_shift(sim.SIZED), runs,
                   seed=14, alpha=0.05, cand_bad_rate=0, base_bad_rate=0)
    assert cell.flagged <= binomial_bound(runs, FALSE_FLAG_RATE), cell


def test_bad_starts_of_the_candidate_never_buy_a_relative_pass_quick() -> None:
    cell = sim.run(sim.SIZED, 8, 1.2 * sim.boundary_shift(sim.SIZED), 200, seed=13, alpha=0.05, cand_bad_rate=0.3)
    assert cell.passes > 0 and cell.passes_not_better == 0 and cell.rule_broken == 0, cell


@pytest.mark.slow
@pytest.mark.parametrize(("alpha", "runs"), [(0.05, 4000), (0.01, 8000)])
def test_a_relative_gain_and_margin_on_their_boundaries_keep_the_level(alpha: float, runs: int) -> None:
    for a, seed in ((sim.GAIN, 41), (sim.NO_REGRESSION, 42)):
        cell = sim.run(a, 6, sim.boundary_shift(a), runs, seed=seed, alpha=alpha)
        assert cell.passes <= binomial_bound(runs, alpha) and cell.rule_broken == 0, (a.kind, cell)


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_the_design_has_its_power_at_the_sized_relative_effect(alpha: float) -> None:
    n, runs = sim.sized_blocks(sim.SIZED, alpha), 2000
    cell = sim.run(sim.SIZED, n, 1.5 * sim.boundary_shift(sim.SIZED), runs, seed=43, alpha=alpha, cand_bad_rate=0,
                   base_bad_rate=0)
    # the design's power is 0.902-0.903 (the noncentral t at these blocks); 0.89 is 1.5 standard errors of
    # 2,000 runs below 0.9 (with the flags on the recorded values, 1,769 of these runs passed at 0.05)
    assert cell.pass_rate >= 0.9 - 1.5 * math.sqrt(0.09 / runs) and cell.rule_broken == 0, cell
    assert cell.flagged <= binomial_bound(runs, FALSE_FLAG_RATE), cell


@pytest.mark.slow
def test_the_sequential_looks_keep_the_level_on_the_log_scale() -> None:
    runs, alpha = 2000, 0.05
    cell = sim.run(sim.GAIN, 8, sim.boundary_shift(sim.GAIN), runs, seed=44, alpha=alpha, looks=(4, 6, 8))
    assert cell.passes <= binomial_bound(runs, alpha) and cell.rule_broken == 0, cell


@pytest.mark.slow
def test_bad_starts_of_the_candidate_never_buy_a_relative_pass() -> None:
    cell = sim.run(sim.SIZED, 8, 1.2 * sim.boundary_shift(sim.SIZED), 4000, seed=45, alpha=0.05, cand_bad_rate=0.3)
    assert cell.passes > 0 and cell.passes_not_better == 0 and cell.rule_broken == 0, cell


@pytest.mark.slow
def test_a_qualification_decides_a_relative_gain_of_a_readiness_wait(tmp_path: Path) -> None:
    """`pytest qualify --hosts hosts.yaml --scenario <file>` on the simulated lab: the default scenario's
    requests with `min_effect: 10 %` on the re-reads' readiness waits (the candidate's are about 96 % shorter)
    and a relative margin on the first read's; decided, and every figure of them reads as a ratio."""
    inventory = write_inventory(tmp_path)
    data = yaml.safe_load((REPO / "fixtures" / "cache_qualify" / "config" / "scenarios" / "reread-1g.yaml").read_text())
    data.update(name="relative-wait", expectations=[
        {"metric": "readiness_wait_ns", "request": "B-new-start", "kind": "gain", "min_effect": "10 %"},
        {"metric": "readiness_wait_ns", "request": "A-third-read", "kind": "gain", "min_effect": "10 %"},
        {"metric": "readiness_wait_ns", "request": "A", "kind": "no_regression", "margin": "25 %", "relative": True},
        {"metric": "kv_pages", "request": "*", "kind": "no_regression", "margin": "2 %"}])
    scenario = write_file(tmp_path, yaml.safe_dump(data, sort_keys=False), "relative-wait.yaml")
    run = run_qualify(inventory, tmp_path / "reports", "--scenario", str(scenario))   # checks the reading rule
    verdicts = {v["id"]: v for v in json.loads((run.run_dir() / "verdicts.json").read_text())["scenarios"]
                ["relative-wait"]}
    gain = verdicts["readiness_wait-gain[B-new-start]"]
    assert gain["relative"] and gain["outcome"] == "pass", gain["reason"]
    assert gain["null_boundary"] == pytest.approx(-0.1) and gain["ci_high"] < -0.1
    assert "candidate / baseline - 1 -" in gain["reason"]
    assert verdicts["readiness_wait-no_regression[A]"]["null_boundary"] == pytest.approx(0.25)
    assert not verdicts["kv_pages-no_regression[startup]"]["relative"]
    summary = (run.run_dir() / "summary.md").read_text()
    assert "| `readiness_wait-gain[B-new-start]` | PASS |" in summary and "| -10.00 % |" in summary, summary
    props = {p.get("name"): p.get("value") for p in
             run.testcases()["test_row_cache[readiness_wait-gain[B-new-start]]"].iter("property")}
    assert props["relative"] == "true" and props["difference_unit"] == "%"


def test_a_reason_never_reads_an_interval_end_or_a_p_value_as_the_boundary_it_is_not() -> None:
    """A pass just past the boundary: its interval printed "-43.6 to -10 %" beside "-10.04 % < -10 %", and a
    p of 0.049996 read "p 0.05 < 0.05"."""
    wait = Assertion("wait_s", "r", "gain", False, min_effect=0.10, unit="s", relative=True)
    base = (1.131, 3.029, 1.517, 2.58, 1.216, 2.035)
    cand = (0.869, 1.465, 0.85, 2.573, 0.823, 1.896)
    [v] = evaluate([wait], {wait.id: (_blocked(base), _blocked(cand))}, alpha=0.05)
    assert v.outcome == "pass" and -0.1005 < v.ci.high < -0.1, v
    assert "(90 % interval -43.6 to -10.04 %)" in v.reason and "upper end -10.04 % < -10 %" in v.reason, v.reason
    worded = Wording(wait, -math.log(0.9)).passed(0.049996, 0.05, math.log(0.564), math.log(0.8996))
    assert "one-sided p 0.049996 < 0.05;" in worded, worded
