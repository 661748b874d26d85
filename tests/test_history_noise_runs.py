"""The history's noise in whole qualifications on the simulated lab: two runs of the default gate
write the history, and a third one given `--history-noise` pools their noise where the check agrees,
looks first after 2 blocks and never runs more starts than without it, naming the runs it took the
noise from (the run loop's wiring of
`cache_qualify.stats.known_noise`; its error rates are measured in tests/test_history_noise.py)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from tests.support.labfixtures import run_qualify, write_inventory

pytestmark = pytest.mark.slow


def _starts(run_dir: Path) -> dict[str, int]:
    with (run_dir / "trials.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return {b: sum(1 for r in rows if r["build"] == b) for b in {r["build"] for r in rows}}


def test_a_run_given_history_noise_looks_after_two_blocks_with_the_earlier_runs_noise(tmp_path: Path) -> None:
    """The earlier runs record into one history by `--history URL`; the third names none, and takes the
    noise from the history it records into by default (the reports folder's), the same file."""
    inventory = write_inventory(tmp_path)
    reports = tmp_path / "reports"
    reports.mkdir()
    url = f"sqlite:///{reports / 'history.sqlite'}"
    earlier = []
    for seed in (1, 2):
        run = run_qualify(inventory, tmp_path / f"reports-{seed}", "--history", url, "--seed", str(seed),
                          "--run-id", f"earlier-{seed}")
        assert run.returncode == 0, run.output
        assert _starts(run.run_dir()) == {"set4": 4, "two_choice": 4}   # no --history-noise: the run's own
        earlier.append(f"earlier-{seed}")
    # -v over the command's -q: the default verbosity, whose progress says where the noise came from
    run = run_qualify(inventory, reports, "--seed", "3", "--run-id", "pooled", "--history-noise", "-v")
    assert run.returncode == 0, run.output
    assert "is known from 2 earlier run(s)" in run.output
    # the first look after 2 blocks; at most the starts of the run without the history (4 + 4): a
    # spread the one-sided check at 0.5 finds larger than the history's sets the history aside
    arms = json.loads((reports / "pooled" / "arms-reread-1g.json").read_text())
    assert arms["schedule"][0] == 2, arms
    starts = _starts(reports / "pooled")
    assert set(starts) == {"set4", "two_choice"} and all(2 <= n <= 4 for n in starts.values()), starts
    props = {name: {p.get("name"): p.get("value") for p in case.iter("property")}
             for name, case in run.testcases().items()}
    pooled = [p for p in props.values() if p.get("history_used") == "true"]
    assert pooled, props
    assert all(set(earlier) <= set(p["history_runs"].replace("'", "").strip("[]").split(", ")) for p in pooled), pooled


def test_history_noise_with_an_empty_history_says_so_once_and_measures_as_usual(tmp_path: Path) -> None:
    """A first run given `--history-noise` has no earlier run to pool: it is not refused (the option takes
    effect from the next run on), the run says once that the noise is its own, and runs the design it would
    without the option."""
    from tests.support.labfixtures import small_scenario_option

    inventory = write_inventory(tmp_path)
    run = run_qualify(inventory, tmp_path / "reports", *small_scenario_option(tmp_path, "small"), "--history-noise",
                      "-v")
    assert run.returncode == 0, run.output
    said = [line for line in run.output.splitlines() if "no earlier run" in line]
    # the line names what it searched by: the lab, the scenario and each build's key (docs/history.md)
    assert len(said) == 1 and re.search(r"small: two_choice: history of lab '[^']+', scenario small: baseline set4 "
                                        r"\((sha256|name)[^)]*\): no earlier run; candidate two_choice "
                                        r"\((sha256|name)[^)]*\): no earlier run; the noise is measured as usual$",
                                        said[0]), said
    assert _starts(run.run_dir()) == {"set4": 2, "two_choice": 2}
