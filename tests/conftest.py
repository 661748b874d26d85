"""Fixtures shared by the suite's own tests.

SSH: ``sshd_lab`` (one per session and xdist worker) starts real OpenSSH sshd
instances on 127.0.0.x; ``sshd_host`` is a fresh instance per test;
``ssh_transport`` an SshTransport logged in to it with strict host-key checking.
Without sshd these fixtures FAIL with an install hint: never skip.
HTTP: ``stub_servers`` starts real stub servers (`tests.support.httpfixtures`) on
127.0.0.x, stopped after the test.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cache_qualify.lab.transport import LocalTransport, Transport
from cache_qualify.session.xdist import deal_by_group, tag_xdist_groups
from tests.support import builds_ahead
from tests.support.httpfixtures import StubServer
from tests.support.waiting import NotInTime, wait_for

if TYPE_CHECKING:  # paramiko is imported only by sessions that use SSH
    from cache_qualify.lab.transport import SshTransport
    from tests.support.installed import FreshEnvironment
    from tests.support.sshd import SshdInstance, SshdLab


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """`-n N` alone makes xdist deal the tests in chunks of a quarter of the collection each, in
    collection order, and never move them again: one worker can be left with a queue of
    whole qualifications while the other has finished. `loadgroup` hands out one test (or one
    ``xdist_group``: tests that share a costly module fixture, made once) at a time as a worker
    frees up, in the order of pytest_collection_modifyitems below (its reordering by group size
    is turned off). An explicit `--dist` other than load is left alone. The plugin's `deal_by_group`
    does the switch, and tells the workers (as it does for `pytest qualify -n N`)."""
    if config.getoption("dist", "no") == "load":
        config.option.loadscopereorder = False
    deal_by_group(config)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start building the row-cache kernels ahead of time (xdist's controller, before its workers,
    or the one process without them): its parts side by side, about 12 s on two cores, while the
    workers start and collect; `pytest_runtestloop` waits for it before the first test. They go to
    the suite's cache folder (`suite_cache_folder`), where a fresh checkout (or a change of the
    kernel's sources) finds no build; left to the first ranks, every rank till it was done would import
    numba (0.3 s more CPU each) and the first ones compile the jitted kernels (5 s each): on the
    suite's two cores, with its busiest tests at the front, that cost about 60 s of CPU. A build
    that fails is noted (`cache_qualify.sim.aot`) and the ranks use the jitted kernels, as on a
    machine without a C compiler."""
    if hasattr(session.config, "workerinput"):
        return
    builds_ahead.name_the_folder()
    _write_bytecode()
    _one_blas_thread()
    _the_suites_cache_folder()
    from cache_qualify.sim import aot

    folder = aot.default_folder()
    if all(path.exists() for path in aot.module_paths(aot.stamp(), folder)) or aot.failed_note(folder) is not None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    # the build holds this lock till it exits (an inherited descriptor): whoever runs the tests
    # waits on it, whether or not it saw the build start
    with open(folder / _BUILDING, "a") as building, \
            open(folder / "rowcache_kernels.log", "ab") as log:   # where a rank's build logs too
        try:
            fcntl.flock(building, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return   # another session is building them: its build is the one waited for
        session.config.stash[KERNEL_BUILD] = subprocess.Popen(
            [sys.executable, "-m", "cache_qualify.sim.aot", "--nice", "0", "--folder", str(folder)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(building.fileno(),), start_new_session=True)


_BUILDING = "rowcache_kernels.session"   # beside the kernels; locked while this session builds them
_BUILD_WAIT_S = 600.0
KERNEL_BUILD = pytest.StashKey["subprocess.Popen[bytes]"]()   # the build this session started


@pytest.hookimpl(tryfirst=True)   # before xdist's worker loop, which runs every test
def pytest_runtestloop(session: pytest.Session) -> None:
    """Before the first test of this process (a worker, or the one process), wait for the session's
    kernel build. One that outlasts its ten minutes is left: the session goes on with the jitted
    kernels, only slower (the log says how far the build got), and stops the build when it ends.
    xdist's controller runs no test and does not wait."""
    if session.config.pluginmanager.has_plugin("dsession") or session.config.option.collectonly:
        return
    from cache_qualify.sim import aot

    path = aot.default_folder() / _BUILDING
    if not path.exists():
        return
    with open(path) as building, contextlib.suppress(NotInTime):
        wait_for(lambda: builds_ahead.released(building), _BUILD_WAIT_S, "the session's kernel build", every_s=0.1)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The one process without xdist workers: start the real servers' builds its tests need."""
    if not hasattr(session.config, "workerinput"):
        builds_ahead.start_needed(session.config, (item.nodeid for item in session.items))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist's controller, as soon as a worker has collected (before any test is handed out): start
    the real servers' builds the collection needs."""
    builds_ahead.start_needed(node.config, ids)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under loadgroup, the tests that need no running build go first while the builds run
    (`tests.support.builds_ahead.make_scheduler`)."""
    if getattr(config.option, "dist", None) != "loadgroup":
        return None
    return builds_ahead.make_scheduler(config, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A kernel build still running when the session ends is stopped with it (its own session:
    the compiling processes it started go too), and so are the real servers' builds."""
    builds_ahead.stop(session.config)
    build = session.config.stash.get(KERNEL_BUILD, None)
    if build is not None and build.poll() is None:
        os.killpg(build.pid, signal.SIGKILL)
        build.wait()


def _write_bytecode() -> None:
    """Let this session's processes write bytecode, as Python does by default. With
    PYTHONDONTWRITEBYTECODE set (as some CI images set it) every process compiles what it imports
    again, and pytest rewrites the assertions of every module of its entry-point plugins again:
    each `pytest qualify` the suite starts (about 70) spent 0.4 s of CPU rewriting the
    cache_qualify package alone. Set here, before xdist starts its workers, so they, the simulated
    ranks and every run the tests start inherit it; the caches go to ``__pycache__`` folders, which
    the checkout ignores."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def suite_cache_folder() -> Path:
    """The suite's cache folder (`cache_qualify.cachedir`): outside the checkout, so that the
    checkout stays clean, and not the user's ~/.cache, which a CI machine's tests must not fill;
    kept from one session to the next, so a session builds the kernels only when their sources
    change. Sessions of several checkouts may share it: every file in it is keyed by what it
    was made from (see cachedir)."""
    return Path(tempfile.gettempdir()) / f"cache-qualify-tests-{os.getuid()}"


def _the_suites_cache_folder() -> None:
    """Point every process of the session at the suite's cache folder (a folder the environment
    already names is kept): set before xdist starts its workers, as `_write_bytecode`, so they,
    the simulated ranks and every run the tests start use it, and so do ranks reached through the
    tests' sshd instances (`tests.support.sshd` passes it on)."""
    from cache_qualify import cachedir

    os.environ.setdefault(cachedir.ENV, str(suite_cache_folder()))
    cachedir.configure()


def _one_blas_thread() -> None:
    """One OpenBLAS thread in every process of the session. Each process that imports numpy
    otherwise starts a BLAS thread per core, and on the suite's two cores, shared by two workers,
    their ranks and runs, those threads only spin: 0.06 s of CPU per import alone, over some 800
    processes. Nothing the tests compute is a matrix product large enough to gain from them (the
    emulated ranks set the same limit for themselves). Set before xdist starts its workers, as
    `_write_bytecode`; a value the environment gives is kept."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def front_of_the_queue(item: pytest.Item) -> bool:
    """A test whose cost is a whole qualification or a shared one: scheduled before the rest, so
    the run's tail is made of short tests (the longest first, as a scheduler of two queues should)."""
    return item.get_closest_marker("slow") is not None or item.get_closest_marker("xdist_group") is not None


@pytest.hookimpl(trylast=True)  # after xdist's worker has tagged the node ids with their groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """No test is rerun unless it says why: a ``flaky`` marker (pytest-rerunfailures) without a
    ``reason`` stops the session. The costly tests go first (a stable sort: each module's order is
    kept), and each test's xdist_group is in its node id whatever the pytest (`tag_xdist_groups`),
    so a shared run is made once."""
    for item in items:
        rerun = item.get_closest_marker("flaky")
        if rerun is not None and not rerun.kwargs.get("reason"):
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.flaky needs reason=..., what makes it fail "
                                    f"now and then (a rerun is a flake to fix, not to hide)")
    items.sort(key=lambda item: not front_of_the_queue(item))
    tag_xdist_groups(config, items)


RERUN_LINES = 80   # of a rerun test's first failure shown in the summary


@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name every rerun test in the short summary (pytest-rerunfailures' "R" report), whatever `-r`
    the command line gave, and print why it failed the first time: a rerun is a flake to fix, not
    to hide."""
    if "R" not in terminalreporter.reportchars:
        terminalreporter.reportchars += "R"
    built = builds_ahead.summary(terminalreporter.config)
    if built:   # what the builds cost, beside the slowest tests' durations
        terminalreporter.section("the real servers' builds, made beside the tests")
        for line in built:
            terminalreporter.write_line(line)
    reruns = terminalreporter.stats.get("rerun", [])
    if reruns:
        terminalreporter.section("why each rerun test failed the first time")
    for report in reruns:
        crash = getattr(report.longrepr, "reprcrash", None)
        lines = (crash.message if crash is not None else str(report.longrepr)).splitlines()
        terminalreporter.write_line(f"{report.nodeid}:")
        if len(lines) > RERUN_LINES:   # the message's start and its end, where an inner run's failures are
            lines = [*lines[:10], f"... ({len(lines) - RERUN_LINES} lines left out)", *lines[10 - RERUN_LINES:]]
        for line in lines:
            terminalreporter.write_line(f"    {line}")


@pytest.fixture(autouse=True)
def _run_in_a_temporary_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs in its own temporary directory, so a command it runs (through a local shell,
    say) can never leave a file in the checkout; tests that need the repository name it (REPO)."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def stub_servers() -> Iterator[Callable[..., StubServer]]:
    """A factory of :class:`tests.support.httpfixtures.StubServer` s (``stub_servers("127.0.0.12")``), all
    stopped afterwards."""
    started: list[StubServer] = []

    def start(address: str = "127.0.0.1") -> StubServer:
        server = StubServer(address)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def sshd_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdLab]:
    """A client key and a factory of sshd instances, all stopped at the end."""
    from tests.support.sshd import SshdLab, SshdUnavailable

    try:
        lab = SshdLab(tmp_path_factory.mktemp("sshd"))
    except SshdUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    yield lab
    lab.stop_all()


@pytest.fixture
def sshd_host(sshd_lab: SshdLab) -> Iterator[SshdInstance]:
    """A fresh sshd instance for one test (free to restart or re-key)."""
    instance = sshd_lab.start()
    yield instance
    instance.stop()


@pytest.fixture
def ssh_transport(sshd_lab: SshdLab, sshd_host: SshdInstance,
                  tmp_path: Path) -> Iterator[SshTransport]:
    """An SshTransport to ``sshd_host`` whose key is in a strict known_hosts file."""
    from cache_qualify.lab.transport import SshTransport

    known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts", sshd_host)
    with SshTransport("h1", sshd_host.address, sshd_host.port,
                      options=sshd_lab.options(known_hosts)) as transport:
        yield transport


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.sshd)])
def any_transport(request: pytest.FixtureRequest) -> Iterator[Transport]:
    """The same contract test over both transports (host name "h1" in messages)."""
    if request.param == "local":
        with LocalTransport("h1", command_timeout_s=30.0) as transport:
            yield transport
    else:
        yield request.getfixturevalue("ssh_transport")


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this tree, built once per session and worker (`tests.support.installed`): the tests that
    use it share the `xdist_group("wheel")`, so one worker builds it."""
    from tests.support.installed import build_wheel

    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def installed_gate(tmp_path_factory: pytest.TempPathFactory, built_wheel: Path) -> FreshEnvironment:
    """A fresh virtual environment outside any checkout with the wheel installed by `pip install`, as a lab
    would (`tests.support.installed`), once per session and worker (`xdist_group("wheel")`)."""
    from tests.support.installed import fresh_environment

    folder = tmp_path_factory.mktemp("installed")
    venv = fresh_environment(folder)
    proc = venv.run(["pip", "install", "-q", str(built_wheel)], folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return venv
