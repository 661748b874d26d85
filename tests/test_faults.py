"""The fault matrix: each fault, injected into the real `pytest qualify` on a private simulated lab, ends
in a verdict that names its cause (host and rank), leaves no rank running and no lock held, and keeps
every sample measured before it. Table of the rows: docs/faults.md.

Local rows run the lab through the local transport; the SSH rows log in to real sshd instances on
127.0.0.x. Ctrl-C mid-trial and SIGKILL-then-rerun are in tests/test_resume.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.support.labfaults import (STARTUP, SimRun, check_aftermath, check_samples, check_stopped_by_preflight,
                                     failed, failures, last_failed, requests_on_disk, rows, scenario_file, skipped)
from tests.support.labfixtures import REPO, QualifyRun, start_qualify, write_inventory
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from tests.support.httpfixtures import StubServer
    from tests.support.sshd import SshdInstance, SshdLab

pytestmark = pytest.mark.slow

VERDICT_TESTS = ("test_kv_pages", "test_row_cache")


def fault_build(fault: str, rank: int) -> dict[str, Any]:
    """An emulated build (set4) with one `--sim-fault` on one rank."""
    return {"path": str(REPO / "fixtures/cache_qualify/sim/server.py"),
            "flags": ["--sim-policy", "set4", "--sim-fault", fault, "--sim-fault-rank", str(rank),
                      "--host-system-share", "40"]}


# the committed fault builds fail on their first start; these two only from their 4th /metrics scrape
# on (1: KV pages after startup, 2-3: around request A, 4: before A-new-start), so A is measured first
EXTRA_BUILDS = {"metrics-500-late": fault_build("metrics-500:4", 2),
                "metrics-garbage-late": fault_build("metrics-garbage:4", 2)}


# Faults are about lifecycle and naming, not statistics: the quiet lab (no client latency slept,
# no bad starts) runs them with the same checks in less time.
def local_lab(tmp_path: Path, *, timeout_s: float = 30.0, **inventory: Any) -> SimRun:
    path = write_inventory(tmp_path, builds=EXTRA_BUILDS, noise="quiet", **inventory)
    return SimRun(inventory=path, scenario=scenario_file(tmp_path, timeout_s=timeout_s),
                  reports=tmp_path / "reports", on_hosts=tmp_path / "on-hosts")


def check_no_verdict(run: QualifyRun, said_by: str) -> None:
    """The cause is said once, by the trial check `said_by` (a test name): every verdict test is skipped
    saying the run stopped early and pointing to it, and no other test failed."""
    blocked = skipped(run)
    for test in VERDICT_TESTS:
        reasons = [why for name, why in blocked.items() if name.startswith(test)]
        assert reasons, f"{test} was not skipped:\n{run.output[-4000:]}"
        for why in reasons:
            assert "no verdict" in why and "stopped early" in why and f"{said_by}[" in why, why
    assert [name for name in failures(run) if not name.startswith(said_by)] == [], run.output[-4000:]


# --- faults of a build (local transport) --------------------------------------------------------

@dataclass(frozen=True)
class BuildFault:
    """A fault a candidate build carries, and what the run must say and keep."""

    build: str
    seed: int                     # 1: the baseline's first trial comes before the faulty one; 3: after
    failing: str                  # the test that reports the faulty trial
    names: tuple[str, ...]        # what its message must name
    outcome: str                  # the faulty trial's outcome in trials.csv
    done: tuple[str, ...]         # its requests whose samples are on disk
    timeout_s: float = 30.0       # the scenario's request timeout


BUILD_FAULTS = {
    "rank exits at startup": BuildFault(
        "rank1-exits", 3, "test_all_ranks_started",
        ("host gb10-b rank 1", "rank 1 of build 'rank1-exits' exited during startup", "exit status 1",
         "simulated startup failure"), "start_failed", (STARTUP,)),
    "rank crashes mid-sequence": BuildFault(
        "crash-request3", 1, "test_trials_completed",
        ("host gb10-b rank 1", "exited during the request sequence", "exit status 1",
         "simulated crash on request 3"), "failed", (STARTUP, "A", "A-new-start")),
    "rank 0 hangs": BuildFault(
        "hang", 3, "test_trials_completed",
        ("host gb10-a rank 0", "request 'A-new-start'", "within 2 s"), "failed", (STARTUP, "A"), timeout_s=2.0),
    "metrics answer 500": BuildFault(
        "metrics-500-late", 3, "test_trials_completed",
        ("host gb10-c rank 2", "/metrics answered HTTP 500"), "failed", (STARTUP, "A")),
    "metrics answer garbage": BuildFault(
        "metrics-garbage-late", 3, "test_trials_completed",
        ("host gb10-c rank 2", "/metrics is not valid Prometheus text"), "failed", (STARTUP, "A")),
}


@pytest.mark.parametrize("fault", BUILD_FAULTS.values(), ids=BUILD_FAULTS.keys())
def test_build_fault(tmp_path: Path, fault: BuildFault) -> None:
    lab = local_lab(tmp_path, timeout_s=fault.timeout_s)
    run = lab.qualify("--candidate", fault.build, "--seed", str(fault.seed))
    assert run.returncode == 1, run.output
    message = failed(run, fault.failing)
    for name in fault.names:
        assert name in message, f"{name!r} not in {message}"
    check_no_verdict(run, fault.failing)
    trials = rows(run.run_dir() / "trials.csv")
    assert [t["outcome"] for t in trials] == (["ok"] if fault.seed == 1 else []) + [fault.outcome], trials
    check_samples(run.run_dir(), lab.hosts, faulty_done=fault.done)
    check_aftermath(lab)


def test_a_misspelt_metric_is_said_once_with_the_name_the_server_exports(tmp_path: Path) -> None:
    """A profile entry that names a counter no rank exports (`_hitz_total`): one failed test, the trial
    check, saying the cause in full with the name the rank does export; every test it blocks skipped
    pointing to it; summary.md's first line the same cause, whole."""
    lab = local_lab(tmp_path)
    data = yaml.safe_load(lab.inventory.read_text(encoding="utf-8"))
    data["measurements"] = {"hits": {"counter": "flare_engram_row_cache_hitz_total"}}
    lab.inventory.write_text(yaml.safe_dump(data), encoding="utf-8")
    run = lab.qualify("--seed", "3")
    assert run.returncode == 6, run.output   # a metric the runtime does not serve: the lab's, not a verdict
    cause = ("host gb10-a rank 0: required metric 'flare_engram_row_cache_hitz_total' is missing from /metrics "
             "(did you mean 'flare_engram_row_cache_hits_total', which it exports?)")
    assert cause in failed(run, "test_trials_completed")
    check_no_verdict(run, "test_trials_completed")
    first = (run.run_dir() / "summary.md").read_text(encoding="utf-8").splitlines()[2]
    assert first.startswith("**Not measured, no verdict** (exit status 6): ") and cause in first, first
    check_aftermath(lab)


# --- faults of the lab (local transport) ---------------------------------------------------------

def test_sudo_asks_for_a_password(tmp_path: Path) -> None:
    """A drop through `sudo` without a NOPASSWD line: preflight and the first trial say how to fix it."""
    lab = local_lab(tmp_path, server={"drop_caches": "echo 'sudo: a password is required' >&2; exit 1"})
    run = lab.qualify_junit_outside("--seed", "3")
    for host in lab.hosts:
        message = failed(run, f"test_drop_caches[{host}]")
        assert f"host {host}" in message and "sudo: a password is required" in message, message
        assert "NOPASSWD" in message
    # preflight fails fast: the qualification spends no lab time, each failure said once
    check_stopped_by_preflight(run, *(f"test_drop_caches[{host}]" for host in lab.hosts))
    assert "(and 2 more failed); no run folder kept" in run.tail()[0]
    check_aftermath(lab)


@pytest.mark.parametrize("selection", ["-k", "--lf"])
def test_the_preflight_runs_under_k_and_lf_as_without_them(tmp_path: Path, selection: str) -> None:
    """-k choosing one assertion deselected every preflight test, and --lf with one recorded failure did
    not even collect them (its selection runs after the plugin's): the run went on to the lab and left a
    run folder; now the preflight stops it as it does without them."""
    lab = local_lab(tmp_path, server={"drop_caches": "echo 'sudo: a password is required' >&2; exit 1"})
    chosen = (("-k", "kv_pages") if selection == "-k"
              else last_failed(tmp_path, "qualify/test_startup.py::test_kv_pages[kv_pages-no_regression[startup]]"))
    run = lab.qualify_junit_outside("--seed", "3", *chosen)
    assert run.returncode == 6, run.output[-4000:]
    assert sorted(failures(run)) == [f"test_drop_caches[{host}]" for host in lab.hosts], run.output[-4000:]
    blocked = [why for name, why in skipped(run).items() if "kv_pages" in name]
    assert len(blocked) == 1 and blocked[0].startswith("not run: blocked by the failed preflight checks"), blocked
    assert run.tail() == [run.tail()[0]] and run.tail()[0].startswith("nothing measured: the preflight check "
                                                                      "test_drop_caches["), run.tail()
    assert run.tail()[0].endswith("(and 2 more failed); no run folder kept"), run.tail()
    check_aftermath(lab)


@pytest.fixture
def stale_lab(tmp_path: Path) -> Iterator[tuple[SimRun, int]]:
    """A lab whose gb10-a still runs rank 0 of an earlier run, recorded in its host folder."""
    lab = local_lab(tmp_path)
    directory = lab.on_hosts / "gb10-a"
    directory.mkdir(parents=True)
    address = "127.0.0.11"
    stale = subprocess.Popen(
        [sys.executable, "-m", "cache_qualify.sim.server", "--rank", "0", "--tensor-parallel-size", "1",
         "--rank0-address", f"{address}:{lab.port}", "--host", address, "--port", str(lab.port),
         "--embedding-table-cache-size", "64M"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    (directory / "earlier-run-rank0.pgid").write_text(f"{stale.pid}\n")
    try:
        wait_listening(address, lab.port, stale)
        yield lab, stale.pid
    finally:
        if stale.poll() is None:
            os.killpg(stale.pid, signal.SIGKILL)
        stale.wait()


def wait_listening(address: str, port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    from cache_qualify.lab.control import port_in_use

    wait_for(lambda: port_in_use(address, port), timeout_s, f"the stale server listening on {address}:{port}",
             every_s=0.1, process=proc)


def test_stale_server_holds_the_port(stale_lab: tuple[SimRun, int]) -> None:
    lab, stale = stale_lab
    run = lab.qualify_junit_outside("--seed", "3")
    preflight = failed(run, "test_port_free[gb10-a]")
    assert "host gb10-a rank 0" in preflight and f"process group {stale}" in preflight, preflight
    assert "--kill-stale" in preflight
    # preflight fails fast: no trial is started beside the stale server
    check_stopped_by_preflight(run, "test_port_free[gb10-a]")
    assert "StaleServer: host gb10-a rank 0" in run.tail()[0] and f"process group {stale}" in run.tail()[0]
    check_aftermath(lab, left=(stale,))  # the stale rank is not this run's to stop without --kill-stale
    assert os.path.exists(f"/proc/{stale}")


def test_stale_server_is_stopped_with_kill_stale(stale_lab: tuple[SimRun, int]) -> None:
    lab, stale = stale_lab
    run = lab.qualify("--seed", "3", "--kill-stale")
    assert run.returncode == 0, run.output
    assert failures(run) == {}
    assert [t["outcome"] for t in rows(run.run_dir() / "trials.csv")] == ["ok"] * 4
    check_samples(run.run_dir(), lab.hosts, faulty_done=None)
    check_aftermath(lab)  # the stale rank too


def test_reports_folder_not_writable(tmp_path: Path) -> None:
    """A --reports-dir under a regular file cannot be created, even by root: a usage error before any lab time."""
    lab = local_lab(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    reports = blocker / "reports"
    run = SimRun(lab.inventory, lab.scenario, reports, lab.on_hosts).qualify("--seed", "3")
    assert run.returncode == 4, run.output  # pytest's usage error
    assert f"cannot write the run folder {reports}/fault: Not a directory" in run.output, run.output
    assert "choose a writable --reports-dir" in run.output
    assert not (lab.on_hosts / "gb10-a" / "lock").exists()  # no host was locked, no rank started
    check_aftermath(lab)


# --- faults of SSH hosts ---------------------------------------------------------------------------

@dataclass(frozen=True)
class SshLab:
    lab: SimRun
    sshd: dict[str, SshdInstance]


def ssh_lab(tmp_path: Path, sshd_lab: SshdLab, *, known: tuple[str, ...] = ("gb10-a", "gb10-b", "gb10-c"),
            repeat_c: int = 1, elsewhere: dict[str, tuple[str, int]] | None = None) -> SshLab:
    """Three hosts behind their own sshd; `known` are the hosts whose key is in known_hosts; `elsewhere`
    names hosts whose SSH address and port the inventory gives as another server's."""
    names = ("gb10-a", "gb10-b", "gb10-c")
    instances = {name: sshd_lab.start(name) for name in names}
    known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts", *(instances[n] for n in known))
    where = {n: (i.address, i.port) for n, i in instances.items()} | (elsewhere or {})
    hosts = [{"name": n, "address": where[n][0], "port": where[n][1], "rank": r, "transport": "ssh"}
             for r, n in enumerate(names)]
    ssh = {"user": sshd_lab.user, "identity_file": str(sshd_lab.client_key), "use_agent": False,
           "known_hosts": [str(known_hosts)], "connect_timeout_s": 5, "command_timeout_s": 30}
    path = write_inventory(tmp_path, hosts=hosts, ssh=ssh, noise="quiet")
    lab = SimRun(inventory=path, scenario=scenario_file(tmp_path, repeat_c=repeat_c), reports=tmp_path / "reports",
                 on_hosts=tmp_path / "on-hosts")
    return SshLab(lab, instances)


def wait_requests(proc: subprocess.Popen[str], run_dir: Path, request: str, timeout_s: float = 120.0) -> None:
    """Block until a trial's `request` has its samples on disk (the sequence is running)."""
    wait_for(lambda: any(request in done for done in requests_on_disk(run_dir).values()), timeout_s,
             f"request {request} measured", every_s=0.02, process=proc)


def drop_connection(instance: SshdInstance) -> None:
    """Cut the runner's connection to the host (its sshd keeps listening: the host stays reachable)."""
    for pid in instance.session_pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.sshd
@pytest.mark.parametrize("host_after", ["reachable", "down"])
def test_ssh_connection_of_a_host_drops_mid_trial(tmp_path: Path, sshd_lab: SshdLab, host_after: str) -> None:
    """The dropped connection ends the lock holder on gb10-b, which stops rank 1 (it cannot tell a drop from a
    dead runner): the trial fails naming the host and how to continue, whether the host comes back or not."""
    repeats = 40   # of C: the trial lasts long enough for the drop to land in it, at A or at any C
    setup = ssh_lab(tmp_path, sshd_lab, repeat_c=repeats)
    lab = setup.lab
    proc = start_qualify(lab.inventory, lab.reports, *lab.args("fault", "--seed", "3"))
    run_dir = lab.reports / "fault"
    wait_requests(proc, run_dir, "A")
    if host_after == "down":
        setup.sshd["gb10-b"].stop()
    else:
        drop_connection(setup.sshd["gb10-b"])
    output, _ = proc.communicate(timeout=180)
    run = QualifyRun(proc.returncode, output, lab.reports)
    assert run.returncode == 6, output   # a host lost: the lab's status, not a verdict
    message = failed(run, "test_trials_completed")
    assert "host gb10-b rank 1" in message and "connection to the host dropped" in message, message
    assert "--resume fault" in message
    check_no_verdict(run, "test_trials_completed")
    assert [t["outcome"] for t in rows(run_dir / "trials.csv")] == ["failed"]
    check_samples(run_dir, lab.hosts, faulty_done=None, repeat_c=repeats)
    assert "A" in requests_on_disk(run_dir)[rows(run_dir / "trials.csv")[0]["attempt"]]
    check_aftermath(lab)


@pytest.mark.sshd
def test_host_unreachable_at_preflight(tmp_path: Path, sshd_lab: SshdLab) -> None:
    """One failure, which every test it blocks points to: not the same reason once per test."""
    setup = ssh_lab(tmp_path, sshd_lab)
    setup.sshd["gb10-c"].stop()
    run = setup.lab.qualify_junit_outside("--seed", "3")
    preflight = failed(run, "test_reachable[gb10-c]")
    address = f"{setup.sshd['gb10-c'].address}:{setup.sshd['gb10-c'].port}"
    assert "host gb10-c" in preflight and f"cannot connect to {sshd_lab.user}@{address}" in preflight, preflight
    assert "During handling" not in preflight  # the reason, not a chain of tracebacks
    check_stopped_by_preflight(run, "test_reachable[gb10-c]")
    # its failure and the tail; pytest's own short summary line (cut to the terminal's width, whole
    # where CI is set) is not counted
    told = "\n".join(line for line in run.output.splitlines() if not line.startswith(("FAILED ", "ERROR ")))
    assert told.count(f"cannot connect to {sshd_lab.user}@{address}") == 2, run.output
    check_aftermath(setup.lab)


@pytest.mark.sshd
def test_unknown_host_key(tmp_path: Path, sshd_lab: SshdLab) -> None:
    setup = ssh_lab(tmp_path, sshd_lab, known=("gb10-a", "gb10-b"))
    run = setup.lab.qualify_junit_outside("--seed", "3")
    preflight = failed(run, "test_reachable[gb10-c]")
    assert "host gb10-c: the SSH host key of" in preflight and "is unknown" in preflight, preflight
    assert "in none of the known_hosts files" in preflight and "ssh-keyscan" in preflight
    # one line for the host: its other checks are skipped, not failed alike, and so is the qualification
    host_checks = {n: why for n, why in skipped(run).items() if n.endswith("[gb10-c]") and n.startswith("test_")
                   and not n.startswith("test_reachable")}
    assert len(host_checks) == 4 and set(host_checks.values()) == {"host gb10-c is unreachable (test_reachable "
                                                                   "says why)"}, skipped(run)
    check_stopped_by_preflight(run, "test_reachable[gb10-c]")
    assert "HostKeyRejected: host gb10-c: the SSH host key" in run.tail()[0], run.tail()
    check_aftermath(setup.lab)


@pytest.mark.sshd
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "xdist"])
def test_a_port_that_is_not_ssh_is_one_line(tmp_path: Path, sshd_lab: SshdLab, stub_servers: Callable[..., StubServer],
                                            workers: tuple[str, ...]) -> None:
    """gb10-c's SSH port is a real HTTP server's: one line naming the host, the port and what answered, no
    paramiko traceback in the captured log, and the run stops at its preflight."""
    web = stub_servers("127.0.0.97")
    setup = ssh_lab(tmp_path, sshd_lab, elsewhere={"gb10-c": (web.host, web.port)})
    run = setup.lab.qualify_junit_outside("--seed", "3", *workers)
    message = failed(run, "test_reachable[gb10-c]")
    line = (f"HostUnreachable: host gb10-c: {sshd_lab.user}@{web.host}:{web.port} is not an SSH server: it said "
            "nothing within 5 s (an SSH server speaks first) and answered an SSH greeting with ")
    headline, text = message.split("\n")   # JUnit's message and its text: the one line, no traceback
    # the lab's error, as pytest words an error: `failed on setup with "<the failure's line>"`
    assert headline == f'failed on setup with "Failed: {text}"' and text == f"{line}'<!DOCTYPE HTML>'", message
    assert "Traceback" not in run.output and "paramiko" not in run.output, run.output[-4000:]
    assert "Captured log" not in run.output, run.output[-4000:]
    check_stopped_by_preflight(run, "test_reachable[gb10-c]")


def test_run_id_of_an_earlier_run_is_refused(tmp_path: Path) -> None:
    """Reusing a run folder without --resume would count the earlier run's trials as this one's."""
    lab = local_lab(tmp_path)
    first = lab.qualify("-k", "test_all_ranks_started")   # one look: a run folder (a preflight alone keeps none)
    assert first.returncode == 1 and first.run_folders(), first.output   # undecided: no verdict test selected
    again = lab.qualify("--seed", "3")
    assert again.returncode == 4, again.output
    assert f"the run folder {lab.reports / 'fault'} already holds a run; continue it with --resume fault" in again.output
    check_aftermath(lab)
