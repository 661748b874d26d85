"""The simulated lab's drop command, as the lab runs it (a real process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.sim.dropcaches import DROP_FILE


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fixtures.sim.dropcaches", *args],
                          capture_output=True, text=True, timeout=60)


def test_a_permitted_drop_really_drops(tmp_path: Path) -> None:
    if not os.access(DROP_FILE, os.W_OK):
        pytest.fail(f"{DROP_FILE} is not writable here: run as root to test the real drop")
    proc = run("--state-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"dropped page caches: sync; 3 > {DROP_FILE}"
    assert not (tmp_path / "drop_caches").exists()


def test_where_dropping_is_not_permitted_a_stamp_is_the_simulated_drop(tmp_path: Path) -> None:
    blocked = str(tmp_path / "no-such-dir" / "drop_caches")
    proc = run("--state-dir", str(tmp_path / "state"), "--drop-file", blocked)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("simulated drop: sync ran; page caches not dropped for real (")
    stamp = (tmp_path / "state" / "drop_caches").read_text()
    assert "simulated drop: sync ran; real drop not possible: No such file or directory" in stamp


def test_require_real_fails_when_only_the_simulation_is_possible(tmp_path: Path) -> None:
    proc = run("--require-real", "--drop-file", str(tmp_path / "missing" / "x"))
    assert proc.returncode == 1
    assert "page caches not dropped" in proc.stderr and "--require-real asks for a real drop" in proc.stderr


def test_no_stamp_no_success(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    proc = run("--state-dir", str(not_a_dir), "--drop-file", str(tmp_path / "missing" / "x"))
    assert proc.returncode == 1
    assert "the simulated drop's stamp could not be written" in proc.stderr
