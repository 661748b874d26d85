"""Host locks over both transports: contention, waiting, a runner killed with SIGKILL,
on_release, and a holder that shrugs off hangups and interrupts."""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache_qualify.errors import LockHeld, TransportError
from cache_qualify.lab import locks
from cache_qualify.lab.locks import Holder, HostLock
from cache_qualify.lab.transport import LocalTransport, SshTransport, Transport
from tests.support.waiting import wait_for
from tests.test_transport_local import live_processes_with

# a runner in its own process: takes the lock, says so, then sleeps until killed
RUNNER = """
import json, sys, time
from cache_qualify.lab.locks import Holder, HostLock
from cache_qualify.lab.transport import LocalTransport, SshOptions, SshTransport
spec = json.loads(sys.argv[1])
if spec["kind"] == "local":
    transport = LocalTransport("h1")
else:
    options = SshOptions(**{**spec["options"], "known_hosts": tuple(spec["options"]["known_hosts"])})
    transport = SshTransport("h1", spec["address"], spec["port"], options=options)
HostLock.acquire(transport, path=spec["path"], holder=Holder.current("run-killed"),
                 on_release=spec["on_release"])
print("ACQUIRED", flush=True)
time.sleep(600)
"""


def twin(transport: Transport) -> Transport:
    """A second transport (a second runner's connection) to the same host."""
    if isinstance(transport, SshTransport):
        return SshTransport(transport.host, transport.endpoint.address, transport.endpoint.port,
                            options=transport.options)
    return LocalTransport(transport.host)


def runner_spec(transport: Transport, path: Path, on_release: str) -> str:
    spec: dict[str, object] = {"kind": "local", "path": str(path), "on_release": on_release}
    if isinstance(transport, SshTransport):
        spec.update(kind="ssh", address=transport.endpoint.address, port=transport.endpoint.port,
                    options=dataclasses.asdict(transport.options))
    return json.dumps(spec)


@pytest.fixture
def lock_path(tmp_path: Path) -> Path:
    return tmp_path / "locks" / "cache-qualify.lock"


@pytest.fixture
def other(any_transport: Transport) -> Iterator[Transport]:
    with twin(any_transport) as transport:
        yield transport


def test_second_runner_gives_up_naming_the_holder(
        any_transport: Transport, other: Transport, lock_path: Path) -> None:
    holder = Holder(user="o'brien $(id)", runner_host="runner-7", run_id="run-42",
                    since="2026-03-01T12:00:00Z", pid=4242)
    with HostLock.acquire(any_transport, path=str(lock_path), holder=holder) as lock:
        assert lock.held
        started = time.monotonic()
        with pytest.raises(LockHeld, match=re.escape(
                f"host h1: the lock {lock_path} is held by user o'brien $(id) on runner runner-7 "
                f"(run run-42, pid 4242) since 2026-03-01T12:00:00Z; gave up after waiting "
                f"0.5 s (--lock-wait 0.5).")) as info:
            HostLock.acquire(other, path=str(lock_path), holder=Holder.current("run-43"),
                             wait_s=0.5)
        assert time.monotonic() - started >= 0.5
        assert info.value.host == "h1" and "run-42" in info.value.holder
        assert str(info.value).endswith("Wait for that run to finish, or stop it if it is stuck (`ps -p 4242` on "
                                        "runner-7 shows whether it still runs).")
    assert not lock.held
    with HostLock.acquire(other, path=str(lock_path), holder=Holder.current("run-43")):
        pass  # free again once released


def test_no_wait_names_the_option_that_waits(any_transport: Transport, other: Transport, lock_path: Path) -> None:
    with HostLock.acquire(any_transport, path=str(lock_path), holder=Holder.current("run-1")):
        with pytest.raises(LockHeld, match=r"\(run run-1, pid \d+\) since [-\dT:]+Z; gave up at once \(no wait was "
                                           r"allowed: --lock-wait SECONDS waits for it\)\."):
            HostLock.acquire(other, path=str(lock_path), holder=Holder.current("run-2"))


def test_a_wait_says_whom_it_waits_for_and_how_long_it_has(
        any_transport: Transport, other: Transport, lock_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locks, "WAIT_SHOWN_EVERY_S", 0.2)
    shown: list[str] = []
    released: list[str] = []
    first = HostLock.acquire(any_transport, path=str(lock_path), holder=Holder.current("run-1"))

    def on_wait(line: str) -> None:
        shown.append(line)
        # released once the waiter has said whom it waits for, then at least three times how long it has
        # waited, the last a second or more: as long as the waiter takes to say so (a loaded host is slow
        # to), not a set time
        waited = re.search(r": (\d+) s of 20 s$", line)
        if not released and len(shown) >= 4 and waited is not None and int(waited[1]) >= 1:
            released.append(line)
            threading.Timer(0, first.release).start()

    with HostLock.acquire(other, path=str(lock_path), holder=Holder.current("run-2"), wait_s=20, on_wait=on_wait):
        pass
    who = rf"user {re.escape(getpass.getuser())} on runner \S+ \(run run-1, pid {os.getpid()}\) since \S+Z"
    assert re.fullmatch(rf"host h1: waiting up to 20 s \(--lock-wait\) for the lock held by {who}", shown[0]), shown
    still = [re.fullmatch(rf"host h1: still waiting for the lock held by {who}: (\d+) s of 20 s", line)
             for line in shown[1:]]
    assert len(still) >= 3 and all(still), shown
    assert int(still[-1].group(1)) >= 1   # type: ignore[union-attr]


def test_second_runner_waits_for_the_release(
        any_transport: Transport, other: Transport, lock_path: Path) -> None:
    first = HostLock.acquire(any_transport, path=str(lock_path), holder=Holder.current("run-1"))
    threading.Timer(0.5, first.release).start()
    started = time.monotonic()
    second = HostLock.acquire(other, path=str(lock_path), holder=Holder.current("run-2"),
                              wait_s=20)
    assert 0.4 < time.monotonic() - started < 15
    holder_file = Path(f"{lock_path}.holder")
    assert json.loads(holder_file.read_text())["run_id"] == "run-2"
    second.release()
    assert not holder_file.exists()


def test_on_release_runs_on_the_host_before_release_returns(
        any_transport: Transport, lock_path: Path, tmp_path: Path) -> None:
    marker = tmp_path / "it's released; $(touch x)"
    on_release = f"sleep 0.3; printf done > {shlex.quote(str(marker))}"
    lock = HostLock.acquire(any_transport, path=str(lock_path), holder=Holder.current("r"),
                            on_release=on_release)
    assert not marker.exists()
    lock.release()
    assert marker.read_text() == "done"
    lock.release()  # a second release is harmless


def test_sigkilled_runner_leaves_no_stale_lock_and_on_release_runs(
        any_transport: Transport, lock_path: Path, tmp_path: Path) -> None:
    marker = tmp_path / "cleaned-up"
    spec = runner_spec(any_transport, lock_path, f"touch {marker}")
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, spec], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).parent.parent)
    try:
        assert runner.stdout is not None and runner.stdout.readline() == "ACQUIRED\n"
        with pytest.raises(LockHeld, match=r"run run-killed"):
            HostLock.acquire(any_transport, path=str(lock_path), holder=Holder.current("r2"))
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        runner.stdout.close()  # type: ignore[union-attr]
    lock = HostLock.acquire(any_transport, path=str(lock_path), holder=Holder.current("r2"),
                            wait_s=20)
    assert marker.exists()  # the dead runner's on_release ran on the host
    lock.release()


def test_holder_ignores_hangups_and_interrupts(
        any_transport: Transport, other: Transport, lock_path: Path, tmp_path: Path) -> None:
    marker = tmp_path / "released"
    lock = HostLock.acquire(any_transport, path=str(lock_path), holder=Holder.current("r1"),
                            on_release=f"touch {marker}")
    holders = live_processes_with(f"flock -o -E 75 -n {lock_path}")
    assert holders
    group = os.getpgid(holders[0])
    # the holder is whole once its cat reads the channel: flock, the shells and cat
    members = wait_for(lambda: group_members(group) if any(
        name == "cat" for name in group_members(group).values()) else {}, 30, "the holder's cat started")
    signals = (signal.SIGHUP, signal.SIGINT, signal.SIGPIPE)
    for sig in signals:
        os.killpg(group, sig)
    # an ignored signal is discarded when it is sent: none is pending that could end a holder later
    for pid, name in members.items():
        assert ignored_signals(pid) >= set(signals), f"{name} (pid {pid}) does not ignore {signals}"
    assert members.items() <= group_members(group).items(), "a holder process ended on a signal"
    assert lock.held
    with pytest.raises(LockHeld, match=r"is held by .* \(run r1, pid \d+\)"):
        HostLock.acquire(other, path=str(lock_path), holder=Holder.current("r2"))
    lock.release()
    assert marker.exists()


def group_members(group: int) -> dict[int, str]:
    """The running processes of a process group: pid -> name."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            name, fields = (proc / "stat").read_text().rsplit(")", 1)
        except OSError:
            continue   # gone meanwhile
        state, _, pgrp = fields.split()[:3]
        if int(pgrp) == group and state != "Z":
            found[int(proc.name)] = name.split("(", 1)[1]
    return found


def ignored_signals(pid: int) -> set[signal.Signals]:
    """The signals process `pid` ignores (SIG_IGN), from /proc's SigIgn mask."""
    mask = int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("SigIgn:")), 16)
    return {sig for sig in signal.Signals if sig < 64 and mask >> (sig - 1) & 1}


def test_a_lock_that_cannot_be_taken_says_why(any_transport: Transport) -> None:
    with pytest.raises(TransportError, match=r"(?s)^host h1: could not take the lock "
                                             r"/proc/cq/lock: the holder process answered "
                                             r"neither LOCKED nor BUSY; it said:\n.*mkdir"):
        HostLock.acquire(any_transport, path="/proc/cq/lock", holder=Holder.current("r"))


def test_lock_path_must_be_absolute() -> None:
    with pytest.raises(ValueError, match=r"`path` must be an absolute path on the host, got "
                                         r"'locks/x'"):
        HostLock.acquire(LocalTransport("h1"), path="locks/x", holder=Holder.current("r"))
