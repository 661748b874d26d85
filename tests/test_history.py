"""The qualification history: import, schema upgrades, concurrent writers, change points, the page, planning.

Against SQLite and a real PostgreSQL the tests start themselves (tests/support/postgres.py),
on run folders written by the suite's own writers from simulated series
(tests/support/history_sim.py); the page is opened in a real headless Chromium. Whole
qualifications writing the history live are in tests/test_history_runs.py, the page a lab engineer
reads in tests/test_history_page.py.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from cache_qualify.cli import main
from cache_qualify.emulation.lab_offset import Calibration, CalibrationKey, Offset
from cache_qualify.errors import HistoryError
from cache_qualify.history import schema
from cache_qualify.history.series import series_of
from cache_qualify.history.store import History, default_url
from cache_qualify.report.render import render_run
from cache_qualify.samples.records import BuildRecord, Plan, VerdictRecord
from cache_qualify.samples.runfolder import write_verdicts
from tests.support import history_sim
from tests.support.postgres import Postgres, postgres_server
from tests.support.chromium import browser_problems, chromium
from cache_qualify.validation.promises import binomial_bound

@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with postgres_server() as server:
        yield server


# the tests on the PostgreSQL share its server, those on the stepped series its import: one xdist
# worker runs each set, so each is made once
ON_POSTGRES = pytest.mark.xdist_group("history-postgres")
ON_STEPPED = pytest.mark.xdist_group("history-stepped")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=ON_POSTGRES)])
def history_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return default_url(tmp_path)
    server: Postgres = request.getfixturevalue("postgres")
    return server.create_database(f"h_{abs(hash(request.node.name)) % 10**8}")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


def json_array(text: str) -> list[dict[str, object]]:
    loaded = json.loads(text)   # --json prints one JSON array
    assert isinstance(loaded, list)
    return loaded


@pytest.mark.slow
def test_import_twice_gives_the_same_database(tmp_path: Path, history_url: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(3)
    folders = history_sim.write_series(tmp_path / "reports", history_sim.quiet_series(rng, 3))
    for rendered in ("outcome.json", "verdicts.json"):  # what a run's end writes: the last one never ended
        (folders[-1] / rendered).unlink()
    names = [str(f) for f in folders] + [str(tmp_path / "reports" / "history.sqlite")]  # as reports/* would
    first = cli(capsys, "history", "import", "--history", history_url, *names)
    assert "run000: 4 new trial(s)" in first and "history.sqlite: skipped" in first
    with History(history_url) as history:
        once = history.dump()
    assert "run000: 0 new trial(s)" in cli(capsys, "history", "import", "--history", history_url, *names)
    with History(history_url) as history:
        assert history.dump() == once
    assert len(once["trials"]) == 12 and len(once["trial_values"]) == 12
    plain = history_url.replace("postgresql+psycopg://", "postgresql://")  # as a lab engineer types it
    runs = json_array(cli(capsys, "history", "runs", "--json", "--history", plain))
    assert [(r["run_id"], r["outcome"], r["scenario"], r["baseline"], r["candidates"]) for r in runs] == [
        ("run000", "inconclusive", "reread-1g", "set4", ["set4"]),
        ("run001", "inconclusive", "reread-1g", "set4", ["set4"]),
        ("run002", "unfinished", "reread-1g", "set4", ["set4"])]
    assert all(str(r["started"]).startswith("2026-01-0") for r in runs)


# the verdicts table before version 4: no arm, unique on (run, scenario, assertion), fifteen figures
V3_VERDICTS = """CREATE TABLE verdicts (run_id VARCHAR(64) NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    scenario VARCHAR(128) NOT NULL, assertion VARCHAR(256) NOT NULL, metric VARCHAR(64) NOT NULL,
    request VARCHAR(128) NOT NULL, kind VARCHAR(32) NOT NULL, outcome VARCHAR(16) NOT NULL, baseline_mean FLOAT,
    candidate_mean FLOAT, difference FLOAT, ci_low FLOAT, ci_high FLOAT, p_value FLOAT, p_adjusted FLOAT,
    trials_baseline INTEGER, trials_candidate INTEGER, trials_needed INTEGER, reason TEXT,
    UNIQUE (run_id, scenario, assertion))"""
V3_FIGURES = ("run_id", "scenario", "assertion", "metric", "request", "kind", "outcome", "baseline_mean",
              "candidate_mean", "difference", "ci_low", "ci_high", "p_value", "p_adjusted", "trials_baseline",
              "trials_candidate", "trials_needed", "reason")


# the verdicts table's columns at each schema version, pinned here: a field of the verdict record that the
# history keeps (`Figure.history`) changes today's table, so it fails the pin until SCHEMA_VERSION rises, an
# upgrade adds its column and the new version's columns are pinned below
V4_FIGURES = ("run_id", "scenario", "assertion", "arm", "metric", "request", "kind", "higher_is_better",
              "min_effect", "margin", "unit", "outcome", "method", "design", "alpha", "level", "trials_baseline",
              "trials_candidate", "baseline_mean", "candidate_mean", "difference", "normal_difference",
              "null_boundary", "ci_low", "ci_high", "ci_level", "p_value", "p_adjusted", "noise_sd", "history_sd",
              "history_df", "history_runs", "history_used", "trials_needed", "reason")
VERDICT_COLUMNS = {1: V3_FIGURES, 2: V3_FIGURES, 3: V3_FIGURES, 4: V4_FIGURES, 5: V4_FIGURES, 6: V4_FIGURES,
                   7: V4_FIGURES, 8: V4_FIGURES, 9: V4_FIGURES}


def test_import_goes_past_a_folder_it_cannot_read_and_names_it(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`history import reports/*` with a folder of a plan and no trials (a check of the lab left one in
    earlier versions) between two runs: both runs go in, and the folder is named in one line."""
    rng = np.random.default_rng(3)
    reports = tmp_path / "reports"
    first, last = history_sim.write_series(reports, history_sim.quiet_series(rng, 2))
    plan_only = reports / "run000a"
    plan_only.mkdir()
    shutil.copy(first / "plan.json", plan_only / "plan.json")
    out = cli(capsys, "history", "import", "--reports-dir", str(reports), *map(str, (first, plan_only, last)))
    assert "run000: 4 new trial(s)" in out and "run001: 4 new trial(s)" in out, out
    skipped = [line for line in out.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and skipped[0].startswith(f"{plan_only}: skipped, ") and "trials.csv" in skipped[0], out


def test_the_verdict_columns_of_each_schema_version_are_pinned() -> None:
    """Today's verdicts table is the pinned columns of today's version, every version has its pin and an
    upgrade to it from the one before."""
    assert schema.verdicts.c.keys() == list(VERDICT_COLUMNS[schema.SCHEMA_VERSION])
    assert sorted(VERDICT_COLUMNS) == list(range(1, schema.SCHEMA_VERSION + 1))
    assert sorted(schema.UPGRADES) == list(range(1, schema.SCHEMA_VERSION))


def _older_verdicts(conn: sa.Connection, version: int) -> None:
    """The verdicts table with the columns `version` pinned (types as today's), its rows kept: a version
    that added a recorded field after version 4 is upgraded from the table before it."""
    if list(VERDICT_COLUMNS[version]) == schema.verdicts.c.keys():
        return
    rows = [dict(row) for row in conn.execute(sa.select(schema.verdicts)).mappings()]
    old = sa.Table("verdicts", sa.MetaData(), *(sa.Column(c.name, c.type, nullable=c.nullable)
                                                for c in schema.verdicts.columns if c.name in VERDICT_COLUMNS[version]))
    schema.verdicts.drop(conn)
    old.create(conn)
    if rows:
        conn.execute(old.insert(), [{k: row[k] for k in VERDICT_COLUMNS[version]} for row in rows])


def _as_version(conn: sa.Connection, version: int) -> None:
    """The database as an older suite left it at `version`: what the later versions added dropped, what
    they dropped back (a trial's startup time and KV pages as columns, the values a start measured)."""
    if version < 9:
        conn.execute(sa.text("DROP TABLE calibrations"))
    if version < 8:
        conn.execute(sa.text("ALTER TABLE runs DROP COLUMN pipeline"))
    if version < 7:
        conn.execute(sa.text("ALTER TABLE runs DROP COLUMN cause"))
    if version < 6:
        for column in ("source", "digest"):
            conn.execute(sa.text(f"ALTER TABLE builds DROP COLUMN {column}"))
    if version < 5:
        conn.execute(sa.text("ALTER TABLE trials ADD COLUMN startup_s FLOAT"))
        conn.execute(sa.text("ALTER TABLE trials ADD COLUMN kv_pages INTEGER"))
        conn.execute(sa.text("UPDATE trials SET startup_s = 12.5, kv_pages = 41300"))
    if version >= 4:
        _older_verdicts(conn, version)
    if version < 4:
        rows = [dict(row) for row in conn.execute(sa.select(schema.verdicts)).mappings()]
        conn.execute(sa.text("DROP TABLE verdicts"))
        conn.execute(sa.text(V3_VERDICTS))
        if rows:
            old = sa.Table("verdicts", sa.MetaData(), autoload_with=conn)
            conn.execute(old.insert(), [{k: row[k] for k in V3_FIGURES} for row in rows])
    if version < 3:
        for statement in ("DROP TABLE flagged_starts", "DROP TABLE quantities", "ALTER TABLE runs DROP COLUMN summary"):
            conn.execute(sa.text(statement))
    if version < 2:
        conn.execute(sa.text("ALTER TABLE trials DROP COLUMN host_group"))
    conn.execute(schema.schema_version.update().values(version=version))


@pytest.mark.parametrize("version", range(1, schema.SCHEMA_VERSION))
def test_schema_upgrades_in_place(tmp_path: Path, history_url: str, version: int) -> None:
    folder = history_sim.write_series(tmp_path / "reports", history_sim.quiet_series(np.random.default_rng(4), 1))[0]
    write_verdicts(folder, history_sim.SCENARIO, [VerdictRecord.of("set4", {
        "id": "hit_rate-gain[B-new-start]", "metric": "hit_rate", "request": "B-new-start", "kind": "gain",
        "outcome": "pass", "difference": 0.01, "ci_level": 0.98})])
    render_run(folder, plots=False)  # its summary, as the run's end writes it
    with History(history_url) as history:
        history.record(folder)
        before = history.dump()
    summary = schema.runs.c.keys().index("summary")
    assert before["quantities"] and before["runs"][0][summary] is not None  # units and the summary, recorded
    engine = sa.create_engine(history_url)
    with engine.begin() as conn:
        _as_version(conn, version)
    with History(history_url) as history:
        assert history.upgrade() == version
        upgraded = history.dump()
        # the rows kept, the columns and tables back, empty as the older suite left them; the verdicts
        # with their arm (the run's only candidate), the figures an older suite did not keep NULL
        assert upgraded["trials"] == before["trials"]
        assert [c["name"] for c in sa.inspect(engine).get_columns("trials")] == schema.trials.c.keys()
        kept = [schema.verdicts.c.keys().index(k) for k in dict.fromkeys((*VERDICT_COLUMNS[version], "arm"))]
        assert [[row[k] for k in kept] for row in upgraded["verdicts"]] == \
            [[row[k] for k in kept] for row in before["verdicts"]] and before["verdicts"]
        assert {row[schema.verdicts.c.keys().index("arm")] for row in upgraded["verdicts"]} == {"set4"}
        if version < 3:
            assert upgraded["quantities"] == [] and upgraded["runs"][0][summary] is None
        (found,) = series_of(history.values())  # read as the study's runtime measured it, as a report does
        assert (found.metric, found.unit, found.title) == ("hit_rate", "fraction", "Hit rate")
        assert [row[:summary] for row in upgraded["runs"]] == [row[:summary] for row in before["runs"]]
        assert history.runs()[0]["verdicts"] == {"set4": {"pass": 1}}
        assert history.record(folder) == 0  # importing the folder again fills them in
        assert history.dump() == before
    with engine.begin() as conn:
        assert schema.current_version(conn) == schema.SCHEMA_VERSION
        conn.execute(schema.schema_version.update().values(version=schema.SCHEMA_VERSION + 1))
    engine.dispose()
    newer = schema.SCHEMA_VERSION + 1
    with History(history_url) as history, pytest.raises(HistoryError, match=rf"schema version {newer}, newer than this"):
        history.runs()


@pytest.mark.slow
def test_two_writers_at_once_both_land_complete(tmp_path: Path, history_url: str) -> None:
    """Two `history import` processes write one database at the same moment (a new one: both also
    race to create the schema)."""
    rng = np.random.default_rng(5)
    groups = [history_sim.write_series(tmp_path / name, history_sim.quiet_series(rng, 6), build=name, prefix=name)
              for name in ("set4", "two_choice")]
    procs = [subprocess.Popen([sys.executable, "-m", "cache_qualify.cli", "history", "import", "--history",
                               history_url, *map(str, folders)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for folders in groups]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    with History(history_url) as history:
        runs = history.runs()
        values = history.values()
    assert sorted(str(r["run_id"]) for r in runs) == sorted(f.name for folders in groups for f in folders)
    assert all(r["trials"] == 4 for r in runs), runs
    assert sorted(values.groupby("build").size().items()) == [("set4", 24), ("two_choice", 24)]


LIVE_TRIALS = 200
HOSTS = (("gb10-a", 0), ("gb10-b", 1), ("gb10-c", 2))
METRICS = ("hits", "misses", "evictions", "rows_added", "refused_inserts", "hit_rate", "readiness_wait_ns",
           "resident_rows", "capacity_rows", "client_time_s")


def _trial_values(rng: np.random.Generator) -> list[tuple[str, str, int, str, float]]:
    """One trial's samples as the runner hands them over: the start's, then per request every host's
    and all hosts' figures (the default scenario's five requests on three hosts)."""
    values: list[tuple[str, str, int, str, float]] = [("startup", h, r, "kv_pages", 41_300.0) for h, r in HOSTS]
    for request in ("A", "A-new-start", "B", "B-new-start", "A-third-read"):
        values += [(request, h, r, m, float(rng.random())) for h, r in (*HOSTS, ("all", -1)) for m in METRICS]
    return values


# SQLite calls its progress handler every this many virtual-machine instructions
SQLITE_STEPS = 100


@pytest.mark.slow
def test_a_run_records_each_trial_as_it_ends_with_the_same_work(tmp_path: Path) -> None:
    """200 trials recorded live, as a qualification ends each: the same statements for every trial after
    the first (which makes the schema and the run's row), and SQLite's work for the last 50 within 1.1
    times the first 50's, so nothing reads the growing history again at each trial. The work is counted
    in SQLite's virtual-machine instructions (its progress handler), not in time: a count is the same on
    a loaded machine, where a stopped CPU clock was not (a CI run measured 1.6 times for the same code).
    A scan of the trial values at each trial measures about 5.7 times. The builds' refs come from the
    plan."""
    from cache_qualify.history.recorder import Recorder
    from cache_qualify.samples import runfolder
    from cache_qualify.samples.records import BuildRecord, Plan
    from cache_qualify.samples.store import OK, TrialRow, new_attempt

    run_dir = tmp_path / "reports" / "live"
    runfolder.create(run_dir, Plan(run_id="live", seed=1, lab="lab", baseline="set4", candidates=("two_choice",),
                                   scenarios=("reread-1g",), builds={
                                       "set4": BuildRecord("set4", "baseline", "bin/a", "bbad44fe", ("-x",)),
                                       "two_choice": BuildRecord("two_choice", "candidate", "bin/b", "0572fd12")}))
    url = default_url(tmp_path / "reports")
    statements, steps = [0], [0]

    def count(*args: object) -> None:
        statements[0] += 1

    def step() -> int:
        steps[0] += 1
        return 0   # go on

    def watch(dbapi_connection: Any, record: object) -> None:
        dbapi_connection.set_progress_handler(step, SQLITE_STEPS)

    rng = np.random.default_rng(0)
    per_trial: list[tuple[int, int]] = []
    sa.event.listen(sa.Engine, "before_cursor_execute", count)
    sa.event.listen(sa.pool.Pool, "connect", watch)   # before the recorder opens its first connection
    try:
        recorder = Recorder(url, run_dir)
        for trial in range(LIVE_TRIALS):
            build = ("set4", "two_choice")[trial % 2]
            row = TrialRow("live", "reread-1g", build, trial // 2, trial // 2, trial % 2, new_attempt(), OK, "",
                           "2026-01-01T00:00:00.000+00:00", "2026-01-01T00:00:01.000+00:00")
            values = _trial_values(rng)
            before = statements[0], steps[0]
            recorder.trial_finished(row, values, host_group="default")
            per_trial.append((statements[0] - before[0], steps[0] - before[1]))
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", count)
        sa.event.remove(sa.pool.Pool, "connect", watch)
    assert recorder.problem is None
    counts = [n for n, _ in per_trial]
    assert len(set(counts[1:])) == 1, counts
    first, last = sum(n for _, n in per_trial[1:51]), sum(n for _, n in per_trial[-50:])
    assert 0 < last <= 1.1 * first, (first, last)
    with History(url) as history:
        (run,) = history.runs()
        assert (run["run_id"], run["trials"], run["finished"], run["outcome"]) == ("live", LIVE_TRIALS, False,
                                                                                 "unfinished")
        dump = history.dump()
    assert len(dump["trial_values"]) == LIVE_TRIALS * len(_trial_values(rng))
    assert sorted((row[1], row[3], row[4]) for row in dump["builds"]) == [("set4", "bbad44fe", ["-x"]),
                                                                          ("two_choice", "0572fd12", [])]


def test_a_history_that_cannot_be_written_is_reported_and_the_run_goes_on(tmp_path: Path) -> None:
    from cache_qualify.history.recorder import Recorder
    from cache_qualify.samples.store import OK, TrialRow

    run_dir = tmp_path / "reports" / "no-plan"
    run_dir.mkdir(parents=True)
    recorder = Recorder(default_url(tmp_path / "reports"), run_dir)
    row = TrialRow("no-plan", "reread-1g", "set4", 0, 0, 0, "a1", OK, "", "t", "t")
    recorder.trial_finished(row, [], host_group=None)  # no plan to record the run from: said, not raised
    assert recorder.problem is not None and "after trial 1 of set4" in recorder.problem
    assert "plan.json does not exist" in recorder.problem


@pytest.fixture(scope="module")
def stepped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reports folder of 23 runs whose hit rate steps up by 2 sd at the 21st, imported into its
    default history."""
    reports = tmp_path_factory.mktemp("stepped")
    folders = history_sim.write_series(reports, history_sim.step_series(np.random.default_rng(11), 3))
    assert main(["history", "import", "--reports-dir", str(reports), *map(str, folders)]) == 0
    return reports


@pytest.mark.slow
@ON_STEPPED
def test_change_found_at_the_step_and_none_without(stepped: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    quiet = history_sim.write_series(tmp_path, history_sim.quiet_series(np.random.default_rng(12)))
    cli(capsys, "history", "import", "--reports-dir", str(tmp_path), *map(str, quiet))
    found = json_array(cli(capsys, "history", "changes", "--json", "--build", "set4", "--reports-dir", str(stepped)))
    assert [(c["run_before"], c["run_after"], c["ref_before"], c["ref_after"], c["metric"], c["request"])
            for c in found] == [("run019", "run020", "c19", "c20", "hit_rate", "B-new-start")], found
    change = found[0]
    assert float(change["p_value"]) <= 0.01  # type: ignore[arg-type]
    assert math.isclose(float(change["mean_after"]) - float(change["mean_before"]),  # type: ignore[arg-type]
                        history_sim.STEP_SD * history_sim.SD, rel_tol=0.5)
    table = cli(capsys, "history", "changes", "--build", "set4", "--reports-dir", str(stepped))
    assert "run019 / run020" in table and "c19 / c20" in table and "1 change point(s)" in table
    assert json_array(cli(capsys, "history", "changes", "--json", "--build", "set4", "--reports-dir",
                          str(tmp_path))) == []
    trend = json_array(cli(capsys, "history", "trend", "--json", "--build", "set4", "--reports-dir", str(stepped)))
    assert len(trend) == 23 and all(r["ci_low"] < r["mean"] < r["ci_high"] for r in trend)  # type: ignore[operator]


@pytest.mark.slow
def test_change_point_rates_hold_quick() -> None:
    """The rates docs/history.md states (`python -m tests.support.history_sim`), on fewer series: false alarms
    at most alpha (up to binomial noise), a 2 sd step found at its run within 3 runs in 90 %."""
    series = 100
    rates = history_sim.measure(series, seed=2, after=(3,))
    assert rates.false_alarms <= binomial_bound(series, history_sim.ALPHA), rates
    # measured on 1000 series: 93.5 % at the step's run, 98.8 % within one run
    assert rates.found_exact[3] >= 0.85 * series and rates.found_near[3] >= 0.93 * series, rates
    heavy_tails = history_sim.other_noise_false_alarms(series, seed=3, kinds=["heavy tails (t3)"])["heavy tails (t3)"]
    assert heavy_tails * series <= binomial_bound(series, history_sim.ALPHA), heavy_tails


def test_plan_sizes_from_the_past_noise_within_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(6)
    series = [np.asarray(values) + shift
              for values, shift in zip(history_sim.quiet_series(rng, 5), (0, 0.01, -0.01, 0.02, 0))]
    folders = history_sim.write_series(tmp_path, [list(v) for v in series])
    cli(capsys, "history", "import", "--reports-dir", str(tmp_path), *map(str, folders))
    out = json.loads(cli(capsys, "plan", "--runtime", "flare", "--history", default_url(tmp_path), "--scenario", "reread-1g",
                         "--effect", "0.03", "--json"))
    sizing, = (s for s in out["sizings"] if s["trials_per_build"] is not None)   # the only one the history has
    within = math.sqrt(sum(((v - v.mean()) ** 2).sum() for v in series) / (20 - 5))
    assert math.isclose(sizing["sd"], within, rel_tol=1e-9)  # the drift between runs is not noise
    assert sizing["request"] == "B-new-start" and sizing["metric"] == "hit_rate" and len(out["sizings"]) == 8
    # each run's set4 has a ref of its own, and the noise is pooled only from the same build's runs
    assert "known for 0 of 8 assertion(s)" in out["note"] and out["start_time"] is None
    assert main(["plan", "--runtime", "flare", "--history", default_url(tmp_path), "--scenario", "long-prompt", "--effect", "0.1"]) == 2
    assert "no trials of scenario 'long-prompt'" in capsys.readouterr().err


def test_plan_sizes_each_candidate_of_a_tournament_in_the_history(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Runs of three builds (a baseline and two candidates each): `plan --history` sizes every candidate
    against the baseline, each from its own starts."""
    rng = np.random.default_rng(8)
    means, sds = {"set4": 0.88, "set8": 0.90, "two_choice": 0.93}, {"set4": 0.004, "set8": 0.004, "two_choice": 0.016}
    folders = []
    for i in range(3):
        plan = Plan(run_id=f"t{i}", seed=i, lab="simulated-gb10", baseline="set4", candidates=("set8", "two_choice"),
                    scenarios=(history_sim.SCENARIO,), created=f"2026-01-0{i + 1}T00:00:00+00:00",
                    builds={b: BuildRecord(b, "baseline" if b == "set4" else "candidate", ref=f"c{i}") for b in means})
        starts = {b: [{history_sim.REQUEST: {history_sim.METRIC: float(m + rng.normal(0, sds[b]))}} for _ in range(4)]
                  for b, m in means.items()}
        folders.append(history_sim.write_folder(tmp_path, plan, starts))
    cli(capsys, "history", "import", "--reports-dir", str(tmp_path), *map(str, folders))
    args = ("plan", "--runtime", "flare", "--history", default_url(tmp_path), "--scenario", "reread-1g", "--effect", "0.03")
    out = json.loads(cli(capsys, *args, "--json"))
    assert out["baseline"] == "set4" and [c["candidate"] for c in out["candidates"]] == ["set8", "two_choice"]
    found = [next(s["sd"] for s in c["sizings"] if s["trials_per_build"] is not None) for c in out["candidates"]]
    assert 2 * found[0] < found[1]   # each candidate's own starts: two_choice's vary four times more
    text = cli(capsys, *args)
    assert "## Candidate `set8` against `set4`" in text and "## Candidate `two_choice` against `set4`" in text


def test_bad_history_url_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", "runs", "--history", "not a url"]) == 2
    assert "is not a SQLAlchemy URL; expected e.g. sqlite:///" in capsys.readouterr().err
    assert main(["history", "runs", "--history", "sqlite:////no/such/folder/h.sqlite"]) == 2
    assert "the folder /no/such/folder does not exist" in capsys.readouterr().err


@pytest.mark.slow
@ON_STEPPED
def test_page_loads_in_a_browser_with_every_run_and_its_trends(stepped: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A page written outside the reports folder: every run in the table, the change point in its
    trend's caption, each run linked to where its folder was recorded (these runs have no summary)."""
    folders = sorted(p for p in stepped.iterdir() if p.is_dir())
    out = cli(capsys, "history", "html", str(tmp_path / "page"), "--reports-dir", str(stepped))
    page = Path(out.strip())
    assert page == tmp_path / "page" / "index.html"
    driver = chromium()
    try:
        driver.get(page.as_uri())
        run_ids = driver.execute_script(
            "return [...document.querySelectorAll('#runs tr[data-run]')].map(r => r.dataset.run)")
        assert run_ids == [f.name for f in folders][::-1]   # newest first
        links = driver.execute_script("return [...document.querySelectorAll('#runs a.summary')].map(a => a.href)")
        assert links == [f.resolve().as_uri() for f in folders][::-1]
        trends = driver.execute_script(
            "return [...document.querySelectorAll('figure.trend')].map(f => [f.querySelector('svg').getBBox().width,"
            " f.querySelector('figcaption').textContent])")
        assert trends and all(width > 100 for width, _ in trends), trends
        assert any("changed between run019 (c19) and run020 (c20)" in caption for _, caption in trends), trends
        fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert all(name.startswith("data:") for name in fetched), fetched  # self-contained: no fetches
        assert browser_problems(driver) == []
    finally:
        driver.quit()


@pytest.mark.slow
def test_history_url_from_the_inventory_or_the_command_line_is_checked(tmp_path: Path) -> None:
    from cache_qualify.config.inventory import load_inventory
    from cache_qualify.errors import InventoryError
    from tests.support.labfixtures import REPO, qualify_command, write_inventory

    inventory = write_inventory(tmp_path)
    text = inventory.read_text(encoding="utf-8")
    inventory.write_text(text + "history: postgresql://runner@db.lab/qualify\n", encoding="utf-8")
    assert load_inventory(inventory).history == "postgresql://runner@db.lab/qualify"
    inventory.write_text(text + "history: db.lab/qualify\n", encoding="utf-8")
    with pytest.raises(InventoryError, match=r"hosts.yaml:\d+: history: .*expected a SQLAlchemy URL such as "
                                             r"postgresql://.*found 'db.lab/qualify'"):
        load_inventory(inventory)
    inventory.write_text(text, encoding="utf-8")
    proc = subprocess.run(qualify_command(inventory, tmp_path / "reports", "--history", "nosuchdb://x/y"),
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # refused before any lab time
    assert "no driver for 'nosuchdb'" in proc.stdout + proc.stderr


def test_a_trend_of_a_misspelt_build_or_metric_offers_the_close_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folders = history_sim.write_series(tmp_path, history_sim.quiet_series(np.random.default_rng(3), runs=2))
    cli(capsys, "history", "import", "--reports-dir", str(tmp_path), *map(str, folders))
    assert len(json_array(cli(capsys, "history", "runs", "--json", "--reports-dir", str(tmp_path)))) == 2
    assert main(["history", "trend", "--build", "st4", "--reports-dir", str(tmp_path)]) == 2
    assert ("--build 'st4' is none of the history's (did you mean 'set4'?); it has set4"
            in capsys.readouterr().err)
    assert main(["history", "trend", "--build", "set4", "--metric", "hit_rat", "--reports-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--metric 'hit_rat' is none of the history's (did you mean 'hit_rate'?)" in err and "--build" not in err


def test_a_lab_s_calibration_is_kept_per_lab_and_scenario(history_url: str) -> None:
    """`history calibrate`'s record (tests/test_calibration.py has the arithmetic) on both databases: read back
    as written, the latest of a lab and scenario replacing the one before, another lab's apart."""
    key = CalibrationKey("gb10", "h" * 64, "flare", "flare-rowcache", "s" * 64)
    first = Calibration(key, "reread", "run1", "set4", "2026-12-07T10:00:00Z",
                        (Offset("A", -0.005, 0.001, 3, 0.004, 0.2), Offset("A-again", -0.03, 0.002, 3, 0.004, 0.8)))
    later = replace(first, run_id="run2", offsets=first.offsets[:1])
    elsewhere = replace(first, key=replace(key, lab="other"))
    with History(history_url) as history:
        for calibration in (first, elsewhere, later):
            history.record_calibration(calibration)
        assert history.calibration(lab="gb10", scenario="reread") == later
        assert history.calibration(lab="other", scenario="reread") == elsewhere
        assert history.calibration(lab="gb10", scenario="trace") is None
