"""`cache-qualify plan --history`: the recommended design's starts and lab time today, with the history's
noise, with both arms at once and with both, on a history database the suite's own writers fill; the
starts and power it prints with the history's noise checked against the gate's own decision
(`cache_qualify.stats.verdict.evaluate` with the history's priors), seeded."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from cache_qualify.cli import main
from cache_qualify.config.scenario import find_scenario, load_scenario
from cache_qualify.errors import HistoryError
from cache_qualify.history.priors import plan_history
from cache_qualify.history.store import default_url
from cache_qualify.qualification import AA_SUFFIX
from cache_qualify.sizing.design import SEARCHED_TRIALS
from cache_qualify.samples.records import BuildRecord, Plan
from cache_qualify.config.profiles import resolve
from cache_qualify.stats.scenario_assertions import assertions_for
from cache_qualify.stats.verdict import Trials, carry, decided, evaluate
from tests.support import history_sim
from tests.support.labfixtures import write_inventory

# the default scenario's asserted quantities per build: hit rates (SD 0.4 points between starts), the two
# re-reads' readiness waits (the candidate's B wait 3 x min_effect better, its A-third-read wait about 3 x)
HITS = {"set4": {"A": 0.99, "B": 0.98, "A-new-start": 0.994, "B-new-start": 0.86, "A-third-read": 0.864},
        "two_choice": {"A": 0.99, "B": 0.98, "A-new-start": 0.994, "B-new-start": 0.99, "A-third-read": 0.99}}
WAITS = {"set4": {"B-new-start": 2.1e9, "A-third-read": 0.65e9},
         "two_choice": {"B-new-start": 1.5e9, "A-third-read": 0.5e9}}
WAIT_SD = {"B-new-start": 0.2e9, "A-third-read": 0.05e9}
SECONDS = {"set4": 300.0, "two_choice": 290.0}     # a start's drop, start, requests and stop


def _start(rng: np.random.Generator, build: str, hits: dict[str, dict[str, float]]) -> history_sim.Start:
    start = {r: {"hit_rate": m + float(rng.normal(0, 0.004))} for r, m in hits[build].items()}
    for r, wait in WAITS[build].items():
        start[r]["readiness_wait_ns"] = wait + float(rng.normal(0, WAIT_SD[r]))
    start["startup"] = {"kv_pages": 41_300 + float(rng.normal(0, 30))}
    return start


def write_history(reports: Path, runs: int = 5, *, seed: int = 1, timed: bool = True,
                  hits: dict[str, dict[str, float]] | None = None) -> str:
    """`runs` runs of two_choice against set4 on the simulated lab, 4 starts per build each, imported into
    the reports folder's history; `timed`: every start records how long it took; `hits`: the builds' hit
    rates per request (`HITS` when not given)."""
    rng = np.random.default_rng(seed)
    begin = datetime(2026, 3, 2, tzinfo=timezone.utc)
    folders = []
    for i in range(runs):
        builds = {"set4": BuildRecord("set4", "baseline", ref="r4"),
                  "two_choice": BuildRecord("two_choice", "candidate", ref="r2")}
        plan = Plan(run_id=f"run{i:03d}", seed=i, lab="simulated-gb10", baseline="set4", candidates=("two_choice",),
                    scenarios=("reread-1g",), created=(begin + timedelta(days=i)).isoformat(), builds=builds)
        folders.append(history_sim.write_folder(reports, plan, {b: [_start(rng, b, hits or HITS) for _ in range(4)] for b in builds},
                                                seconds=SECONDS if timed else None))
    assert main(["history", "import", "--reports-dir", str(reports), *map(str, folders)]) == 0
    return default_url(reports)


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["plan", "--runtime", "flare", *args, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def gate(url: str, plan: dict[str, Any], looks: tuple[int, ...], *, history: bool, runs: int,
         seed: int) -> tuple[int, float]:
    """(runs in which every assertion passed, mean trials per build) of the gate's own decision, look by
    look, on block differences whose SD is the history's (the history's own estimate of it drawn afresh for each
    run, as plan simulates it), each assertion's truth as the plan sized it."""
    scenario = load_scenario(find_scenario("reread-1g"))
    wanted = [a for a in assertions_for(scenario, resolve("flare")) if a.kind != "no_excess"]
    past = plan_history(url, scenario="reread-1g", lab=None, assertions=wanted, baseline="set4",
                        candidate="two_choice", suffix=AA_SUFFIX)
    sized = {(s["metric"], s["request"]): s for s in plan["sizings"]}
    rng = np.random.default_rng(seed)
    passed, trials = 0, []
    for _ in range(runs):
        samples = {}
        for a in wanted:
            s, sd = sized[(a.metric, a.request)], past.priors[a.id].sd / math.sqrt(2)
            sign = 1.0 if a.higher_is_better else -1.0
            base = s["baseline_mean"] + sd * rng.standard_normal(looks[-1])
            cand = s["baseline_mean"] + sign * s["effect"] + sd * rng.standard_normal(looks[-1])
            samples[a.id] = (base, cand)
        # the history as the lab could have measured it: its variance drawn afresh, as plan simulates it
        priors = {i: replace(p, variance=p.variance * rng.chisquare(p.df) / p.df) for i, p in past.priors.items()}
        verdicts = None
        for k, n in enumerate(looks, start=1):
            now = {i: (Trials(tuple(b[:n]), tuple(range(n)), tuple(range(n))),
                       Trials(tuple(c[:n]), tuple(range(n)), tuple(range(n)))) for i, (b, c) in samples.items()}
            verdicts = carry(verdicts, evaluate(wanted, now, alpha=scenario.alpha, look=k, looks=looks,
                                                priors=priors if history else None))
            if decided(verdicts) or k == len(looks):
                trials.append(n)
                break
        assert verdicts is not None
        passed += all(v.outcome == "pass" for v in verdicts)
    return passed, float(np.mean(trials))


RUNS = 300


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::cache_qualify.stats.verdict.VerdictWarning")
def test_the_starts_plan_prints_with_the_history_reach_the_planned_power_in_the_gate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The design `plan --history` prints with the history's noise, run by the gate with the history's
    priors on noise of the history's SD: every assertion passes in at least the share a power of 0.9
    gives (99 % binomial), and the printed power and mean starts are the gate's within the simulation's
    error; the same for the design as today, which the history design needs fewer starts than."""
    url = write_history(tmp_path)
    plan = plan_json(capsys, "--history", url, "--scenario", "reread-1g")
    by_name = {d["name"]: d for d in plan["designs"]}
    known, now = by_name["history"], by_name["current"]
    assert known["first"] == 2 and known["maximum"] < now["maximum"]
    assert known["mean_trials"] < 0.85 * now["mean_trials"]     # 8.02 against 10.22: the history counts for 2 df
    for design, history, seed in ((known, True, 5), (now, False, 6)):
        passed, mean = gate(url, plan, tuple(design["looks"]), history=history, runs=RUNS, seed=seed)
        assert passed >= stats.binom.ppf(0.01, RUNS, 0.9), (design, passed)
        assert abs(passed / RUNS - design["power"]) <= 3 * math.sqrt(0.1 * 0.9 / RUNS) + 0.01, (design, passed)
        assert abs(mean - design["mean_trials"]) <= 0.35, (design, mean)


@pytest.mark.slow
def test_plan_prints_the_starts_and_lab_time_four_ways(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = write_history(tmp_path)
    plan = plan_json(capsys, "--history", url, "--scenario", "reread-1g")
    assert len(plan["sizings"]) == 8 and all(s["trials_per_build"] for s in plan["sizings"])
    designs = {d["name"]: d for d in plan["designs"]}
    assert list(designs) == ["current", "history", "parallel", "both"]
    assert designs["history"]["options"].endswith("--history-noise") and designs["history"]["first"] == 2
    assert designs["parallel"]["looks"] == designs["current"]["looks"] == designs["both"]["looks"]
    assert designs["both"]["mean_trials"] == designs["parallel"]["mean_trials"]
    assert "pools no history" in designs["both"]["note"]
    short, today = designs["history"]["maximum"], designs["current"]["maximum"]
    assert short < today and f"may stop inconclusive at {short}: --max-trials {today} keeps today's power" \
        in designs["history"]["note"]
    timing = plan["start_time"]
    assert timing["baseline"] == pytest.approx(300.0) and timing["candidate"] == pytest.approx(290.0)
    assert "20 recorded start(s) of set4" in timing["source"]
    for name, per_block in (("current", 590.0), ("history", 590.0), ("parallel", 300.0), ("both", 300.0)):
        d = designs[name]
        assert d["lab_time_s"]["mean"] == pytest.approx(d["mean_trials"] * per_block)
        assert d["lab_time_s"]["most"] == pytest.approx(d["maximum"] * per_block)
    assert "no inventory given (--hosts)" in plan["groups"]

    capsys.readouterr()
    assert main(["plan", "--runtime", "flare", "--history", url, "--scenario", "reread-1g"]) == 0
    text = capsys.readouterr().out
    assert "Recommended:" in text and "| history | `--trials" in text and "--history-noise` | 2.." in text
    assert "Lab time per start: the mean of 20 recorded start(s) of set4 and 20 of two_choice in 5 run(s)" in text
    assert f"| current | `{designs['current']['options']}` |" in text


@pytest.mark.slow
def test_plan_names_the_host_groups_and_an_unknown_lab_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = write_history(tmp_path / "reports", timed=False)
    one = write_inventory(tmp_path)
    plan = plan_json(capsys, "--history", url, "--scenario", "reread-1g", "--hosts", str(one))
    assert "--parallel-arms would be refused" in plan["groups"] and "default (3 hosts)" in plan["groups"]
    assert plan["start_time"] is None and all(d["lab_time_s"] is None for d in plan["designs"])
    hosts = [{"name": f"gb10-{c}", "address": f"127.0.0.{11 + i}", "rank": i % 3, "transport": "local"}
             for i, c in enumerate("abcdef")]
    groups = [{"name": "tp-1", "hosts": ["gb10-a", "gb10-b", "gb10-c"]},
              {"name": "tp-2", "hosts": ["gb10-d", "gb10-e", "gb10-f"]}]
    (tmp_path / "two").mkdir()
    two = write_inventory(tmp_path / "two", hosts=hosts, groups=groups)
    plan = plan_json(capsys, "--history", url, "--scenario", "reread-1g", "--hosts", str(two))
    assert "groups tp-1, tp-2 can run the arms side by side" in plan["groups"]
    assert main(["plan", "--runtime", "flare", "--history", url, "--scenario", "reread-1g"]) == 0
    assert "lab time per start: unknown" in capsys.readouterr().out.lower()


def test_a_gain_barely_above_its_minimum_is_sized_and_said_beyond_reach_without_simulating_its_design(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A history whose candidate clears a gain's min_effect by a hair (2.05 points against 2, SD 0.4) needs
    about 1,900 trials per build: plan prints that count and says no lab runs it, and simulates neither a
    sequential design nor the lab-time ways (in CI such a history once asked for 82,000 trials, and the
    design search for a 59 GiB array)."""
    hits = {**HITS, "two_choice": {**HITS["two_choice"], "B-new-start": 0.8803}}
    url = write_history(tmp_path, hits=hits)
    plan = plan_json(capsys, "--history", url, "--scenario", "reread-1g")
    barely = next(s for s in plan["sizings"] if (s["metric"], s["request"]) == ("hit_rate", "B-new-start"))
    assert barely["trials_per_build"] > SEARCHED_TRIALS
    assert barely["first_look_sequential"] == barely["max_trials_sequential"] == barely["trials_per_build"]
    assert f"more than a lab runs (no sequential design searched above {SEARCHED_TRIALS})" in barely["note"]
    assert plan["designs"] == [] and "more than a lab runs" in plan["note"], plan["note"]
    assert main(["plan", "--runtime", "flare", "--history", url, "--scenario", "reread-1g"]) == 0
    assert f"no design over {SEARCHED_TRIALS} is simulated" in capsys.readouterr().out


def test_plan_history_bad_input_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = write_history(tmp_path, runs=2)
    for args, expected in (
            (["--scenario", "long-prompt"], "no trials of scenario 'long-prompt'"),
            (["--scenario", "reread-1g", "--lab", "elsewhere"], "on lab 'elsewhere'"),
            (["--scenario", "reread-1g", "--baseline", "set8"], "--baseline 'set8' is not a build"),
            (["--scenario", "no-such-scenario"], "unknown scenario 'no-such-scenario'")):
        capsys.readouterr()
        assert main(["plan", "--runtime", "flare", "--history", url, *args]) == 2
        assert expected in capsys.readouterr().err, args
    assert main(["plan", "--runtime", "flare", "--history", "mysqlx://db/qualify", "--scenario",
                 "reread-1g"]) == 2
    assert "no driver for 'mysqlx'" in capsys.readouterr().err
    with pytest.raises(HistoryError, match="no ok starts of the baseline build 'set8'"):
        plan_history(url, scenario="reread-1g", lab=None, assertions=[], baseline="set8", candidate="set4",
                     suffix=AA_SUFFIX)
