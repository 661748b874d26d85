"""First contact: `pytest qualify` without an inventory says what to give, in one line, exit status 4."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
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
    assert (status, lines) == (USAGE_ERROR, [f"ERROR: {option}: {expected}"])
    assert not reports.exists()


@pytest.mark.parametrize(("option", "value", "expected"), [
    ("--seed", "-1", "expected value >= 0, found -1"),
    ("--lock-wait", "-5", "expected value >= 0, found -5.0"),
])
def test_an_option_outside_the_scenario_is_checked_before_any_folder_or_host(
        tmp_path: Path, option: str, value: str, expected: str) -> None:
    """`--seed -1` reached numpy's ValueError after the host groups were claimed, and `--lock-wait -5` meant
    "do not wait": both are refused like a scenario's field, in one line, before the run folder is made."""
    status, lines = _qualify_in_a_copy(tmp_path, option, value)
    assert (status, lines) == (USAGE_ERROR, [f"ERROR: {option}: {expected}"])
    assert _run_folders(tmp_path) == []


@pytest.mark.parametrize(("options", "expected"), [
    (("--parallel-arms",), "ERROR: --parallel-arms runs the baseline and the candidate at once, each on a host "
     "group of its own: it needs two groups with as many hosts, and the inventory's `groups:` give default "
     "(3 hosts)"),
    (("--spending-rho", "3", "--trials", "4", "--max-trials", "4"), "ERROR: --spending-rho: shapes the alpha "
     "spent at each look of a sequential design, and every scenario decides once, at a fixed number of trials: "
     "reread-1g (4 trials per build); leave out --spending-rho, or give --max-trials above --trials"),
    (("--scenario", "reread-1g", "--scenario", "reread-1g"),   # its tests were collected twice
     "ERROR: --scenario: scenario reread-1g is named twice; each scenario runs once"),
    (("--tournament",), "ERROR: --tournament: screens several candidates for a recommendation, and the run has "
     "one (two_choice); leave out --tournament (one candidate is a gate of its own), or name several with "
     "--candidate A,B"),
])
def test_an_option_that_cannot_take_effect_on_this_lab_is_refused_before_any_folder_or_host(
        tmp_path: Path, options: tuple[str, ...], expected: str) -> None:
    """The committed lab has one host group and one candidate, and the default scenario with `--trials 4
    --max-trials 4` decides once: each of these options would be ignored (or fail inside a test, keeping a
    run folder), so it is refused in one line, exit status 4."""
    status, lines = _qualify_in_a_copy(tmp_path, *options)
    assert (status, lines) == (USAGE_ERROR, [expected])
    assert _run_folders(tmp_path) == []


def test_spending_rho_is_accepted_where_the_design_is_sequential(tmp_path: Path) -> None:
    status, lines = _qualify_in_a_copy(tmp_path, "--spending-rho", "3", "--trials", "4", "--max-trials", "8",
                                       "--collect-only", "-q")
    assert status == 0, lines


def _qualify_in_a_copy(tmp_path: Path, *args: str) -> tuple[int, list[str]]:
    """`pytest qualify --hosts hosts.yaml ARGS` in a copy of the repository's qualification folder and
    inventory, writing into its default reports folder (`reports/` beside them)."""
    shutil.copytree(REPO / "qualify", tmp_path / "qualify", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "hosts.yaml", tmp_path / "hosts.yaml")
    return pytest_run("qualify", "--hosts", "hosts.yaml", *args, cwd=tmp_path)


def _run_folders(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "reports").glob("*") if p.is_dir())


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


def test_the_preflight_put_back_under_k_is_not_counted_as_deselected(tmp_path: Path) -> None:
    """-k choosing one assertion: pytest's count said `1/29 tests collected (28 deselected)` while it
    listed the 17 preflight checks the plugin puts back beside the one test chosen."""
    from tests.support.labfixtures import write_inventory

    inventory = write_inventory(tmp_path)
    status, lines = pytest_run("qualify", "--hosts", str(inventory), "--reports-dir", str(tmp_path / "reports"),
                               "--collect-only", "-q", "-k", "kv_pages", cwd=REPO)
    assert status == 0, lines
    listed = [line for line in lines if "::" in line]
    assert sum("test_preflight.py" in line for line in listed) == len(listed) - 1 > 1, listed
    [count] = [line for line in lines if "tests collected" in line]
    collected, total, deselected = map(int, re.findall(r"\d+", count.split(" in ")[0]))
    assert (collected, deselected) == (len(listed), total - len(listed)), count


@pytest.mark.parametrize(("args", "where"), [
    (("qualify", "--hosts", "hosts.yaml", "--candidate", "no-such-build"), "checkout"),
    (("qualify",), "checkout"),
    (("qualify", "--hosts", "hosts.yaml"), "elsewhere")], ids=["unknown build", "no inventory", "no qualify folder"])
def test_a_refused_command_line_leaves_a_junit_error_holding_its_one_line(tmp_path: Path, args: tuple[str, ...],
                                                                          where: str) -> None:
    """Exit status 4 with `--junitxml`: the file holds one test case in error whose message is the line the
    terminal printed, so a pipeline shows the reason instead of "no test report"."""
    junit = tmp_path / "out" / "junit.xml"
    status, lines = pytest_run(*args, f"--junitxml={junit}", "--reports-dir", str(tmp_path / "reports"),
                               cwd=REPO if where == "checkout" else tmp_path)
    assert status == USAGE_ERROR and len(lines) == 1 and lines[0].startswith("ERROR: "), lines
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and (suite.get("errors"), suite.get("tests")) == ("1", "1")
    (case,) = suite.iter("testcase")
    error = case.find("error")
    assert error is not None and error.get("message") == lines[0].removeprefix("ERROR: "), lines
    assert not (tmp_path / "reports").exists()
