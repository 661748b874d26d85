"""The preflight runs before any lab time under pytest-xdist too.

xdist's loadgroup hands out the largest work units first (the scenarios' groups) and each worker
knows only its own test outcomes; the plugin hands out every preflight test first, records each
one's outcome in the run folder (`preflight/<session>/`), and a worker waits for all of them before
its first scenario test. Real `pytest qualify -n 2` runs on the quiet simulated lab, and the run
folder's records written and read by real processes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cache_qualify.errors import PreflightUnfinished, SamplesError
from cache_qualify.samples import runfolder
from cache_qualify.samples.runfolder import PreflightOutcome
from tests.support.labfixtures import (REPO, inventory_port, run_qualify, small_scenario_option, wait_no_sim_processes,
                                       write_inventory)
from tests.support.labfaults import PREFLIGHT_CHECKS
from tests.test_resume import rows
from tests.test_xdist import scenario_args, two_groups

SCENARIO_TESTS = ("test_all_ranks_started", "test_kv_pages", "test_no_prefix_cache_reuse", "test_trials_completed",
                  "test_counter_consistency", "test_row_cache")


def recorded(run_dir: Path) -> list[PreflightOutcome]:
    """Every preflight outcome the run recorded, from its one session (a new run has one)."""
    sessions = list((run_dir / runfolder.PREFLIGHT_DIR).iterdir())
    assert len(sessions) == 1, sessions
    return list(runfolder.read_preflight(run_dir, sessions[0].name).values())


@pytest.mark.slow
def test_a_preflight_failed_on_one_host_stops_every_worker(tmp_path: Path) -> None:
    """Two scenarios on two host groups, two workers; the port of gb10-f (second group) is taken by a
    process the suite did not start: neither worker starts a server, the check's failure is the run's
    one failure, every scenario test is skipped pointing to it, and no run folder is left."""
    inventory = two_groups(tmp_path)
    port = inventory_port(inventory)
    # gb10-f has no folder of the suite yet (a host it never ran on): no runner can hold it, so the
    # process on its port is a stranger
    assert not (tmp_path / "on-hosts" / "gb10-f").exists()
    junit = tmp_path / "junit.xml"
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.16", port))
        squatter.listen()
        run = run_qualify(inventory, tmp_path / "reports", *scenario_args(tmp_path), "-n", "2", "--junitxml", str(junit))
    assert run.returncode == 6, run.output   # a failed preflight check: the lab's status
    cases = run.testcases()
    # the lab's: an error, whose message pytest words `failed on setup with "<the failure's line>"`
    failed = {name: error.get("message", "").removeprefix('failed on setup with "').removesuffix('"')
              for name, case in cases.items() if (error := case.find("error")) is not None}
    assert not any(case.find("failure") is not None for case in cases.values()), run.output
    assert list(failed) == ["test_port_free[gb10-f]"], run.output
    assert f"port {port} on 127.0.0.16 is in use" in failed["test_port_free[gb10-f]"]
    why = ("not run: blocked by the failed preflight check qualify/test_preflight.py::test_port_free[gb10-f]; "
           "its failure says why")
    scenario_cases = [name for name in cases if name.startswith(SCENARIO_TESTS)]
    assert {name.split("[")[0] for name in scenario_cases} == set(SCENARIO_TESTS), sorted(cases)
    for name in scenario_cases:
        skipped = cases[name].find("skipped")
        assert skipped is not None and skipped.get("message") == why, (name, run.output[-3000:])
    blocked = len(list(run.junit().iter("skipped")))   # both scenarios' (a name of each may be the same)
    assert blocked >= len(scenario_cases) and f"SKIPPED [{blocked}] " in run.output, run.output[-3000:]
    # every preflight test ran (on either worker), and the run's tail says in one line what stopped it
    assert len([name for name in cases if name.startswith(PREFLIGHT_CHECKS)]) == 2 + 5 * 6, sorted(cases)
    assert run.tail() == [f"nothing measured: the preflight check test_port_free[gb10-f] failed: "
                          f"{failed['test_port_free[gb10-f]'].removeprefix('Failed: ')}; no run folder kept"], run.output
    # no lab time, nothing kept: no server started, no run folder
    assert run.run_folders() == [], run.run_folders()
    assert wait_no_sim_processes(port) == []


@pytest.mark.slow
def test_every_preflight_test_ends_before_the_first_trial_starts(tmp_path: Path) -> None:
    """A healthy lab, one scenario, two workers: the worker that qualifies the scenario starts its first
    server only after the other worker's preflight tests ended, and no port check is confused by a
    server of this run (each rank's port was free on every host)."""
    inventory = write_inventory(tmp_path, noise="quiet")
    run = run_qualify(inventory, tmp_path / "reports", *small_scenario_option(tmp_path, "small-1g"), "-n", "2")
    assert run.returncode == 0, run.output
    run_dir = run.run_dir()
    outcomes = recorded(run_dir)
    assert len(outcomes) == 2 + 5 * 3 and {o.outcome for o in outcomes} == {"passed"}, outcomes
    assert {o.name for o in outcomes} >= {f"test_port_free[gb10-{c}]" for c in "abc"}
    passed = {name for name, case in run.testcases().items() if case.find("failure") is None
              and case.find("skipped") is None and case.find("error") is None}
    assert {o.name for o in outcomes} <= passed
    trials = rows(run_dir / "trials.csv")
    assert trials, run.output
    last_preflight = max(o.finished for o in outcomes)
    first_trial = min(t["started_at"] for t in trials)
    assert last_preflight <= first_trial, (last_preflight, first_trial)
    assert wait_no_sim_processes(inventory_port(inventory)) == []


def outcome(nodeid: str, result: runfolder.PreflightResult = "passed", reason: str = "") -> PreflightOutcome:
    return PreflightOutcome(nodeid, nodeid.split("::")[-1], result, reason, 1, runfolder.now_iso("milliseconds"))


NODEIDS = [f"qualify/test_preflight.py::test_clock[gb10-{c}]" for c in "abcdefg"]


def test_the_wait_gives_up_naming_the_preflight_tests_it_waited_for(tmp_path: Path) -> None:
    for nodeid in NODEIDS[:1]:
        runfolder.write_preflight(tmp_path, "this-run", outcome(nodeid))
    runfolder.write_preflight(tmp_path, "earlier-run", outcome(NODEIDS[1]))  # a resumed run's: not this one's
    started = time.monotonic()
    with pytest.raises(PreflightUnfinished, match=r"^6 of 7 preflight tests recorded no outcome in ") as gave_up:
        runfolder.wait_preflight(tmp_path, "this-run", NODEIDS, stall_s=0.5, poll_s=0.05)
    assert 0.5 <= time.monotonic() - started < 5
    message = str(gave_up.value)
    assert message.startswith("6 of 7 preflight tests recorded no outcome in ")
    assert str(runfolder.preflight_folder(tmp_path, "this-run")) in message
    assert "none ended for 0.5 s: qualify/test_preflight.py::test_clock[gb10-b], " in message
    assert "test_clock[gb10-f] and 1 more" in message and "gb10-a" not in message


WRITER = """
import sys, time
from pathlib import Path
from cache_qualify.samples import runfolder
run_dir, session, *nodeids = sys.argv[1:]
for nodeid in nodeids:
    time.sleep(0.3)
    runfolder.write_preflight(Path(run_dir), session, runfolder.PreflightOutcome(
        nodeid, nodeid.split("::")[-1], "failed", "CommandFailed: host x: no", 7, runfolder.now_iso()))
"""


def test_the_wait_lasts_as_long_as_other_processes_record_outcomes(tmp_path: Path) -> None:
    """Another process records one outcome every 0.3 s, for longer in all than the stall limit: the
    wait ends with every outcome, in the order asked for."""
    runfolder.write_preflight(tmp_path, "s", outcome(NODEIDS[0], "skipped", "host gb10-a is unreachable"))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "s", *reversed(NODEIDS[1:])], cwd=REPO)
    try:
        got = runfolder.wait_preflight(tmp_path, "s", NODEIDS, stall_s=1.0, poll_s=0.05)
    finally:
        writer.wait(timeout=30)
    assert [o.nodeid for o in got] == NODEIDS
    assert [o.outcome for o in got] == ["skipped"] + ["failed"] * 6 and got[0].reason == "host gb10-a is unreachable"
    assert {o.pid for o in got[1:]} == {7}


def test_a_damaged_record_is_named(tmp_path: Path) -> None:
    runfolder.write_preflight(tmp_path, "s", outcome(NODEIDS[0]))
    (damaged,) = runfolder.preflight_folder(tmp_path, "s").glob("*.json")
    damaged.write_text(json.dumps({"nodeid": NODEIDS[0]}))
    with pytest.raises(SamplesError, match=f"{damaged} cannot be read .*preflight test is damaged"):
        runfolder.read_preflight(tmp_path, "s")
