"""Two `pytest qualify` runs started at once against the same inventory (one host group) never share a host:
with `--lock-wait 0` the second fails naming the holder; with `--lock-wait N` it waits, then completes.
"""

from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.labfaults import SimRun, check_aftermath, check_samples, failed, failures, rows, scenario_file
from tests.support.labfixtures import QualifyRun, start_qualify, write_inventory
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

RUNS = ("first", "second")


def lab(tmp_path: Path) -> SimRun:
    # two runners and one lock: lifecycle, not statistics, so the quiet lab
    return SimRun(inventory=write_inventory(tmp_path, noise="quiet"), scenario=scenario_file(tmp_path),
                  reports=tmp_path / "reports", on_hosts=tmp_path / "on-hosts")


def start_both(sim: SimRun, *extra: str) -> dict[str, subprocess.Popen[str]]:
    """Both runs started at once on the same inventory (each with its reports folder, as on two runners)."""
    return {run_id: start_qualify(sim.inventory, reports(sim, run_id), *sim.args(run_id, "--seed", "3", *extra))
            for run_id in RUNS}


def reports(sim: SimRun, run_id: str) -> Path:
    return sim.reports / f"runner-{run_id}"


def run_dir(sim: SimRun, run_id: str) -> Path:
    return reports(sim, run_id) / run_id


# a timeout, not a measure: a run waiting for the other's whole qualification, then its own, on a machine
# whose load (the suite's other worker, a real server's start) can stretch each to minutes
RUN_TIMEOUT_S = 900.0


def finish(proc: subprocess.Popen[str], sim: SimRun, run_id: str, timeout_s: float = RUN_TIMEOUT_S) -> QualifyRun:
    output, _ = proc.communicate(timeout=timeout_s)
    return QualifyRun(proc.returncode, output, reports(sim, run_id))


def first_to_end(procs: dict[str, subprocess.Popen[str]], sim: SimRun,
                 timeout_s: float = 120.0) -> tuple[str, QualifyRun]:
    run_id = wait_for(lambda: next((run_id for run_id, proc in procs.items() if proc.poll() is not None), ""),
                      timeout_s, "either run ended", every_s=0.1)
    return run_id, finish(procs[run_id], sim, run_id)


def test_second_runner_fails_naming_the_holder(tmp_path: Path) -> None:
    sim = lab(tmp_path)
    procs = start_both(sim, "--lock-wait", "0")
    try:
        loser, run = first_to_end(procs, sim)  # the loser gives up at once, the winner is still qualifying
        winner = next(r for r in RUNS if r != loser)
        assert procs[winner].poll() is None, f"both runs ended:\n{run.output}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C the winner: it stops its ranks and frees the hosts
    finish(procs[winner], sim, winner)
    assert run.returncode == 6, run.output   # a held lock: the lab's status, not a verdict
    message = failed(run, "test_all_ranks_started")
    holder = f"held by user {getpass.getuser()} on runner {socket.gethostname()} (run {winner}, pid {procs[winner].pid})"
    assert "host gb10-a" in message and holder in message and " since 20" in message, message
    assert "gave up at once (no wait was allowed: --lock-wait SECONDS waits for it)" in message
    for test in failures(run):
        assert test.startswith("test_") and "preflight" not in test
    # the loser never started a rank
    assert [t for t in rows(run_dir(sim, loser) / "trials.csv")] == []
    assert not list((run_dir(sim, loser) / "logs").iterdir())
    check_aftermath(sim)


def test_second_runner_waits_for_the_first(tmp_path: Path) -> None:
    sim = lab(tmp_path)
    procs = start_both(sim, "--lock-wait", str(int(RUN_TIMEOUT_S)))
    runs = {run_id: finish(proc, sim, run_id) for run_id, proc in procs.items()}
    for run in runs.values():
        assert run.returncode == 0, run.output
    trials = {run_id: rows(run_dir(sim, run_id) / "trials.csv") for run_id in RUNS}
    for run_id in RUNS:
        assert [t["outcome"] for t in trials[run_id]] == ["ok"] * 4, trials[run_id]
        check_samples(run_dir(sim, run_id), sim.hosts, faulty_done=None)
    # never the same hosts at the same time: one run's trials all end before the other's begin
    spans = sorted((min(t["started_at"] for t in ts), max(t["finished_at"] for t in ts)) for ts in trials.values())
    assert spans[0][1] < spans[1][0], spans
    check_aftermath(sim)
