"""The real servers' builds, started in the background when the session starts, waited for by their tests.

On a bare machine llama-server's compile and vLLM's install take some 11 minutes before a test of
either can start. Made in line (the old test command's ``python -m tests.support.vllm_build
--and-llama-server`` step) they held back every test; here the session's controller (xdist's, or
the one process without workers) starts each missing one as soon as it knows the collection
needs it, the tests that need neither run meanwhile, and the scheduler (`BuildsFirst`) hands
out the real servers' tests the moment their build is done.

Each build is a process of its own (``python -m tests.support.builds_ahead NAME FOLDER``) that
holds ``FOLDER/NAME.lock`` (taken by the controller before it starts the process, so a test never
sees the build before its lock) till it exits, writes its exit status to ``NAME.exit`` and its
output to ``NAME.log``. A test's fixture calls `wait` first: it waits for the lock, and a build
that failed fails the test with its exit status and its log's tail (never a skip, never a
second build). A session that started no build of a name (it was built already, or the session
does not need it) leaves `wait` nothing to do: the fixture builds as before.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from tests.support import llama_build, vllm_build
from tests.support.waiting import wait_for

FOLDER_ENV = "CACHE_QUALIFY_TESTS_BUILDS"   # the session's folder of builds, inherited by its workers
OWN_LLAMA_SERVER = "CACHE_QUALIFY_LLAMA_SERVER"   # a llama-server binary of one's own: nothing to build
WAIT_S = 3600.0   # a bare two-core machine under the suite's load: the compile alone took 51 min at nice 10


@dataclass(frozen=True)
class Build:
    """One build: its name (its files' stem), the test files and xdist groups that need it."""

    name: str
    files: tuple[str, ...]
    groups: tuple[str, ...]

    def needed_by(self, nodeid: str) -> bool:
        path, _, rest = nodeid.partition("::")
        group = rest.rpartition("@")[2] if "@" in rest else None   # loadgroup's tag, `name@group`
        return path in self.files or group in self.groups

    def missing(self) -> bool:
        if self.name == "llama-server":
            return not os.environ.get(OWN_LLAMA_SERVER) and llama_build.built_binary() is None
        return vllm_build.installed_python() is None

    def done(self, config: pytest.Config) -> bool:
        process = _started(config).get(self.name)
        return process is None or process.poll() is not None


LLAMA_SERVER = Build("llama-server", files=("tests/test_llama_server.py", "tests/test_llama_qualify.py",
                                            "tests/test_llama_emulator.py", "tests/test_containers.py"),
                     groups=("llama-qualify",))
VLLM = Build("vllm", files=("tests/test_vllm_server.py", "tests/test_vllm_qualify.py",
                            "tests/test_vllm_trace_predicted.py", "tests/test_emulation.py"),
             groups=("vllm",))
BUILDS = (LLAMA_SERVER, VLLM)
_STARTED = pytest.StashKey[dict[str, "subprocess.Popen[bytes]"]]()
_SUMMARY = pytest.StashKey[list[str]]()
_REPO = Path(__file__).resolve().parents[2]   # where `python -m tests.support...` finds the module


def _started(config: pytest.Config) -> dict[str, subprocess.Popen[bytes]]:
    return config.stash.setdefault(_STARTED, {})


def name_the_folder() -> None:
    """The controller, before its workers start: a fresh folder for this session's builds, named in the
    environment the workers inherit (never an older session's, whose files would be taken for its own)."""
    os.environ[FOLDER_ENV] = tempfile.mkdtemp(prefix="cache-qualify-builds-")


def start_needed(config: pytest.Config, nodeids: Iterable[str]) -> None:
    """Start each build that a collected test needs and that is missing, once per session."""
    folder = os.environ.get(FOLDER_ENV)
    if not folder or config.option.collectonly:
        return
    ids = list(nodeids)
    started = _started(config)
    for build in BUILDS:
        if build.name in started or not any(build.needed_by(nodeid) for nodeid in ids) or not build.missing():
            continue
        started[build.name] = start(build, Path(folder))


def start(build: Build, folder: Path) -> subprocess.Popen[bytes]:
    """Start `build` in the background, its lock taken before the process exists."""
    with open(folder / f"{build.name}.lock", "a") as lock, open(folder / f"{build.name}.log", "ab") as log:
        fcntl.flock(lock, fcntl.LOCK_EX)   # the build process holds it (an inherited descriptor) till it exits
        return subprocess.Popen([sys.executable, "-m", "tests.support.builds_ahead", build.name, str(folder)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(lock.fileno(),),
                                cwd=_REPO, start_new_session=True)


def stop(config: pytest.Config) -> None:
    """Builds still running when the session ends go with it (their own sessions: the compilers too);
    a cut build leaves nothing in the cache (each is made beside it and renamed into place whole).
    The folder goes too unless a build failed: its log is what the failed tests name. The controller's
    alone (a worker started none)."""
    if hasattr(config, "workerinput"):
        return
    processes = _started(config).values()
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    folder = os.environ.get(FOLDER_ENV, "")
    config.stash[_SUMMARY] = [f"{name}: {llama_build._tail(Path(folder) / f'{name}.log', 1).strip()}"
                              + (" (stopped when the session ended)" if (process.returncode or 0) < 0 else "")
                              for name, process in _started(config).items()]
    if folder and all(process.returncode == 0 for process in processes):
        shutil.rmtree(folder, ignore_errors=True)


def summary(config: pytest.Config) -> list[str]:
    """One line per build this session started: its name, exit status and wall time (from its log,
    read when the session ended, before its folder went)."""
    return config.stash.get(_SUMMARY, [])


def wait(name: str) -> None:
    """Before a test uses build `name`: wait for the session's build of it, if the session started one,
    and fail the test with its exit status and log's tail if it failed."""
    folder = os.environ.get(FOLDER_ENV)
    lock_path = Path(folder or ".") / f"{name}.lock"
    if not folder or not lock_path.exists():
        return
    log = lock_path.with_suffix(".log")
    with open(lock_path) as lock:
        wait_for(lambda: released(lock), WAIT_S, f"the session's {name} build (its log: {log})", every_s=1.0,
                 detail=lambda: llama_build._tail(log))
    try:
        status = lock_path.with_suffix(".exit").read_text().strip()
    except OSError:
        status = "none (it ended without writing one: stopped or crashed, its log says which)"
    if status != "0":
        pytest.fail(f"the session's {name} build (python -m tests.support.builds_ahead {name}) failed, exit "
                    f"status {status}; its log {log} ends:\n{llama_build._tail(log)}", pytrace=False)


def released(lock: IO[Any]) -> bool:
    """The build holds its lock till it exits: a shared lock taken means it has ended."""
    try:
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's loadgroup, except that the longest units go first (`LONGEST`), and while a build runs the first
    unit that needs no running build is handed out before those that do: a worker waits on a build only when
    nothing else is left. Once the build is done its tests, queued at the front (`front_of_the_queue`), go first."""
    from xdist.scheduler import LoadGroupScheduling

    class BuildsFirst(LoadGroupScheduling):  # type: ignore[misc]  # xdist ships no type hints
        def _assign_work_unit(self, node: Any) -> None:
            chosen = next_unit(self.workqueue, [build for build in BUILDS if not build.done(config)])
            if chosen is not None:
                self.workqueue.move_to_end(chosen, last=False)   # xdist pops the queue's first unit
            super()._assign_work_unit(node)

    return BuildsFirst(config, log)


# the suite's longest units (xdist's scope: a group's name, else a test's id), longest first, from clean-clone
# runs' durations: handed out before the rest, so none starts last and runs alone while the other worker idles
# (in file order the vLLM group, some 900 s on one worker, came last: 2,601 s of pytest, its last 15 minutes
# on one worker)
LONGEST = ("vllm", "tests/test_readme_commands.py::test_every_readme_command_runs_as_written", "llama-qualify",
           "wheel")


def next_unit(queue: Mapping[str, Iterable[str]], running: Sequence[Build]) -> str | None:
    """The unit to hand out next: a `LONGEST` one none of whose tests needs a build still `running`, in that
    order, else `first_ready`'s (None: the queue's first goes as it stands)."""
    waits = {scope for scope in LONGEST if scope in queue
             and any(build.needed_by(nodeid) for build in running for nodeid in queue[scope])}
    longest = next((scope for scope in LONGEST if scope in queue and scope not in waits), None)
    return longest if longest is not None else first_ready(queue, running)


def first_ready(queue: Mapping[str, Iterable[str]], running: Sequence[Build]) -> str | None:
    """The first unit of `queue` (scope: its node ids) none of whose tests needs a build still `running`
    (None: none is, or nothing runs, and the queue's first goes as it stands)."""
    if not running:
        return None
    return next((scope for scope, unit in queue.items()
                 if not any(build.needed_by(nodeid) for build in running for nodeid in unit)), None)


def main(argv: list[str]) -> int:
    """Build `name` (``llama-server`` or ``vllm``), then write its exit status beside the lock."""
    name, folder = argv
    started = time.monotonic()
    status = 1
    try:
        made = llama_build.ensure_built() if name == LLAMA_SERVER.name else vllm_build.ensure_installed()
        print(f"{made}", flush=True)
        status = 0
    except (llama_build.BuildFailed, vllm_build.InstallFailed) as exc:
        print(exc, flush=True)
    finally:
        print(f"exit {status} after {time.monotonic() - started:.0f} s", flush=True)
        (Path(folder) / f"{name}.exit").write_text(f"{status}\n")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
