"""Quantities by name all the way down: a runtime that does not declare a quantity has no trace of it.

The simulated lab's runtime with its KV pages dropped by the inventory (`measurements: {kv_pages: null}`)
and a scenario that asserts only a hit rate: the run folder, its JUnit, its summary, its plots and the
history it wrote name no KV quantity and hold no stand-in for one. The rank logs are left out: they are
the emulated server's own output, fetched verbatim (it logs its KV cache as any runtime may).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cache_qualify.history.store import History, default_url
from cache_qualify.samples.runfolder import LOGS_DIR
from cache_qualify.samples.store import STARTUP
from tests.support.labfixtures import (inventory_port, run_cli, run_qualify, small_scenario, wait_no_sim_processes,
                                       write_inventory)

pytestmark = pytest.mark.slow

DROPPED = re.compile(r"kv", re.IGNORECASE)   # the quantity's name, its title ("KV pages"), its plot's file name
ASSERTED = ({"metric": "hit_rate", "request": "A-new-start", "kind": "no_regression", "margin": 0.2},)


def _inventory_without_the_page_quantity(folder: Path) -> Path:
    path = write_inventory(folder)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    del data["server"]["kv_pages"]   # the older spelling of where KV pages are read
    data["measurements"] = {"kv_pages": None}
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _scenario(folder: Path) -> Path:
    path = small_scenario(folder, "hit-rate-only", expectations=ASSERTED)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["description"] = "The first read's hit rate, and nothing else, on the runtime's own quantities."
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_what_the_runtime_does_not_declare_appears_in_no_file_and_no_history_row(tmp_path: Path) -> None:
    inventory = _inventory_without_the_page_quantity(tmp_path)
    reports = tmp_path / "reports"
    run = run_qualify(inventory, reports, "--scenario", str(_scenario(tmp_path)), "--trials", "2",
                      "--max-trials", "2", timeout_s=600)
    assert wait_no_sim_processes(inventory_port(inventory)) == [], "an emulated server was left running"
    assert run.returncode == 0, run.output
    folder = run.run_dir()
    drawn = run_cli("report", str(folder), timeout_s=120)
    assert drawn.returncode == 0, drawn.stderr
    assert not DROPPED.search(run.output + drawn.stdout + drawn.stderr)

    written = [p for p in folder.rglob("*") if p.is_file() and LOGS_DIR not in p.relative_to(folder).parts]
    names = {p.relative_to(folder).as_posix() for p in written}
    assert {"samples.csv", "trials.csv", "junit.xml", "summary.md", "summary.html", "verdicts.json",
            "plots/hit-rate-only-start-startup-s.png"} <= names, names
    found = [f"{p.relative_to(folder)}: {m.group(0)!r} at {m.start()}" for p in written
             if p.suffix != ".png" for m in [DROPPED.search(p.read_text(encoding="utf-8", errors="replace"))] if m]
    assert found == [] and not any(DROPPED.search(n) for n in names), found
    header = (folder / "trials.csv").read_text(encoding="utf-8").splitlines()[0].split(",")
    assert "startup_s" not in header and all(not DROPPED.search(c) for c in header)
    # the per-start quantity the runtime does declare is there, by its name, and no "not measured" stand-in
    starts = [line.split(",") for line in (folder / "samples.csv").read_text(encoding="utf-8").splitlines()
              if f",{STARTUP},all," in line]
    assert {row[9] for row in starts} == {"startup_s"} and all(float(row[10]) > 0 for row in starts)
    summary = (folder / "summary.md").read_text(encoding="utf-8")
    assert "### Per start" in summary and "| Startup (s) |" in summary

    with History(default_url(reports)) as history:
        dump = history.dump()
    assert dump["trials"] and dump["trial_values"] and dump["verdicts"]
    rows = [f"{table}: {row}" for table, listed in dump.items() for row in listed if DROPPED.search(repr(row))]
    assert rows == []


def test_resume_of_a_folder_with_the_earlier_fixed_columns_is_refused_in_one_line(tmp_path: Path) -> None:
    """A folder an earlier version wrote (trials.csv with startup_s and kv_pages) is not continued: exit 4
    before any lab time, one line naming the folder and what to do; the folder is left as it was."""
    from cache_qualify.samples import runfolder
    from cache_qualify.samples.records import Plan
    from cache_qualify.samples.store import EARLIER_TRIAL_COLUMNS

    reports = tmp_path / "reports"
    folder = reports / "earlier"
    runfolder.create(folder, Plan(run_id="earlier", seed=3, scenarios=("reread-1g",), baseline="set4",
                                  candidates=("two_choice",)))
    (folder / "samples.csv").write_text("run,scenario,build,trial,block,attempt,request,host,rank,metric,value\n",
                                        encoding="utf-8")
    (folder / "trials.csv").write_text(",".join(EARLIER_TRIAL_COLUMNS[0]) + "\n", encoding="utf-8")
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    inventory = write_inventory(tmp_path)
    run = run_qualify(inventory, reports, "--resume", "earlier", timeout_s=120)
    assert run.returncode == 4, run.output
    errors = [line for line in run.output.splitlines() if line.startswith("ERROR")]
    assert errors == [f"ERROR: --resume: {folder} was written by an earlier cache-qualify (its trials.csv has the "
                      f"columns startup_s, kv_pages), which this one cannot continue; start a new run (the folder's "
                      f"report and `cache-qualify history import` still read it)"], run.output
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
