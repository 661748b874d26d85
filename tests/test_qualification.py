"""The qualification's parts on a real run of the simulated lab: the scenarios it reads and how deep a
verdict test's call reaches down to a transport."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.labfixtures import run_qualify, write_inventory
from tests.support.runprobe import probed

# test -> Qualifier.result -> LabSession.claimed -> LookLoop.run -> LookLoop._slot -> TrialRunner.run -> ...
# -> a transport's _execute: 9 frames (11 on the same probe before the Qualifier was split)
FRAMES = 9


@pytest.mark.slow
def test_a_run_reads_its_scenario_in_the_setup_and_reaches_the_lab_in_few_frames(tmp_path: Path) -> None:
    run = run_qualify(write_inventory(tmp_path, noise="quiet"), tmp_path / "reports", "-p", "no:xdist",
                      "-p", "tests.support.runprobe")
    assert run.returncode == 0, run.output
    figures = probed(run.output)
    # once, in the setup: collection and the qualification use what it resolved, and the report takes the
    # description the setup kept in plan.json
    assert figures["scenario_reads"] == {"reread-1g.yaml": 1}, figures
    assert 0 < figures["frames"] <= FRAMES, figures
