"""A real llama-server process on a free 127.0.0.x port, for tests: start, wait for ``/health``, stop.

`llama_server_binary` builds or finds the binary (`tests.support.llama_build`; a binary of
one's own is taken from ``$CACHE_QUALIFY_LLAMA_SERVER``) and FAILS the test, never skips
it, when it cannot be built; `start_llama_server` runs it with the
test's flags, its output in a log file, and raises :class:`ServerExited` (exit status
and the log's tail) when it exits before it is ready.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from cache_qualify.lab.control import free_port
from tests.support import builds_ahead, llama_build
from tests.support.waiting import NotInTime, wait_for

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
HANDLERS_SET = re.compile(r"llama_server: listening on ")
LOG_TAIL_LINES = 20
OWN_BINARY = builds_ahead.OWN_LLAMA_SERVER


class ServerExited(Exception):
    """llama-server exited before it was ready; the message has its exit status and log tail."""

    def __init__(self, message: str, *, status: int, log: str) -> None:
        super().__init__(message)
        self.status = status
        self.log = log


def llama_server_binary() -> Path:
    """The built llama-server (built now if missing); fails the calling test if it cannot be built."""
    own = os.environ.get(OWN_BINARY)
    if own:
        if not os.access(own, os.X_OK):
            pytest.fail(f"${OWN_BINARY} is {own!r}, which is not an executable file", pytrace=False)
        return Path(own)
    builds_ahead.wait(builds_ahead.LLAMA_SERVER.name)   # the session's build, if it started one
    try:
        return llama_build.ensure_built()
    except llama_build.BuildFailed as exc:
        pytest.fail(str(exc), pytrace=False)


@dataclass
class LlamaServer:
    """One llama-server process; `health` holds the ``/health`` answers seen while it started."""

    address: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    start_s: float = 0.0   # from spawning the process to the first ``/health`` 200
    health: list[tuple[int, str]] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: re.Pattern[str], timeout_s: float = 5.0) -> str:
        """The log once `pattern` is in it. llama-server writes its log from a thread of its own,
        so a line printed before ``/health`` turned 200 can reach the file a few ms after it."""
        return wait_for(lambda: self.log() if pattern.search(self.log()) else "", timeout_s,
                        f"{pattern.pattern!r} in {self.log_path}", every_s=0.002,
                        detail=lambda: f"the log ends:\n{self.log_tail()}")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def stop(self, grace_s: float = STOP_TIMEOUT_S) -> int:
        """Stop the server (SIGTERM, then SIGKILL after `grace_s`); its exit status."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def _worker_address() -> str:
    """127.0.0.x for this xdist worker, apart from the addresses other fixtures use."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return f"127.0.0.{60 + (int(worker[2:]) if worker[2:].isdigit() else 0) % 20}"


def start_llama_server(binary: Path, model: Path, log_path: Path, flags: Sequence[str] = (), *,
                       address: str | None = None, ready_timeout_s: float = READY_TIMEOUT_S
                       ) -> LlamaServer:
    """Start ``binary -m model --host address --port P *flags`` and wait till ``/health`` is 200.

    Raises :class:`ServerExited` when it exits first, `NotInTime` when it is not ready in time.
    """
    address = address or _worker_address()
    port = free_port([address])
    command = [str(binary), "-m", str(model), "--host", address, "--port", str(port), *flags]
    started = time.monotonic()
    server = start_until_healthy("llama-server", command, log_path, address, port, ready_timeout_s)
    try:
        # /health turns 200 a moment before the server installs its SIGTERM handler; it logs
        # "listening on" after it, so a stop from then on is the server's own clean exit
        server.wait_for_log(HANDLERS_SET, timeout_s=max(5.0, started + ready_timeout_s - time.monotonic()))
    except NotInTime:
        server.stop()
        raise
    server.start_s = time.monotonic() - started
    return server


def start_until_healthy(what: str, command: Sequence[str], log_path: Path, address: str, port: int,
                        ready_timeout_s: float, *, env: Mapping[str, str] | None = None,
                        new_session: bool = False) -> LlamaServer:
    """Spawn `command` (its output in `log_path`) and wait till ``/health`` on `address`:`port` is 200.

    Raises :class:`ServerExited` when it exits first, `NotInTime` (the process stopped) when it is
    not ready in time. `env`: its whole environment; `new_session`: it leads a process group of its own.
    """
    with open(log_path, "wb") as log:
        started = time.monotonic()
        process = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=None if env is None else dict(env), start_new_session=new_session)
    server = LlamaServer(address, port, process, log_path)
    with httpx.Client(base_url=server.base_url, timeout=5.0) as client:
        def healthy() -> bool:
            status = process.poll()
            if status is not None:
                raise ServerExited(f"{what} exited with status {status} before it was ready; "
                                   f"its log ends:\n{server.log_tail()}", status=status, log=server.log())
            answer = client.get("/health")   # a TransportError while it is not listening yet
            if not server.health or server.health[-1] != (answer.status_code, answer.text):
                server.health.append((answer.status_code, answer.text))
            return answer.status_code == 200

        try:
            wait_for(healthy, started + ready_timeout_s - time.monotonic(), f"{what} ready (/health 200)",
                     every_s=0.005, ignoring=(httpx.TransportError,),
                     detail=lambda: f"its log ends:\n{server.log_tail()}")
        except NotInTime:
            server.stop()
            raise
    server.start_s = time.monotonic() - started
    return server


@contextmanager
def running_llama_server(binary: Path, model: Path, log_path: Path, flags: Sequence[str] = (), *,
                         address: str | None = None, ready_timeout_s: float = READY_TIMEOUT_S
                         ) -> Iterator[LlamaServer]:
    """`start_llama_server`, stopped on the way out."""
    server = start_llama_server(binary, model, log_path, flags, address=address,
                                ready_timeout_s=ready_timeout_s)
    try:
        yield server
    finally:
        server.stop()
