"""Whole qualifications on the simulated lab write the history as they go.

Two runners at once into one PostgreSQL (one told by `--history`, one by the
inventory's `history:`), and two runners at once into the default SQLite of one
reports folder, one of them killed mid-run (left unfinished with its trials so
far) and then completed by `--resume` into the same record.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from cache_qualify.history import schema
from cache_qualify.history.store import History, default_url
from tests.support.labfixtures import run_qualify, small_scenario_option, start_qualify, write_inventory
from tests.support.postgres import Postgres, postgres_server
from tests.test_resume import OPTIONS, wait_mid_trial

pytestmark = pytest.mark.slow

TRIALS = 4  # OPTIONS: two per build
SCENARIO = "history-short"


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with postgres_server() as server:
        yield server


def runs_json(history: str | None, cwd: Path) -> list[dict[str, object]]:
    """`cache-qualify history runs --json`, as a lab engineer types it."""
    proc = subprocess.run(["cache-qualify", "history", "runs", "--json", *(["--history", history] if history else [])],
                          cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout)   # one JSON array, as json.load reads it
    assert isinstance(runs, list)
    return runs


def lab(tmp_path: Path, name: str) -> Path:
    """A private simulated lab (its own port and folder on the hosts) for one runner; the quiet lab, so
    two trials per build decide the gate (as in test_resume: these tests are about the history)."""
    folder = tmp_path / name
    folder.mkdir()
    return write_inventory(folder, noise="quiet")


def with_history(inventory: Path, url: str) -> Path:
    data = yaml.safe_load(inventory.read_text(encoding="utf-8"))
    data["history"] = url
    inventory.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return inventory


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    return out


def test_two_runners_write_one_postgresql_at_once(tmp_path: Path, postgres: Postgres) -> None:
    url = postgres.create_database("two_runners")
    first, second = lab(tmp_path, "a"), with_history(lab(tmp_path, "b"), url)
    # history rows written by two runners at once, not figures: the short scenario's runs write the same tables
    scenario = small_scenario_option(tmp_path, SCENARIO)
    procs = [start_qualify(first, tmp_path / "reports-a", "--run-id", "runner-a", "--history", url, *scenario,
                           *OPTIONS),
             start_qualify(second, tmp_path / "reports-b", "--run-id", "runner-b", *scenario, *OPTIONS)]
    outputs = [finish(p) for p in procs]
    assert all("history: postgresql+psycopg://qualify@127.0.0.1" in out for out in outputs), outputs
    runs = runs_json(url, tmp_path)
    listed = sorted((str(r["run_id"]), r["outcome"], r["trials"], r["finished"], r["exit_status"]) for r in runs)
    assert listed == [("runner-a", "pass", TRIALS, True, 0), ("runner-b", "pass", TRIALS, True, 0)], runs
    # each run's summary, as its end rendered it before recording the end (the page links to it)
    assert sorted(str(r["summary"]) for r in runs) == [
        str((tmp_path / f"reports-{x}" / f"runner-{x}" / "summary.md").resolve()) for x in "ab"]
    assert all(Path(str(r["summary"])).is_file() for r in runs)
    with History(url) as history:
        live = history.dump()
        # what the runners wrote as they went is what importing their folders gives: nothing is added
        assert [history.record(tmp_path / f"reports-{x}" / f"runner-{x}") for x in "ab"] == [0, 0]
        assert history.dump() == live
        samples = len(history.values(scenario=SCENARIO))
    written = sum(len(json.loads((tmp_path / f"reports-{x}" / f"runner-{x}" / f"verdicts-{SCENARIO}.json")
                                 .read_text(encoding="utf-8"))) for x in "ab")
    assert samples > 0 and len(live["verdicts"]) == written > 0
    assert {row[1] for row in live["builds"]} == {"set4", "two_choice"}
    group = schema.trials.c.keys().index("host_group")
    assert {row[group] for row in live["trials"]} == {"default"}  # the host group the trials ran on


def test_killed_runner_is_unfinished_until_resumed_sqlite(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    # an unfinished row and its resume, not figures: a short trial is still cut after its A (wait_mid_trial)
    scenario = small_scenario_option(tmp_path, SCENARIO)
    killed = start_qualify(lab(tmp_path, "k"), reports, "--run-id", "killed", *scenario, *OPTIONS)
    other = start_qualify(lab(tmp_path, "o"), reports, "--run-id", "other", *scenario, *OPTIONS)
    wait_mid_trial(killed, reports / "killed")
    os.killpg(killed.pid, signal.SIGKILL)  # the runner dies: no end of run is recorded
    killed.communicate(timeout=60)
    url = default_url(reports)
    with History(url) as history:
        mid = {r["run_id"]: r for r in history.runs()}["killed"]
    assert (mid["finished"], mid["outcome"], mid["exit_status"]) == (False, "unfinished", None)
    assert mid["trials"] >= 1
    finish(other)
    resumed = run_qualify(tmp_path / "k" / "hosts.yaml", reports, "--resume", "killed")
    assert resumed.returncode == 0, resumed.output
    # no --history: the default, reports/history.sqlite under the working folder
    listed = sorted((str(r["run_id"]), r["outcome"], r["trials"], r["finished"]) for r in runs_json(None, tmp_path))
    assert listed == [("killed", "pass", TRIALS, True), ("other", "pass", TRIALS, True)], listed


CANDIDATES = ("set8", "set16", "two_choice")


def test_a_tournament_records_every_candidates_verdicts_and_the_page_shows_them(tmp_path: Path) -> None:
    """Three candidates against one baseline, writing the default SQLite as they go: each candidate's
    verdict on each assertion is a row of its own (arm in the key), and the page shows each candidate's."""
    reports = tmp_path / "reports"
    run = run_qualify(lab(tmp_path, "t"), reports, "--run-id", "three", "--candidate", ",".join(CANDIDATES),
                      *small_scenario_option(tmp_path, SCENARIO), *OPTIONS)
    assert run.returncode in (0, 1), run.output
    assert "history not recorded" not in run.output, run.output
    written = json.loads((reports / "three" / f"verdicts-{SCENARIO}.json").read_text(encoding="utf-8"))
    assert {v["arm"] for v in written} == set(CANDIDATES)
    url = default_url(reports)
    with History(url) as history:
        verdicts = history.dump()["verdicts"]
        (listed,) = history.runs()
    assert len(verdicts) == len(written) > len(CANDIDATES), verdicts   # every candidate's, not none
    arm, assertion = schema.verdicts.c.keys().index("arm"), schema.verdicts.c.keys().index("assertion")
    assert sorted((row[arm], row[assertion]) for row in verdicts) == sorted((v["arm"], v["id"]) for v in written)
    counts = {c: {o: sum(v["arm"] == c and v["outcome"] == o for v in written) for o in ("pass", "fail")}
              for c in CANDIDATES}
    assert list(listed["verdicts"]) == list(CANDIDATES)
    page_dir = tmp_path / "page"
    page_dir.mkdir()
    proc = subprocess.run(["cache-qualify", "history", "html", str(page_dir), "--reports-dir", str(reports)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    page = (page_dir / "index.html").read_text(encoding="utf-8")
    for candidate in CANDIDATES:
        shown = [f'<span class="{o}">{n} {o}</span>' for o, n in counts[candidate].items() if n]
        assert f'<span class="arm" data-arm="{candidate}">{candidate}: {", ".join(shown)}' in page, candidate


def test_a_history_that_cannot_be_written_is_said_in_the_summary_and_the_terminal(tmp_path: Path) -> None:
    """A history newer than this suite (every write refused): the run goes on and passes, and its
    summary and its terminal's last lines say the history was not recorded, and why."""
    reports = tmp_path / "reports"
    reports.mkdir()
    url = default_url(reports)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        schema.schema_version.create(conn)
        conn.execute(schema.schema_version.insert().values(version=schema.SCHEMA_VERSION + 1))
    engine.dispose()
    run = run_qualify(lab(tmp_path, "n"), reports, "--run-id", "newer", *small_scenario_option(tmp_path, SCENARIO),
                      *OPTIONS)
    assert run.returncode == 0, run.output
    why = f"schema version {schema.SCHEMA_VERSION + 1}, newer than this cache-qualify knows"
    said = [line for line in run.output.splitlines() if line.startswith("history not recorded: ")]
    assert len(said) == 1 and why in said[0] and "history import" in said[0], run.output
    summary = (reports / "newer" / "summary.md").read_text(encoding="utf-8")
    assert "**History not recorded: at the end of the run: " in summary and why in summary


URL_PASSWORD, ENV_PASSWORD = "S3cretPW", "Env5ecretPW"


def test_no_password_reaches_the_run_folder_the_history_or_the_output(tmp_path: Path, postgres: Postgres) -> None:
    """A history URL with a password, and PGPASSWORD in the environment: the run connects with them and
    shows, records and writes the masked URL only (plan, provenance, summary, JUnit, logs, the history's
    rows, the terminal)."""
    url = postgres.create_login("labuser", URL_PASSWORD)
    reports = tmp_path / "reports"
    run = run_qualify(lab(tmp_path, "secret"), reports, "--run-id", "secret", "--history", url,
                      *small_scenario_option(tmp_path, SCENARIO), *OPTIONS, env={"PGPASSWORD": ENV_PASSWORD})
    assert run.returncode == 0, run.output
    shown = f"postgresql://labuser:***@127.0.0.1:{postgres.port}/labuser"
    assert f"history: {shown}" in run.output
    plan = json.loads((reports / "secret" / "plan.json").read_text(encoding="utf-8"))
    assert plan["history"] == shown and f"--history {shown}" in " ".join(plan["command"])
    files = [p for p in reports.rglob("*") if p.is_file()]
    assert any(p.name == "junit.xml" for p in files) and any(p.suffix == ".log" for p in files)
    with History(postgres.url("labuser")) as history:  # the superuser reads what the run wrote
        rows = history.dump()
    assert len(rows["trials"]) == TRIALS
    for secret in (URL_PASSWORD, ENV_PASSWORD):
        assert secret not in run.output
        assert [p for p in files if secret.encode() in p.read_bytes()] == []
        assert secret not in repr(rows)
