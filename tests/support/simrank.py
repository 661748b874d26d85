"""One simulated rank serving completions on loopback: ``python -m cache_qualify.sim.server``, tensor
parallel size 1, on a free port, stopped (SIGTERM, then SIGKILL) when the context ends."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from cache_qualify.replaybench import ShortRequest

from tests.support.waiting import wait_for

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class SimRank:
    """A started rank: its base URL and its log."""

    url: str
    log: Path


@contextlib.contextmanager
def sim_rank(folder: Path, flags: Sequence[str] = (), *, ready_timeout_s: float = 90.0) -> Iterator[SimRank]:
    """Start one rank with `flags` (its log in `folder`), wait for its /health, stop it at the end."""
    port = free_port()
    log = folder / f"rank0-{port}.log"
    argv = [sys.executable, "-m", "cache_qualify.sim.server", "--rank", "0", "--tensor-parallel-size", "1",
            "--host", HOST, "--port", str(port), "--rank0-address", f"{HOST}:{port}", "--sim-seed", "5",
            "--sim-noise", "quiet", *flags]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://{HOST}:{port}"
    try:
        wait_for(lambda: httpx.get(url + "/health", timeout=2.0).status_code == 200, ready_timeout_s,
                 "the simulated rank ready (/health 200)", process=proc, ignoring=(httpx.TransportError,),
                 detail=log.read_text)
        yield SimRank(url, log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def short_requests(count: int, *, spacing_s: float = 0.005, prompt_tokens: int = 32, max_tokens: int = 4,
                   shared: int = 0) -> list[ShortRequest]:
    """`count` requests `spacing_s` apart, each prompt its own tokens after `shared` common ones."""
    common = tuple(range(1000, 1000 + shared))
    return [ShortRequest(i, i * spacing_s, common + tuple(range(5000 + 97 * i, 5000 + 97 * i + prompt_tokens - shared)),
                max_tokens) for i in range(count)]
