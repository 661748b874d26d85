"""A run killed mid-trial keeps what it measured, leaves no rank behind, and `--resume` completes it.

The real `pytest qualify` in a subprocess on a private simulated lab, two trials per build of the
short scenario (the study's A and A-new-start, 4,000 tokens each).
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cache_qualify.samples.store import OK, SampleStore
from tests.support.labfixtures import (REPO, inventory_port, qualify_command, run_cli, run_qualify,
                                       small_scenario_option, start_qualify, wait_no_sim_processes, write_inventory)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

RUN_ID = "interrupted"
# two trials per build leave Welch's test one degree of freedom: alpha 0.05 keeps the (irrelevant
# here) KV-pages verdict from failing by chance at the default 0.01
OPTIONS = ("--trials", "2", "--max-trials", "2", "--seed", "5", "--alpha", "0.05")
BUILDS = ("set4", "two_choice")
SCENARIO = "resume-short"
LAST_REQUEST = "A-new-start"  # the short scenario's last request: every finished trial has its samples


def rows(path: Path) -> list[dict[str, str]]:
    """Complete rows of a CSV being written (a torn last line is left out)."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    return list(csv.DictReader(line for line in lines if line.endswith("\n")))


def wait_mid_trial(proc: subprocess.Popen[str], run_dir: Path, timeout_s: float = 120.0) -> set[str]:
    """Block until one trial is finished and the next has request samples on disk; its attempts."""
    def running() -> set[str]:
        finished = {r["attempt"] for r in rows(run_dir / "trials.csv")}
        started = {r["attempt"] for r in rows(run_dir / "samples.csv")
                   if r["request"] == "A" and r["attempt"] not in finished}
        return started if finished else set()

    return wait_for(running, timeout_s, "a trial finished and the next one's request A measured", process=proc)


def interrupt_and_resume(tmp_path: Path, stop: signal.Signals) -> None:
    # two trials per build must pass: the quiet lab's waits, not a bad start's, so the test is about resuming
    inventory = write_inventory(tmp_path, noise="quiet")
    port = inventory_port(inventory)
    reports = tmp_path / "reports"
    run_dir = reports / RUN_ID
    # signals and resuming, not figures: a short trial is still cut after its A, before its A-new-start's new start
    proc = start_qualify(inventory, reports, "--run-id", RUN_ID, *small_scenario_option(tmp_path, SCENARIO),
                         *OPTIONS)
    cut = wait_mid_trial(proc, run_dir)
    if stop == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C goes to the whole foreground group
    else:
        proc.send_signal(stop)  # pytest alone (as a CI cancel does): its ranks run in their own sessions
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, output
    if stop != signal.SIGKILL:  # a cancel, not a crash: the graceful path
        assert proc.returncode == 2, output
        assert (run_dir / "summary.md").is_file() and (run_dir / "junit.xml").is_file(), output
        summary = (run_dir / "summary.md").read_text(encoding="utf-8")
        assert summary.startswith(f"# cache-qualify run `{RUN_ID}`") and "### Trials" in summary, summary
        # the cancel says how to continue: the command as typed, with --resume instead of its --run-id
        resume = f"--hosts {inventory} --reports-dir {reports}"
        assert f"Cancelled (exit status 2); continue it with `pytest qualify {resume}" in summary, summary
        assert re.search(rf"^continue with: pytest qualify {re.escape(resume)} .*--resume {RUN_ID}$", output, re.M), output
        cases = {case.get("name") for case in ET.parse(run_dir / "junit.xml").getroot().iter("testcase")}
        assert "test_reachable[gb10-a]" in cases, cases  # the tests run before the cancel are in JUnit
        assert list((tmp_path / "on-hosts").glob("*/*.pgid")) == [], "a process-group record outlived the stop"

    assert wait_no_sim_processes(port, timeout_s=30) == [], "an emulated rank outlived the killed run"
    before = SampleStore(run_dir).trials()
    assert len(before) == 1 and before["outcome"].tolist() == [OK], output
    kept = [r for r in rows(run_dir / "samples.csv") if r["attempt"] in cut]
    assert {r["request"] for r in kept} >= {"startup", "A"}, "the cut trial's samples are not on disk"
    assert {r["host"] for r in kept if r["request"] == "A"} == {"gb10-a", "gb10-b", "gb10-c", "all"}

    # a bare --resume: the run's own options (trials, builds, scenario) come back from plan.json
    resumed = run_qualify(inventory, reports, "--resume", RUN_ID)
    assert resumed.returncode == 0, resumed.output
    assert wait_no_sim_processes(port) == []
    trials = SampleStore(run_dir).trials()
    ok = trials[trials["outcome"] == OK]
    pairs = sorted(zip(ok["build"], ok["trial"]))
    assert pairs == sorted((b, t) for b in BUILDS for t in (0, 1)), trials.to_string()  # each once
    # the trial finished before the kill was not repeated; the cut one was run again, anew
    assert before["attempt"].iloc[0] in set(ok["attempt"])
    assert not cut & set(trials["attempt"])
    samples = SampleStore(run_dir).samples()
    assert set(samples["attempt"]) == set(ok["attempt"])
    assert samples.query(f"request == '{LAST_REQUEST}' and host == 'all' and metric == 'hit_rate'").shape[0] == 4


def test_ctrl_c_mid_trial_keeps_samples_and_resume_completes(tmp_path: Path) -> None:
    interrupt_and_resume(tmp_path, signal.SIGINT)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_termination_signal_mid_trial_is_a_cancel_and_resume_completes(tmp_path: Path, stop: signal.Signals) -> None:
    """A CI job cancelled (SIGTERM) or a closed terminal (SIGHUP) takes Ctrl-C's path: exit status 2,
    summary.md and junit.xml written, every rank stopped and its record removed, the locks free."""
    interrupt_and_resume(tmp_path, stop)


def test_a_cancel_while_the_plots_are_drawn_keeps_the_decision_and_the_summary(tmp_path: Path) -> None:
    """SIGTERM after the decision, while the report's PNGs are drawn: no traceback, the run's decided exit
    status (outcome.json's), summary.md written and saying the plots were being drawn, one line naming
    the command that draws them; `cache-qualify report` then draws them all."""
    inventory = write_inventory(tmp_path, noise="quiet")
    reports = tmp_path / "reports"
    run_dir = reports / RUN_ID
    command = [a for a in qualify_command(inventory, reports, "--run-id", RUN_ID,
                                          *small_scenario_option(tmp_path, SCENARIO), *OPTIONS) if a != "--no-plots"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    plots = run_dir / "plots"
    wait_for(lambda: plots.is_dir() and any(plots.glob("*.png")), 180, "the first plot drawn", every_s=0.002,
             process=proc)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    cut = len(list(plots.glob("*.png")))
    outcome = json.loads((run_dir / "outcome.json").read_text(encoding="utf-8"))
    assert proc.returncode == outcome["exit_status"] == 0 and "Traceback" not in output, output
    assert (f"cancelled while the report's plots were drawn: `cache-qualify report {run_dir}` draws them"
            in output), output
    summary = (run_dir / "summary.md").read_text(encoding="utf-8")
    assert "Being drawn when this summary was written; if they are not shown here, the run stopped" in summary
    assert "![" not in summary, summary
    redrawn = run_cli("report", str(run_dir), timeout_s=120)
    assert redrawn.returncode == 0, redrawn.stderr
    drawn = len(list(plots.glob("*.png")))
    summary = (run_dir / "summary.md").read_text(encoding="utf-8")
    assert cut < drawn and summary.count("![") == drawn and "Being drawn" not in summary, (cut, drawn)


def test_sigkill_of_pytest_mid_trial_keeps_samples_and_resume_completes(tmp_path: Path) -> None:
    interrupt_and_resume(tmp_path, signal.SIGKILL)


def test_resume_refuses_options_that_change_what_the_run_measures(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path, noise="quiet")
    reports = tmp_path / "reports"
    # a short run (a check of the lab alone keeps no folder to continue)
    first = run_qualify(inventory, reports, "--run-id", RUN_ID, *small_scenario_option(tmp_path, SCENARIO), *OPTIONS)
    assert first.returncode == 0, first.output
    # plan.json records the options by the names a user types
    path = reports / RUN_ID / "plan.json"
    plan = json.loads(path.read_text(encoding="utf-8"))
    assert plan["options"]["--trials"] == 2 and not any(k.startswith("cq_") for k in plan["options"]), plan
    again = run_qualify(inventory, reports, "--resume", RUN_ID, "--trials", "3")
    assert again.returncode == 4
    assert "--resume: the run was made with --trials 2, not 3; leave --trials out" in again.output
    # its seed and id are the run's: another would be ignored, so it is refused the same way
    for option, value, recorded in (("--seed", "6", "5"), ("--run-id", "other", repr(RUN_ID))):
        again = run_qualify(inventory, reports, "--resume", RUN_ID, option, value)
        assert again.returncode == 4, again.output
        shown = repr(int(value)) if option == "--seed" else repr(value)
        assert f"--resume: the run was made with {option} {recorded}, not {shown}; leave {option} out" in again.output
    # a plan written before, by the options' internal names, is restored the same way
    older = {"cq_" + k.lstrip("-").replace("-", "_").replace("scenario", "scenarios"): v
             for k, v in plan["options"].items()}
    path.write_text(json.dumps({**plan, "options": older}), encoding="utf-8")
    again = run_qualify(inventory, reports, "--resume", RUN_ID, "--trials", "3")
    assert again.returncode == 4
    assert "--resume: the run was made with --trials 2, not 3; leave --trials out" in again.output


def test_resume_continues_a_run_folder_written_before_plans_recorded_their_builds(tmp_path: Path) -> None:
    """A plan of version 1 (no builds, no history, no version: as runs wrote it before) is continued, and
    completed with the builds of the inventory it continues with; a plan newer than this suite is refused."""
    inventory = write_inventory(tmp_path, noise="quiet")
    reports = tmp_path / "reports"
    scenario = small_scenario_option(tmp_path, SCENARIO)
    first = run_qualify(inventory, reports, "--run-id", RUN_ID, *scenario, *OPTIONS)
    assert first.returncode == 0, first.output
    path = reports / RUN_ID / "plan.json"
    plan = json.loads(path.read_text(encoding="utf-8"))
    old = {k: v for k, v in plan.items() if k not in ("builds", "history", "version", "candidates")}
    path.write_text(json.dumps({**old, "candidate": plan["candidates"][0], "candidates": plan["candidates"]}),
                    encoding="utf-8")
    resumed = run_qualify(inventory, reports, "--resume", RUN_ID)
    assert resumed.returncode == 0, resumed.output
    upgraded = json.loads(path.read_text(encoding="utf-8"))
    assert upgraded["version"] == 2 and upgraded["builds"]["two_choice"]["flags"][:2] == ["--sim-policy", "two_choice"]
    assert {k: upgraded[k] for k in old} == old  # what the run measures is what it measured
    path.write_text(json.dumps({**upgraded, "version": 99}), encoding="utf-8")
    newer = run_qualify(inventory, reports, "--resume", RUN_ID)
    assert newer.returncode == 4
    assert (f"--resume: the run {RUN_ID} was made by a newer cache-qualify (plan version 99, this one knows 2); "
            f"continue it with that version") in newer.output


def test_resume_decides_only_what_the_run_was_started_to_decide(tmp_path: Path) -> None:
    """A run started with -k records its selection in plan.json: its looks so far tested those assertions
    only, so resuming it with another -k (none included, under xdist too) is refused in one line before
    any lab time, and before collection says a word (it printed `28 deselected` first), and with the same
    -k it decides those only."""
    inventory, reports = write_inventory(tmp_path, noise="quiet"), tmp_path / "reports"
    run_dir, chosen = reports / RUN_ID, "hit_rate-no_regression[A-new-start]"
    proc = start_qualify(inventory, reports, "--run-id", RUN_ID, "-k", "hit_rate",
                         *small_scenario_option(tmp_path, SCENARIO), *OPTIONS)
    wait_mid_trial(proc, run_dir)
    os.killpg(proc.pid, signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, output
    assert json.loads((run_dir / "plan.json").read_text(encoding="utf-8"))["selection"] == {SCENARIO: [chosen]}
    assert wait_no_sim_processes(inventory_port(inventory), timeout_s=30) == []
    kept = {name: (run_dir / name).read_bytes() for name in ("trials.csv", "samples.csv", "junit.xml")}
    for given, now in [((), "has no -k"), (("-k", "kv_pages"), "gives -k kv_pages"),
                       (("-k", "kv_pages", "-n", "2"), "gives -k kv_pages")]:
        refused = run_qualify(inventory, reports, "--resume", RUN_ID, *given)
        line = (f"ERROR: --resume: the run {RUN_ID} was started to decide {SCENARIO}'s {chosen} only, and this "
                f"command {now}; resume it as it was started, with -k hit_rate (or start a new run)")
        assert refused.returncode == 4, refused.output
        assert refused.output.split() == line.split(), refused.output   # the refusal alone: nothing collected
    assert {name: (run_dir / name).read_bytes() for name in kept} == kept
    resumed = run_qualify(inventory, reports, "--resume", RUN_ID, "-k", "hit_rate")
    assert resumed.returncode == 0, resumed.output
    assert f"{SCENARIO}: 1 assertion(s) selected ({chosen}); only these are decided" in resumed.output
    assert [v["id"] for v in json.loads((run_dir / f"verdicts-{SCENARIO}.json").read_text())] == [chosen]
    assert len(SampleStore(run_dir).trials().query(f"outcome == '{OK}'")) == 4
