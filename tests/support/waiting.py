"""The one way the suite's tests wait for something to happen: `wait_for` polls a predicate.

A test that polls by hand writes its own deadline, sleep and failure message, and each one
reads differently when it fails on a loaded machine; `wait_for` names what was awaited, how
long it waited, the predicate's last answer and, when a process was being watched, its exit
status and output. `tests/test_rules.py` keeps hand-written deadline loops out of tests/.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class NotInTime(AssertionError):
    """What was awaited did not happen in time (or the watched process ended first)."""


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str, *, every_s: float = 0.05,
             process: subprocess.Popen[Any] | None = None, detail: Callable[[], str] | None = None,
             ignoring: tuple[type[BaseException], ...] = ()) -> T:
    """Call `predicate` every `every_s` seconds until it returns a true value, and return that value.

    Raises `NotInTime` naming `what` (the awaited event, "the owner finished a trial") when
    `timeout_s` passes first, or at once when `process` (the program whose work is awaited) has
    ended; the message holds the predicate's last answer, `detail()` (a log, say) and the
    process's output, read after it is killed. Exceptions of the `ignoring` types count as "not
    yet" (a server that refuses connections while it starts); any other one propagates, so a
    predicate may assert what must never happen while waiting."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            last = predicate()
        except ignoring as exc:
            last = exc
        else:
            if last:
                return last
        ended = process is not None and process.poll() is not None
        if ended or time.monotonic() > deadline:
            raise NotInTime(_message(what, timeout_s, last, process if ended else None, process, detail))
        time.sleep(every_s)


def _message(what: str, timeout_s: float, last: object, ended: subprocess.Popen[Any] | None,
             process: subprocess.Popen[Any] | None, detail: Callable[[], str] | None) -> str:
    if ended is not None:
        head = f"waited for {what}: the process ended first (exit status {ended.returncode})"
    else:
        head = f"waited for {what}: not within {timeout_s:g} s"
    lines = [f"{head}; last answer: {last!r}"]
    if detail is not None:
        lines.append(detail())
    if process is not None and process.stdout is not None:
        if process.poll() is None:
            process.kill()   # a process still running would never close its output
        out = process.communicate()[0]
        lines.append(out.decode(errors="replace") if isinstance(out, bytes) else str(out))
    return "\n".join(lines)
