"""One scenario, one measurement: whichever processes of a run ask for it, and even if its owner dies.

The processes of one run (xdist workers) claim each scenario in the run folder: the first
qualifies it, another that asks meanwhile waits and reads the result from the run folder, and
one whose owner died takes over, resuming from the samples on disk. Real `pytest qualify` runs and
real processes on the quiet simulated lab, two host groups (so a second measurement would have a
free group to run on, and the hosts' counters would no longer add up to the combined row).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cache_qualify.config.inventory import load_inventory
from cache_qualify.errors import PlanError, RecordedError
from cache_qualify.config.options import overrides_given
from cache_qualify.qualification import Qualifier, RunOptions
from cache_qualify.session.setup import resolve_scenarios
from cache_qualify.config.profiles import resolve
from cache_qualify.report.consistency import counter_problems
from cache_qualify.samples.store import SampleStore
from tests.support.labfixtures import (REPO, inventory_port, run_qualify, small_scenario, small_scenario_option,
                                       wait_no_sim_processes, write_inventory)
from tests.support.waiting import wait_for
from tests.test_resume import rows
from tests.test_xdist import two_groups

pytestmark = pytest.mark.slow

SCENARIO = "small-1g"
TRIALS = 4  # two per build (small_scenario)


def measured_once(run_dir: Path) -> None:
    """Every (scenario, build, trial) in trials.csv once, and each request's host counters adding up to
    the combined row (two measurements on two groups would sum to twice it)."""
    counts = collections.Counter((r["scenario"], r["build"], r["trial"]) for r in rows(run_dir / "trials.csv"))
    assert len(counts) == TRIALS and set(counts.values()) == {1}, counts
    assert counter_problems(SampleStore(run_dir), SCENARIO, resolve("flare")) == []


def test_two_workers_asking_for_one_scenario_at_once_measure_it_once(tmp_path: Path) -> None:
    # `--dist each` runs every test on both workers: both ask for the scenario at the same moment
    inventory = two_groups(tmp_path)
    run = run_qualify(inventory, tmp_path / "reports", *small_scenario_option(tmp_path, SCENARIO), "-n", "2",
                      "--dist", "each")
    assert run.returncode == 0, run.output
    assert wait_no_sim_processes(inventory_port(inventory)) == []
    run_dir = run.run_dir()
    measured_once(run_dir)
    assert len(list(run_dir.glob("facts-*.json"))) == 1, "both workers claimed a host group"
    record = json.loads((run_dir / "claims" / f"{SCENARIO}.json").read_text())
    assert record["error"] is None and record["looks"] == 1
    # both workers ran every scenario test, and passed it, on the one measurement
    passed = collections.Counter(line for line in run.output.splitlines() if line.startswith("PASSED qualify/test_"))
    assert len(passed) > 5 and set(passed.values()) == {2}, run.output
    # the waiter's verdicts, rebuilt from the run folder, are the owner's figure for figure
    figures = collections.defaultdict(list)
    for case in run.junit().iter("testcase"):
        figures[case.get("name")].append(sorted((p.get("name"), p.get("value")) for p in case.iter("property")))
    verdicts = {name: both for name, both in figures.items() if any(both)}
    assert verdicts and all(len(both) == 2 and both[0] == both[1] for both in verdicts.values()), figures


def test_an_error_that_stopped_the_owner_is_read_back_not_met_again(tmp_path: Path) -> None:
    """A qualification that could not run is recorded for the run's other processes (no second
    attempt at it); a resumed run (another session) tries again."""
    inventory = load_inventory(write_inventory(tmp_path, noise="quiet"))
    scenario = str(small_scenario(tmp_path, SCENARIO, "1G"))
    # an exact test on two trials per build cannot reach this alpha: refused before any lab time
    options = RunOptions(run_id="run", run_dir=tmp_path / "run", seed=1, session="one-session")
    scenarios = resolve_scenarios([scenario], inventory, overrides_given({"alpha": 0.001, "test": "mannwhitney"}))
    with pytest.raises(PlanError, match=r"smallest possible p is") as owner:
        Qualifier(inventory, options, scenarios).result(scenario)
    with pytest.raises(RecordedError, match=r"^PlanError: .*smallest possible p is") as other:
        Qualifier(inventory, options, scenarios).result(scenario)
    assert other.value.kind == "PlanError" and str(owner.value) in str(other.value)
    assert f"process {os.getpid()}" in str(other.value)
    with pytest.raises(PlanError, match=r"smallest possible p is"):
        Qualifier(inventory, replace(options, session="resumed"), scenarios).result(scenario)


def start(inventory: Path, run_dir: Path, scenario: Path, session: str) -> subprocess.Popen[str]:
    """A process of a run asking for the scenario's result (the plugin's Qualifier, without pytest)."""
    return subprocess.Popen([sys.executable, "-m", "tests.test_claims", str(inventory), str(run_dir), str(scenario),
                             session], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def test_a_waiting_process_takes_over_when_the_owner_is_killed(tmp_path: Path) -> None:
    inventory = two_groups(tmp_path)
    scenario = small_scenario(tmp_path, SCENARIO, "1G")
    run_dir = tmp_path / "reports" / "run"
    holder = run_dir / "claims" / f"{SCENARIO}.lock.holder"
    owner = start(inventory, run_dir, scenario, "one-session")
    waiter: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: len(rows(run_dir / "trials.csv")) >= 1, 60, "the owner finished a trial", process=owner)
        assert json.loads(holder.read_text())["pid"] == owner.pid
        waiter = start(inventory, run_dir, scenario, "one-session")
        assert waiter.stdout is not None
        lines: list[str] = []
        while not any("waiting for" in line for line in lines):
            line = waiter.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        assert f"pid {owner.pid}" in lines[-1]
        finished_by_owner = {r["attempt"] for r in rows(run_dir / "trials.csv")}
        owner.kill()  # as the OOM killer would: its lock holders see it go and stop its servers
        owner.wait()
        out = "".join(lines) + waiter.communicate(timeout=120)[0]
    finally:
        for proc in (owner, waiter):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert waiter.returncode == 0, out
    assert "taking over" in out and out.count("dropping page caches") < TRIALS, out
    # the owner's finished trials were kept, not measured again; the killed one was run again
    assert finished_by_owner <= {r["attempt"] for r in rows(run_dir / "trials.csv")}
    measured_once(run_dir)
    result = json.loads(out.splitlines()[-1])
    assert result["trials"] == TRIALS and result["error"] is None
    assert json.loads(holder.with_name(f"{SCENARIO}.json").read_text())["pid"] == waiter.pid
    assert wait_no_sim_processes(inventory_port(inventory)) == []


def main() -> None:
    """`python -m tests.test_claims INVENTORY RUN_DIR SCENARIO SESSION`: ask for the scenario's result
    as a worker of that run would; print progress, then the result as one JSON line."""
    inventory, run_dir, scenario, session = sys.argv[1:5]
    options = RunOptions(run_id="run", run_dir=Path(run_dir), seed=1, session=session)
    lab = load_inventory(inventory)
    qualifier = Qualifier(lab, options, resolve_scenarios([scenario], lab, {}),
                          progress=lambda text: print(text, flush=True))
    result = qualifier.result(scenario)
    print(json.dumps({"trials": len(result.trials), "error": None if result.error is None else str(result.error)}))


if __name__ == "__main__":
    main()
