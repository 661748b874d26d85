"""A run the lab could not measure is not a verdict: it exits 6 (`cache_qualify.stats.outcome.LAB_ERROR`),
its JUnit marks the tests the lab made fail as errors (not failures) with the cause as a property, and the
history records it as outcome `error` with its cause, which `history runs` and the page show. A candidate
whose own ranks die at start stays the candidate's failure (exit 1; tests/test_faults.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.labfaults import scenario_file
from tests.support.labfixtures import run_qualify, write_inventory

pytestmark = pytest.mark.slow


def test_a_baseline_that_does_not_start_is_the_labs_error_not_the_candidates(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path, noise="quiet")
    history = f"sqlite:///{tmp_path / 'history.sqlite'}"
    junit = tmp_path / "junit.xml"
    run = run_qualify(inventory, tmp_path / "reports", "--scenario", str(scenario_file(tmp_path)), "--run-id", "sick",
                      "--baseline", "rank1-exits", "--candidate", "two_choice", "--seed", "3", "--history", history,
                      "--junitxml", str(junit))
    assert run.returncode == 6, run.output[-4000:]
    cases = run.testcases()
    (started,) = (case for name, case in cases.items() if name.startswith("test_all_ranks_started"))
    assert started.find("failure") is None and started.find("error") is not None, run.output[-4000:]
    properties = {p.get("name"): p.get("value", "") for p in started.iter("property")}
    assert "the baseline rank1-exits could not be measured" in properties["lab_error"], properties
    assert not any(c.find("failure") is not None for c in cases.values()), "every test the lab made fail is an error"
    suite = {p.get("name"): p.get("value", "") for p in run.junit().find("testsuite").find("properties")}  # type: ignore[union-attr]
    assert (suite["run_outcome"], suite["exit_status"]) == ("error", "6") and "rank1-exits" in suite["lab_error"]
    assert any("not measured, no verdict (exit status 6)" in line for line in run.tail()), run.tail()
    summary = (run.run_dir() / "summary.md").read_text()
    assert "**Not measured, no verdict**" in summary and "exited during startup" in summary, summary[:2000]

    listed = subprocess.run(["cache-qualify", "history", "runs", "--json", "--history", history],
                            capture_output=True, text=True, timeout=120)
    (row,) = json.loads(listed.stdout)
    assert (row["outcome"], row["exit_status"]) == ("error", 6) and "rank1-exits" in row["cause"], row
    shown = subprocess.run(["cache-qualify", "history", "html", "--history", history, str(tmp_path / "page"),
                            "--reports-dir", str(tmp_path / "reports")], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    text = Path(shown.stdout.strip()).read_text()
    assert '<span class="error">error</span><div class="cause">' in text and "rank1-exits could not be measured" in text
