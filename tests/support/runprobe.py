"""A pytest plugin for a qualification run the suite starts (`pytest qualify ... -p tests.support.runprobe`):
at the end it prints how many scenario files the process read and the deepest call chain from a
qualification test to a transport's command, so a test can assert both of a real run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from cache_qualify.config import scenario
from cache_qualify.lab.transport.base import Transport
from cache_qualify.lab.transport.local import LocalTransport
from cache_qualify.lab.transport.ssh import SshTransport

PREFIX = "[runprobe] "
QUALIFY = Path(__file__).resolve().parents[2] / "qualify"
_deepest: list[int] = [0]


def chain_depth(frame: FrameType | None) -> int:
    """Frames from the nearest qualification test function (counted) to `frame` (counted); 0 outside a test."""
    depth = 0
    while frame is not None:
        depth += 1
        code = frame.f_code
        if code.co_name.startswith("test_") and Path(code.co_filename).resolve().parent == QUALIFY:
            return depth
        frame = frame.f_back
    return 0


def pytest_configure(config: pytest.Config) -> None:
    for cls in {LocalTransport, SshTransport, *_subclasses(Transport)}:
        original = cls.__dict__.get("_execute")
        if original is None:
            continue

        def probed(self: Any, line: str, timeout_s: float, _original: Any = original) -> Any:
            _deepest[0] = max(_deepest[0], chain_depth(sys._getframe()))
            return _original(self, line, timeout_s)

        setattr(cls, "_execute", probed)


def pytest_unconfigure(config: pytest.Config) -> None:
    # the probe's own frame is left out: the chain ends at the transport's `_execute`
    print(PREFIX + json.dumps({"scenario_reads": dict(scenario.READS), "frames": max(_deepest[0] - 1, 0)}),
          flush=True)


def _subclasses(cls: type) -> list[type]:
    return [cls, *(s for sub in cls.__subclasses__() for s in _subclasses(sub))]


def probed(output: str) -> dict[str, Any]:
    """The probe's figures from a run's output (the last line it printed)."""
    lines = [line for line in output.splitlines() if line.startswith(PREFIX)]
    assert lines, output[-2000:]
    found: dict[str, Any] = json.loads(lines[-1].removeprefix(PREFIX))
    return found
