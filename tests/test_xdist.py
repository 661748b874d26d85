"""Scale-out: two scenarios on two host groups with `-n 2`, into one report.

The emulated servers really sleep their modelled time (scaled down), so the
runner waits on servers as it would in a lab and two workers can overlap.
The speed-up itself is a benchmark, not a test: `python -m tests.test_xdist`.
"""

from __future__ import annotations

import csv
import json
import re
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from tests.support.labfixtures import (REPO, inventory_port, run_qualify, small_scenario_option, wait_no_sim_processes,
                                       write_inventory)

pytestmark = pytest.mark.slow

# modelled server time really slept at this scale (loading weights: 120 s -> 1.2 s a start, six
# starts a scenario, so the two scenarios' trials overlap whatever the runner's CPU does); the
# benchmark sleeps 12 s, so the servers' time dominates as it does on real hosts
TEST_SLEEP_SCALE = 0.01
BENCH_SLEEP_SCALE = 0.1


def two_groups(tmp_path: Path, sleep_scale: float = TEST_SLEEP_SCALE) -> Path:
    hosts = [{"name": f"gb10-{c}", "address": f"127.0.0.{11 + i}", "rank": i % 3, "transport": "local"}
             for i, c in enumerate("abcdef")]
    groups = [{"name": "tp-1", "hosts": ["gb10-a", "gb10-b", "gb10-c"]},
              {"name": "tp-2", "hosts": ["gb10-d", "gb10-e", "gb10-f"]}]
    inventory = yaml.safe_load((REPO / "hosts.yaml").read_text())
    builds = {name: {**inventory["builds"][name], "path": str(REPO / inventory["builds"][name]["path"]),
                     "flags": [*inventory["builds"][name]["flags"], "--sim-sleep-scale", str(sleep_scale)]} for name in ("set4", "two_choice")}
    # scale-out, not statistics: the quiet lab, whose servers sleep only the modelled time above
    return write_inventory(tmp_path, hosts=hosts, groups=groups, builds=builds, noise="quiet")


def scenario_args(tmp_path: Path) -> list[str]:
    # three blocks: on the quiet lab both builds give one value in every start, which the gate
    # decides exactly from three blocks (two identical blocks are no evidence of a deterministic metric)
    return [*small_scenario_option(tmp_path, "small-1g", "1G", trials=3),
            *small_scenario_option(tmp_path, "small-2g", "2G", trials=3)]


def intervals(run_dir: Path) -> dict[str, tuple[datetime, datetime]]:
    """Per scenario, from its first trial's start to its last trial's end."""
    with (run_dir / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    spans: dict[str, tuple[datetime, datetime]] = {}
    for row in rows:
        start, end = datetime.fromisoformat(row["started_at"]), datetime.fromisoformat(row["finished_at"])
        old = spans.get(row["scenario"], (start, end))
        spans[row["scenario"]] = (min(old[0], start), max(old[1], end))
    return spans


def test_two_workers_run_two_scenarios_on_two_groups_into_one_report(tmp_path: Path) -> None:
    inventory = two_groups(tmp_path)
    # -vv over run_qualify's -q: verbose, each test's line names its worker ([gw0], [gw1])
    run = run_qualify(inventory, tmp_path / "reports", *scenario_args(tmp_path), "-n", "2", "-vv")
    assert run.returncode == 0, run.output
    assert wait_no_sim_processes(inventory_port(inventory)) == []
    run_dir = run.run_dir()
    verdicts = json.loads((run_dir / "verdicts.json").read_text())
    assert sorted(verdicts["scenarios"]) == ["small-1g", "small-2g"]
    # every scenario test's node id carries its group, and each group ran on one worker
    workers: dict[str, set[str]] = {}
    for worker, scenario in re.findall(r"^\[(gw\d)\] \[ *\d+%\] \w+ \S+@(small-[12]g) *$", run.output, re.M):
        workers.setdefault(scenario, set()).add(worker)
    assert sorted(workers) == ["small-1g", "small-2g"], run.output
    assert all(len(w) == 1 for w in workers.values()) and workers["small-1g"] != workers["small-2g"], workers
    # each worker claimed its own host group, and the two scenarios ran at the same time
    # (the run's output names the worker of each test, and who waited for whom: the clue if not)
    assert {p.name for p in run_dir.glob("facts-*.json")} == {"facts-tp-1.json", "facts-tp-2.json"}, run.output
    (a_start, a_end), (b_start, b_end) = intervals(run_dir).values()
    assert a_start < b_end and b_start < a_end, f"the two scenarios did not overlap: one worker waited\n{run.output}"
    summary = (run_dir / "summary.md").read_text()
    assert "small-1g" in summary and "small-2g" in summary


def main() -> None:
    """Benchmark: wall time of `-n 2` against one worker on the same two scenarios."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        inventory = two_groups(root, BENCH_SLEEP_SCALE)
        args = scenario_args(root)
        times = {}
        for label, extra in (("one worker", ["-p", "no:xdist"]), ("two workers (-n 2)", ["-n", "2"])):
            started = time.monotonic()
            run = run_qualify(inventory, root / label.split()[0], *args, *extra)
            times[label] = time.monotonic() - started
            if run.returncode != 0:
                raise SystemExit(f"{label}: the qualification failed:\n{run.output}")
            print(f"{label:>20}: {times[label]:6.1f} s")
        ratio = times["two workers (-n 2)"] / times["one worker"]
        print(f"{'ratio':>20}: {ratio:6.2f}  (target <= 0.60)")


if __name__ == "__main__":
    main()
