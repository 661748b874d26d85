"""First contact: `pytest qualify` without an inventory says what to give, in one line, exit status 4."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.labfixtures import REPO

USAGE = ("ERROR: the qualification needs the lab's inventory: --hosts HOSTS_YAML (the simulated lab: "
         "pytest qualify --hosts hosts.yaml)")
USAGE_ERROR = 4   # pytest.ExitCode.USAGE_ERROR


def pytest_run(*args: str, cwd: Path) -> tuple[int, list[str]]:
    """A real pytest's exit status and the non-empty lines of its output (stdout and stderr)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


@pytest.mark.parametrize("args", [("qualify",), ("qualify", "-n", "2"), ("qualify/test_startup.py",)])
def test_pytest_qualify_without_hosts_prints_one_usage_line(args: tuple[str, ...]) -> None:
    status, lines = pytest_run(*args, cwd=REPO)
    assert (status, lines) == (USAGE_ERROR, [USAGE])


def test_a_bare_pytest_that_finds_the_qualification_tests_stops_the_same_way(tmp_path: Path) -> None:
    """A lab runner's folder (the qualification tests and an inventory, no pytest configuration):
    pytest finds the tests while collecting, after printing its header, and stops there with the
    same line: no collection error, no traceback."""
    shutil.copytree(REPO / "qualify", tmp_path / "qualify", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "hosts.yaml", tmp_path / "hosts.yaml")
    status, lines = pytest_run(cwd=tmp_path)
    assert status == USAGE_ERROR, lines
    assert [line for line in lines if "error" in line.lower()] == [USAGE], lines
    assert lines[-1] == USAGE and not any(".py:" in line for line in lines), lines   # no frame of a traceback


@pytest.mark.parametrize(("option", "value", "expected"), [
    ("--alpha", "2", "expected 0 < value < 0.5, found 2.0"),
    ("--trials", "-3", "expected value >= 2, found -3"),
    ("--spending-rho", "-1", "expected 0 < value <= 10, found -1.0"),
    ("--max-trials", "1", "expected value >= 2, found 1"),
])
def test_a_bad_option_is_refused_like_the_same_value_in_the_scenario_file(tmp_path: Path, option: str, value: str,
                                                                          expected: str) -> None:
    """An override is checked by the scenario's own model: one line naming the option, the value and the
    range, exit status 4, and no run folder made (nothing of the lab was touched)."""
    reports = tmp_path / "reports"
    status, lines = pytest_run("qualify", "--hosts", "hosts.yaml", "--reports-dir", str(reports), option, value,
                               cwd=REPO)
    assert (status, lines) == (USAGE_ERROR, [f"ERROR: {option}: {expected} (scenario 'reread-1g')"])
    assert not reports.exists()


def test_options_that_disagree_with_each_other_are_refused_naming_both(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    status, lines = pytest_run("qualify", "--hosts", "hosts.yaml", "--reports-dir", str(reports), "--trials", "6",
                               "--max-trials", "4", cwd=REPO)
    assert (status, lines) == (USAGE_ERROR, ["ERROR: --max-trials: expected max_trials >= trials (6), found 4 "
                                             "(scenario 'reread-1g')"])
    assert not reports.exists()


def test_an_option_that_cannot_take_effect_is_refused_in_one_line(tmp_path: Path) -> None:
    """`--history-noise` serves the paired t test only: with another test it would be ignored, so it is refused
    before any run folder is made (exit status 4, one line naming both options)."""
    from tests.support.labfixtures import write_inventory

    inventory = write_inventory(tmp_path)
    reports = tmp_path / "reports"
    status, lines = pytest_run("qualify", "--hosts", str(inventory), "--reports-dir", str(reports),
                               "--history-noise", "--test", "mannwhitney", cwd=REPO)
    assert status == USAGE_ERROR, lines
    assert lines == ["ERROR: --history-noise: the history's noise serves the paired t test only, and reread-1g "
                     "(mannwhitney) decides with another test; leave out --history-noise, or decide with --test "
                     "welch"], lines
    assert not any(p.is_dir() for p in reports.glob("*")), list(reports.glob("*"))


@pytest.mark.parametrize("selected", ["readiness_wait-gain", "readiness_wait_ns-gain"])
def test_assertions_are_named_without_the_recorded_unit_and_old_names_still_select_them(
        tmp_path: Path, selected: str) -> None:
    """The wait's values are shown in seconds, so its id names it without `_ns`; `-k` by the id earlier
    versions gave it (the recorded quantity's name) selects the same tests."""
    from tests.support.labfixtures import write_inventory

    inventory = write_inventory(tmp_path)
    status, lines = pytest_run("qualify", "--hosts", str(inventory), "--reports-dir", str(tmp_path / "reports"),
                               "--collect-only", "-q", "-k", selected, cwd=REPO)
    assert status == 0, lines
    assert [line for line in lines if "::" in line and "test_preflight.py" not in line] == [   # the preflight
        "qualify/test_cache.py::test_row_cache[readiness_wait-gain[B-new-start]]",           # runs under -k too
        "qualify/test_cache.py::test_row_cache[readiness_wait-gain[A-third-read]]"], lines
