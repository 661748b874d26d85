"""cache_qualify.stats.planning: `cache-qualify plan` from a predicted effect and from a pilot run's samples."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cache_qualify.cli import main
from cache_qualify.stats.verdict import power_of, trials_for_power

COLUMNS = ("run", "scenario", "build", "trial", "block", "request", "host", "rank", "metric", "value")


def _write_pilot(path: Path, *, builds: dict[str, float], sd: float, trials: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(8)
    values = {b: rng.normal(mean, sd, trials) for b, mean in builds.items()}
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for build, draws in values.items():
            for trial, value in enumerate(draws):
                writer.writerow(("r1", "default", build, trial, trial, "B-new-start", "all", "", "hit_rate", value))
                # per-host rows must be ignored: only host "all" holds the combined value
                writer.writerow(("r1", "default", build, trial, trial, "B-new-start", "gb10-1", 0, "hit_rate", 0.1))
    return values


def test_plan_from_a_predicted_effect_runs_as_a_console_script() -> None:
    done = subprocess.run([sys.executable, "-m", "cache_qualify.cli", "plan", "--effect", "0.0013", "--sd", "0.001",
                           "--json"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    n = row["trials_per_build"]
    assert power_of(0.0013, 0.001, n, alpha=0.05) >= 0.9 > power_of(0.0013, 0.001, n - 1, alpha=0.05)
    assert row["max_trials_sequential"] == math.ceil(1.3 * n)


def test_plan_from_a_pilot_uses_the_combined_rows_and_both_builds(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    values = _write_pilot(tmp_path / "samples.csv", builds={"set4": 0.860, "two_choice": 0.862}, sd=0.002, trials=6)
    assert main(["plan", "--samples", str(tmp_path), "--family-size", "2"]) == 0
    out = capsys.readouterr().out
    sd = math.sqrt((values["set4"].var(ddof=1) + values["two_choice"].var(ddof=1)) / 2)
    effect = abs(values["two_choice"].mean() - values["set4"].mean())
    expected = trials_for_power(effect, sd, alpha=0.025)
    assert "Holm over 2 gain assertion(s)" in out
    assert f"| hit_rate | B-new-start | {values['set4'].mean():.6g} | {values['two_choice'].mean():.6g} |" in out
    assert expected is not None and f"| {expected} | {math.ceil(1.3 * expected)} |" in out


def test_plan_with_one_build_takes_the_predicted_effect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_pilot(tmp_path / "samples.csv", builds={"set4": 0.86}, sd=0.001, trials=5)
    assert main(["plan", "--samples", str(tmp_path / "samples.csv")]) == 2
    assert "give the predicted `--effect`" in capsys.readouterr().err
    assert main(["plan", "--samples", str(tmp_path / "samples.csv"), "--effect", "0.13", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["effect"] == 0.13 and row["trials_per_build"] == 2


@pytest.mark.parametrize(("content", "message"), [
    ("build,value\nset4,0.8\n", r"expected columns scenario, build, trial, request, host, metric, value; "
                                r"missing scenario, trial, request, host, metric"),
    ("", r"expected a tidy samples CSV, but it cannot be read"),
])
def test_plan_explains_unusable_pilots(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                       message: str) -> None:
    (tmp_path / "samples.csv").write_text(content)
    assert main(["plan", "--samples", str(tmp_path / "samples.csv")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "samples.csv") in err
    assert re.search(message, err)


def test_plan_refuses_missing_inputs_and_unknown_builds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--effect", "0.1"]) == 2
    assert ("give a pilot run (`--samples PATH`), `--emulate` with two policies, or a predicted `--effect` "
            "and `--sd`") in capsys.readouterr().err
    _write_pilot(tmp_path / "samples.csv", builds={"set4": 0.86, "lru4": 0.85}, sd=0.001, trials=4)
    assert main(["plan", "--samples", str(tmp_path), "--candidate", "set8"]) == 2
    assert "--candidate 'set8' is not a build of the pilot; it has set4, lru4" in capsys.readouterr().err


def test_plan_from_the_emulators_prediction(capsys: pytest.CaptureFixture[str]) -> None:
    """Effect and start-to-start noise from the emulator: the RowCache study's large re-read gain needs the minimum."""
    assert main(["plan", "--emulate", "--baseline", "set4", "--candidate", "two_choice", "--seeds", "3",
                 "--alpha", "0.01", "--family-size", "4", "--json"]) == 0
    sizings = {s["request"]: s for s in json.loads(capsys.readouterr().out)}
    reread = sizings["B-new-start"]
    assert 0.80 < reread["baseline_mean"] < 0.93 and reread["candidate_mean"] > 0.97
    assert 0 < reread["sd"] < 0.01
    assert reread["trials_per_build"] <= 3


def test_plan_sizes_a_tournament_from_the_emulator(capsys: pytest.CaptureFixture[str]) -> None:
    """Starts per arm for two candidates at once: each sized on the scenario's gains, the baseline shared."""
    assert main(["plan", "--emulate", "--baseline", "set4", "--candidate", "set8,two_choice", "--seeds", "2",
                 "--alpha", "0.01", "--family-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "## Candidate set8 (vs set4)" in out and "## Candidate two_choice (vs set4)" in out
    assert "| set4 (baseline, shared) | 2 |\n| set8 | 2 |\n| two_choice | 2 |" in out
    assert "6 server starts in one run against 8 in one two-arm run per candidate (25% fewer)." in out


def test_plan_emulate_needs_two_policies(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--emulate", "--baseline", "set4", "--candidate", "set4"]) == 2
    assert "`--emulate` needs two different policies" in capsys.readouterr().err
