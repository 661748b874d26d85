"""A run's progress in pytest's way: a line per trial at the default verbosity, every step with -v,
nothing with -q; under pytest-xdist each worker's lines reach the terminal while the run goes on."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.support.labfixtures import run_qualify, small_scenario_option, start_qualify, write_inventory

TRIAL_END = re.compile(r"^\[cache-qualify \d+:\d\d( gw\d)?\] progress-short: trial (\d) of 2, build (set4|two_choice): "
                       r"ok in \d+ s$", re.M)
STEP = re.compile(r"^\[cache-qualify \d+:\d\d( gw\d)?\] progress-short: trial \d of 2, build \w+: starting ranks$", re.M)
OPTIONS = ("--trials", "2", "--max-trials", "2", "--seed", "5", "--alpha", "0.05")


@pytest.mark.slow
@pytest.mark.parametrize(("verbosity", "trial_lines", "steps"), [([], 0, False), (["-v"], 4, False),
                                                               (["-v", "-v"], 4, True)])
def test_progress_follows_pytests_verbosity(tmp_path: Path, verbosity: list[str], trial_lines: int,
                                            steps: bool) -> None:
    """The suite's runs pass -q: no -v is -q, one -v pytest's default, two -v its -v."""
    inventory = write_inventory(tmp_path, noise="quiet")
    run = run_qualify(inventory, tmp_path / "reports", *small_scenario_option(tmp_path, "progress-short"),
                      *OPTIONS, *verbosity)
    assert run.returncode == 0, run.output
    assert len(TRIAL_END.findall(run.output)) == trial_lines, run.output
    assert bool(STEP.search(run.output)) == steps, run.output
    if not verbosity:
        assert "[cache-qualify " not in run.output, run.output


@pytest.mark.slow
def test_an_xdist_workers_progress_reaches_the_terminal_while_it_runs(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path, noise="quiet")
    proc = start_qualify(inventory, tmp_path / "reports", *small_scenario_option(tmp_path, "progress-short"),
                         *OPTIONS, "-v", "-n", "2")
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        while not TRIAL_END.search("".join(lines)):
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        # the first trial's line came while its worker still had three trials to run
        assert proc.poll() is None, "".join(lines)
        first = time.monotonic()
        out = "".join(lines) + proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert time.monotonic() - first > 1.0, out
    assert sorted((m[1], m[2]) for m in TRIAL_END.findall(out)) == [("1", "set4"), ("1", "two_choice"),
                                                                      ("2", "set4"), ("2", "two_choice")], out
    assert all(m[0] for m in TRIAL_END.findall(out)), out   # each line names its worker
