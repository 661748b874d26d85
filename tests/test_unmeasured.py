"""A run that measured nothing says what happened: the lock and its holder instead of "valid
measurements", no history point; one that ended before any qualification test (--collect-only, -k
selecting none, only the preflight) prints one line and leaves no run folder."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

import pytest

from cache_qualify.lab.control import host_dir
from cache_qualify.config.inventory import load_inventory
from cache_qualify.lab.locks import Holder, HostLock
from cache_qualify.lab.transport import LocalTransport
from cache_qualify.report.plots import Points, plot_requests
from cache_qualify.report.render import render_run
from cache_qualify.report.stopped import resume_command, why_undecided
from cache_qualify.samples import runfolder
from cache_qualify.samples.records import Plan, RunOutcome, ScenarioOutcome
from cache_qualify.samples.store import OK, SampleStore, TrialRow, new_attempt
from cache_qualify.stats.outcome import run_outcome
from tests.support.labfixtures import (interrupt, inventory_port, run_qualify, sim_processes, small_scenario_option,
                                       start_qualify, wait_no_sim_processes, write_inventory)
from tests.support.waiting import wait_for


@pytest.mark.slow
def test_a_run_that_met_a_held_lock_names_it_and_is_no_history_point(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path)
    loaded = load_inventory(inventory)
    host = loaded.hosts[0]
    directory = Path(host_dir(loaded, host))
    directory.mkdir(parents=True)
    holder = Holder(user="alice", runner_host="runner-9", run_id="run-of-alice", since="2026-03-01T12:00:00Z",
                    pid=4242)
    with LocalTransport(host.name) as transport, \
            HostLock.acquire(transport, path=str(directory / "lock"), holder=holder):
        run = run_qualify(inventory, tmp_path / "reports", "--run-id", "locked")
    assert run.returncode == 6, run.output   # a held lock: the lab's status, not a verdict
    held = "the lock " + str(directory / "lock") + " is held by user alice on runner runner-9 (run run-of-alice"
    tail = run.tail()
    assert tail[0].startswith("ERROR  reread-1g: no verdict  the qualification could not run: LockHeld: "
                              f"host {host.name}: {held}"), tail
    assert "--lock-wait SECONDS waits for it" in tail[0]
    assert any(line.endswith("history.sqlite: not recorded (nothing was measured)") for line in tail), tail
    summary = (run.run_dir() / "summary.md").read_text(encoding="utf-8")
    assert f"**Nothing was measured**: the qualification could not run: LockHeld: host {host.name}: {held}" in summary
    assert "No trial ran." in summary and "valid measurements" not in summary
    assert summary.count(held) == 1 and ".;" not in summary, summary   # the cause stated once, in one sentence
    assert "**Not measured, no verdict** (exit status 6): nothing was measured (why below); this says nothing of " \
           "the candidate: once the lab is mended, rerun with " in summary
    with warnings.catch_warnings():   # drawn again with its plots: none, and no matplotlib warning
        warnings.simplefilter("error")
        summary = render_run(run.run_dir(), plots=True).read_text(encoding="utf-8")
    assert not list(run.run_dir().glob("plots/*.png")) and "None: nothing was measured." in summary, summary
    assert summary.count(held) == 1, summary
    with sqlite3.connect(tmp_path / "reports" / "history.sqlite") as db:
        tables = {name for (name,) in db.execute("select name from sqlite_master where type='table'")}
        assert "runs" not in tables or list(db.execute("select run_id from runs")) == []


@pytest.mark.slow
@pytest.mark.parametrize(("options", "why"), [
    (["--collect-only"], "--collect-only"),
    (["-k", "nomatch"], "no qualification test was selected"),
    (["-m", "qualify_preflight"], "no qualification test was selected (the preflight ran)"),
])
def test_a_run_that_ends_before_any_trial_prints_one_line_and_leaves_no_folder(
        tmp_path: Path, options: list[str], why: str) -> None:
    inventory = write_inventory(tmp_path)
    reports = tmp_path / "reports"
    run = run_qualify(inventory, reports, *options, "-v")   # -v undoes -q: pytest names the files it wrote
    assert run.returncode in (0, 5), run.output
    assert run.tail() == [f"nothing measured: {why}; no run folder kept"], run.output
    assert "generated xml file" not in run.output, run.output   # of a folder that is not kept
    assert not reports.exists() or not [p for p in reports.iterdir() if p.is_dir()], list(reports.iterdir())
    assert "could not be rendered" not in run.output and "--resume" not in run.output


def test_why_undecided_says_cancelled_then_the_scenarios_problem_then_the_runs() -> None:
    lock = "the qualification could not run: LockHeld: host h: the lock /l is held by x; gave up at once."
    scenario = ScenarioOutcome("s", "inconclusive", problems=(lock,))
    outcome = RunOutcome("inconclusive", 1, scenarios=(scenario,), errors=("test_a failed: why", lock))
    assert why_undecided(outcome) == why_undecided(outcome, "s") == lock.rstrip(".")
    assert why_undecided(RunOutcome("inconclusive", 1, errors=("test_ssh[h] failed: refused",))) == \
        "test_ssh[h] failed: refused"
    assert why_undecided(RunOutcome("inconclusive", 2, scenarios=(scenario,))) == "the run was cancelled (exit status 2)"
    assert why_undecided(RunOutcome("inconclusive", 1)) == "the run stopped before the first look"


def test_the_resume_command_is_the_first_one_continued() -> None:
    plan = Plan(run_id="r1", seed=1, command=("pytest", "qualify", "--hosts", "my lab.yaml", "--run-id", "r1",
                                              "--trials=4", "--run-id=r1"))
    assert resume_command(plan) == "pytest qualify --hosts 'my lab.yaml' --trials=4 --resume r1"


def test_a_figure_of_no_points_draws_no_legend_and_no_warning(tmp_path: Path) -> None:
    """matplotlib warns `No artists with labels found to put in legend` for a legend of nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = plot_requests(tmp_path / "r.png", title="r: per-trial values", requests=["A"],
                             points=[Points("set4", {"A": {"hit_rate": []}}), Points("two_choice", {})],
                             panels=[("hit_rate", "hit rate (%)", 100.0)])
    assert path.is_file()


def test_an_interrupted_runs_headline_says_its_trials_are_kept_only_when_it_has_some(tmp_path: Path) -> None:
    """A cancel before the first trial has nothing to keep; once a trial is done, `--resume` keeps it."""
    run_dir = tmp_path / "reports" / "r1"
    runfolder.create(run_dir, Plan(run_id="r1", seed=1, baseline="set4", candidates=("two_choice",),
                                   scenarios=("reread-1g",), command=("pytest", "qualify", "--run-id", "r1")))
    store = SampleStore(run_dir)
    store.create()   # as a run does before its first trial: headers only

    def headline() -> str:   # the run's end as the plugin records and renders it
        runfolder.write_outcome(run_dir, run_outcome(run_dir, interrupted=True))
        return render_run(run_dir).read_text(encoding="utf-8").splitlines()[2]

    assert headline() == "**Undecided**: the run was interrupted; rerun with `--resume r1`."
    store.add_trial(TrialRow(run="r1", scenario="reread-1g", build="set4", trial=0, block=0, position=0,
                             attempt=new_attempt(), outcome=OK, reason="",
                             started_at="2026-01-01T00:00:00+00:00", finished_at="2026-01-01T00:01:00+00:00"))
    assert headline() == "**Undecided**: the run was interrupted; rerun with `--resume r1` (the trials done are kept)."


@pytest.mark.slow
def test_a_run_cancelled_before_its_first_trial_claims_no_kept_trials(tmp_path: Path) -> None:
    """The real `pytest qualify` stopped by SIGINT while its first start loads the weights (600 s slept)."""
    inventory = write_inventory(tmp_path, noise="quiet", sim_flags=("--sim-sleep-scale", "1", "--sim-load-s", "600"))
    port = inventory_port(inventory)
    run_dir = tmp_path / "reports" / "early"
    proc = start_qualify(inventory, tmp_path / "reports", "--run-id", "early",
                         *small_scenario_option(tmp_path, "cancel-early"), "--trials", "2", "--max-trials", "2")
    wait_for(lambda: (run_dir / "plan.json").is_file() and sim_processes(port), 120, "the first start's ranks",
             process=proc)
    output = interrupt(proc)
    assert proc.returncode == 2, output
    assert wait_no_sim_processes(port, timeout_s=30) == [], "an emulated rank outlived the cancel"
    assert SampleStore(run_dir).trials().empty, output
    summary = (run_dir / "summary.md").read_text(encoding="utf-8")
    assert summary.splitlines()[2] == "**Undecided**: the run was interrupted; rerun with `--resume early`.", summary
    assert "the trials done are kept" not in summary, summary
