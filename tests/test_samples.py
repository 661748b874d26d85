"""SampleStore on a real file system: round trip, damage, permissions, concurrent writers."""

from __future__ import annotations

import math
import multiprocessing
from dataclasses import replace
from pathlib import Path

import pytest

from cache_qualify.errors import SamplesError
from cache_qualify.samples import runfolder
from cache_qualify.samples.store import (EARLIER_TRIAL_COLUMNS, FAILED, OK, SAMPLE_COLUMNS, TRIAL_COLUMNS, SampleStore,
                                         TrialRow, new_attempt)


def trial_row(build: str, trial: int, attempt: str, outcome: str = OK) -> TrialRow:
    return TrialRow(run="r1", scenario="reread-1g", build=build, trial=trial, block=trial, position=0,
                    attempt=attempt, outcome=outcome, reason="" if outcome == OK else "rank 1 died, log: a,b\n\"x\"",
                    started_at="2025-01-01T00:00:00.000+00:00",
                    finished_at="2025-01-01T00:00:05.000+00:00")


def key(build: str, trial: int, attempt: str) -> dict[str, object]:
    return {"run": "r1", "scenario": "reread-1g", "build": build, "trial": trial, "block": trial, "attempt": attempt}


@pytest.fixture
def store(tmp_path: Path) -> SampleStore:
    s = SampleStore(tmp_path / "reports" / "r1")
    s.create()
    return s


def test_round_trip_keeps_values_and_only_finished_ok_trials(store: SampleStore) -> None:
    ok, failed, cut = new_attempt(), new_attempt(), new_attempt()
    store.add_samples(key("set4", 0, ok), "A", [("gb10-a", 0, "hits", 80300), ("all", -1, "hit_rate", 0.0941904898)])
    store.add_samples(key("set4", 1, failed), "A", [("gb10-a", 0, "hits", 1)])
    store.add_samples(key("set4", 2, cut), "A", [("gb10-a", 0, "hits", 2)])  # no trials.csv row: cut short
    store.add_samples(key("set4", 0, ok), "A", [("all", -1, "refused_exported", math.nan)])
    store.add_trial(trial_row("set4", 0, ok))
    store.add_trial(trial_row("set4", 1, failed, FAILED))

    samples = store.samples()
    assert list(samples.columns) == [*SAMPLE_COLUMNS, "group"]   # each sample with its trial's host group
    assert set(samples["attempt"]) == {ok}
    values = dict(zip(samples["metric"], samples["value"]))
    assert values["hits"] == 80300 and values["hit_rate"] == 0.0941904898  # repr round-trips floats exactly
    assert math.isnan(values["refused_exported"])
    assert samples["rank"].tolist() == [0, -1, -1]
    assert set(store.samples(only_ok=False)["attempt"]) == {ok, failed}

    trials = store.trials()
    assert list(trials.columns) == list(TRIAL_COLUMNS)
    assert trials["reason"].tolist()[1] == "rank 1 died, log: a,b\n\"x\""  # quoted: commas, newlines, quotes
    assert store.completed("reread-1g") == {("set4", 0), ("set4", 1)}
    assert store.completed("reread-4g") == set()


def test_create_twice_writes_one_header(store: SampleStore) -> None:
    store.create()
    assert store.samples_path.read_text(encoding="utf-8") == ",".join(SAMPLE_COLUMNS) + "\n"
    assert store.trials_path.read_text(encoding="utf-8") == ",".join(TRIAL_COLUMNS) + "\n"


def test_torn_last_line_is_dropped(store: SampleStore) -> None:
    attempt = new_attempt()
    store.add_samples(key("set4", 0, attempt), "A", [("gb10-a", 0, "hits", 5), ("gb10-b", 1, "hits", 6)])
    store.add_trial(trial_row("set4", 0, attempt))
    with store.samples_path.open("a", encoding="utf-8") as f:
        f.write("r1,reread-1g,set4,0,0,")  # a crash in the middle of a write
    with store.trials_path.open("a", encoding="utf-8") as f:
        f.write("r1,reread-1g,two_choice,0")
    assert store.samples()["value"].tolist() == [5, 6]
    assert store.trials()["build"].tolist() == ["set4"]


def test_empty_file_is_an_error(store: SampleStore) -> None:
    store.samples_path.write_text("", encoding="utf-8")
    with pytest.raises(SamplesError, match=r"samples\.csv is empty: the run recorded nothing \(not even the header\)"):
        store.samples()


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SamplesError, match=r"trials\.csv does not exist; is this a run folder written by "
                                           r"cache-qualify\?"):
        SampleStore(tmp_path).trials()


def test_wrong_header_names_expected_and_found(store: SampleStore) -> None:
    store.trials_path.write_text("run,build,outcome\nr1,set4,ok\n", encoding="utf-8")
    with pytest.raises(SamplesError, match=r"trials\.csv: expected the header run,scenario,build,trial,.*"
                                           r"finished_at,group, found run,build,outcome"):
        store.trials()


def test_damaged_middle_line_names_the_line(store: SampleStore) -> None:
    attempt = new_attempt()
    for request in ("A", "B"):
        store.add_samples(key("set4", 0, attempt), request, [("gb10-a", 0, "hits", 1)])
    lines = store.samples_path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[1] = "r1,reread-1g,set4\n"  # the first data row lost fields
    store.samples_path.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(SamplesError, match=r"samples\.csv: line 2 has the wrong number of fields \(expected 11\); "
                                           r"the file is damaged"):
        store.samples(only_ok=False)


def test_unwritable_run_folder_names_the_folder(tmp_path: Path) -> None:
    # a regular file where the reports folder should be: unwritable even for root
    (tmp_path / "reports").write_text("not a folder", encoding="utf-8")
    run_dir = tmp_path / "reports" / "r1"
    with pytest.raises(SamplesError, match=rf"cannot write the run folder {run_dir}: .+; choose a writable "
                                           rf"--reports-dir"):
        SampleStore(run_dir).create()


def _writer(run_dir: str, worker: int, rows: int) -> None:
    store = SampleStore(Path(run_dir))
    attempt = f"w{worker}"
    for i in range(rows):
        # long rows: a write larger than a pipe buffer would expose any interleaving
        store.add_samples(key(f"build-{worker}", i, attempt), f"request-{i}",
                          [(f"host-{worker}-{'x' * 200}", worker, f"metric-{j}", i * 1000 + j) for j in range(30)])
        store.add_trial(trial_row(f"build-{worker}", i, attempt))


@pytest.mark.slow
def test_concurrent_appends_from_processes_do_not_interleave(store: SampleStore) -> None:
    workers, rows = 4, 40
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(store.run_dir), w, rows)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    samples = store.samples(only_ok=False)  # every line parses: no torn or merged rows
    assert len(samples) == workers * rows * 30
    for w in range(workers):
        mine = samples[samples["build"] == f"build-{w}"]
        assert (mine["host"] == f"host-{w}-{'x' * 200}").all() and (mine["rank"] == w).all()
        assert mine["value"].tolist() == [i * 1000 + j for i in range(rows) for j in range(30)]
    # each request's rows are contiguous in the file (one append per request)
    runs = (samples["build"] + samples["request"]).ne((samples["build"] + samples["request"]).shift()).sum()
    assert runs == workers * rows
    assert len(store.trials()) == workers * rows


def test_torn_header_is_an_error(store: SampleStore) -> None:
    store.trials_path.write_text("run,scenario,bui", encoding="utf-8")
    with pytest.raises(SamplesError, match=r"trials\.csv has no complete header line"):
        store.trials()


def test_non_numeric_trial_names_the_line_and_column(store: SampleStore) -> None:
    store.add_trial(trial_row("set4", 0, new_attempt()))
    text = store.trials_path.read_text(encoding="utf-8").replace(",set4,0,0,", ",set4,zero,0,")
    store.trials_path.write_text(text, encoding="utf-8")
    with pytest.raises(SamplesError, match=r"trials\.csv: line 2 has trial 'zero', expected a whole number"):
        store.trials()


def test_append_to_a_vanished_folder_names_the_file(store: SampleStore) -> None:
    for path in (store.samples_path, store.trials_path):
        path.unlink()
    store.run_dir.rmdir()
    with pytest.raises(SamplesError, match=rf"cannot append to {store.samples_path}: .+; the samples measured "
                                           rf"from here on would be lost"):
        store.add_samples(key("set4", 0, "a"), "A", [("gb10-a", 0, "hits", 1)])


def test_a_resumed_run_appends_after_a_torn_row_without_gluing_to_it(tmp_path: Path) -> None:
    """A crash mid-write leaves a torn last row; the resumed run sets it aside and appends cleanly."""
    store = SampleStore(tmp_path / "run")
    store.create()
    key = {"run": "r", "scenario": "s", "build": "b", "trial": 0, "block": 0, "attempt": "a1"}
    store.add_samples(key, "A", [("h", 0, "hits", 1.0)])
    with store.samples_path.open("a", encoding="utf-8") as f:
        f.write("r,s,b,0,0,a1,A,h,0,misse")  # the crash
    SampleStore(tmp_path / "run").create()  # the resumed run
    store.add_samples(key, "A", [("h", 0, "misses", 2.0)])
    lines = store.samples_path.read_text(encoding="utf-8").splitlines()
    assert lines[-2:] == ["r,s,b,0,0,a1,A,h,0,hits,1", "r,s,b,0,0,a1,A,h,0,misses,2"]
    assert (tmp_path / "run" / "samples.csv.torn").read_text(encoding="utf-8") == "r,s,b,0,0,a1,A,h,0,misse\n"


# --- one owner of the run folder's names ----------------------------------------------------------

def _spelled(text: str) -> bool:
    """Whether `text` names a file or folder of the run folder (not only mentions a word)."""
    names = (runfolder.PLAN_FILE, runfolder.SAMPLES_FILE, runfolder.TRIALS_FILE, runfolder.OUTCOME_FILE,
             runfolder.MERGED_VERDICTS_FILE, runfolder.PROVENANCE_FILE, runfolder.SUMMARY_FILE, runfolder.JUNIT_FILE)
    folders = (runfolder.PLOTS_DIR, runfolder.LOGS_DIR, runfolder.CLAIMS_DIR, runfolder.PREFLIGHT_DIR)
    return (any(name in text for name in names) or text.startswith(("verdicts-", "arms-", "facts-"))
            or any(text == d or text.startswith(f"{d}/") or f"/{d}" in text for d in folders))


def test_only_the_run_folder_module_spells_its_file_names() -> None:
    """Every other module of the package asks samples.runfolder for a run folder's paths (docstrings
    may describe the files; code may not spell them)."""
    import ast

    package = Path(runfolder.__file__).resolve().parent.parent
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == Path(runfolder.__file__).resolve():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        found += [f"{path.relative_to(package)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docstrings and _spelled(node.value)]
    assert not found, "run-folder names spelled outside samples/runfolder.py:\n" + "\n".join(found)
    assert _spelled("reports/r1/plan.json") and _spelled("logs/") and not _spelled("the logs of a rank")


def test_a_plan_from_before_or_after_a_field_was_added_still_loads(tmp_path: Path) -> None:
    """Fields are added with a default: a plan written before one existed loads with it, a plan with a
    field this suite does not know loads without it, and each says the version it was written as."""
    from cache_qualify.samples.records import PLAN_VERSION, Plan

    old = {"run_id": "r1", "seed": 7, "candidate": "two_choice", "scenarios": ["reread-1g"]}
    plan = Plan.from_json(old, path=tmp_path / "plan.json")
    assert (plan.version, plan.candidates, plan.builds, plan.history) == (1, ("two_choice",), {}, None)
    runfolder.create(tmp_path / "new", Plan(run_id="new", seed=3, candidates=("set8",)))
    written = runfolder.read_plan(tmp_path / "new")
    assert written.version == PLAN_VERSION and written.candidate == "set8"
    newer = {**old, "version": PLAN_VERSION + 1, "quantities": {"readiness_wait": {"unit": "ns"}}}
    assert Plan.from_json(newer, path=tmp_path / "plan.json").version == PLAN_VERSION + 1
    with pytest.raises(SamplesError, match=r"plan\.json: seed: input should be a valid integer.*found 'x'"):
        Plan.from_json({**old, "seed": "x"}, path=tmp_path / "plan.json")


# trials.csv rows as earlier versions wrote them: with startup_s and kv_pages, with and without the group
EARLIER_ROWS = ("r1,reread-1g,set4,0,0,0,{a},ok,,1.25,41358,2025-01-01T00:00:00.000+00:00,"
                "2025-01-01T00:00:05.000+00:00{group}\n")


@pytest.mark.parametrize("header", EARLIER_TRIAL_COLUMNS, ids=["with-group", "before-groups"])
def test_a_trials_file_of_an_earlier_version_is_read_without_its_fixed_columns_and_never_appended_to(
        store: SampleStore, header: tuple[str, ...]) -> None:
    first = new_attempt()
    group = ",tp-1" if "group" in header else ""
    store.trials_path.write_text(",".join(header) + "\n" + EARLIER_ROWS.format(a=first, group=group),
                                 encoding="utf-8")
    store.add_samples(key("set4", 0, first), "startup", [("all", -1, "kv_pages", 41358)])
    trials = store.trials()
    assert list(trials.columns) == list(TRIAL_COLUMNS) and list(trials["attempt"]) == [first]
    assert list(trials["group"]) == [group.lstrip(",")]
    assert store.samples()["value"].tolist() == [41358]   # the per-start value, by its name in samples.csv
    before = store.trials_path.read_bytes()
    with pytest.raises(SamplesError, match=rf"^{store.run_dir} was written by an earlier cache-qualify \(its "
                       r"trials\.csv has the columns startup_s, kv_pages\), which this one cannot continue; "
                       r"start a new run"):
        store.add_trial(trial_row("set4", 1, new_attempt()))
    assert store.trials_path.read_bytes() == before


def test_kept_samples_are_what_samples_csv_holds_at_every_trial(store: SampleStore) -> None:
    """A run keeps its scenario's samples as its trials end (read from disk once, for what a resume
    finds there): at every trial the frame is the one reading samples.csv whole gives, row for row."""
    import pandas as pd

    from cache_qualify.samples.store import INVALID, KeptSamples

    def trial(build: str, number: int, outcome: str = OK, scenario: str = "reread-1g") -> None:
        attempt = new_attempt()
        values = [("all", -1, "hit_rate", 0.1 * number + (build == "two_choice") / 7), ("gb10-a", 0, "hits", 80300.0),
                  ("all", -1, "refused_exported", math.nan), ("all", -1, "readiness_wait_ns", 2.04e9 + number)]
        row = replace(trial_row(build, number, attempt, outcome), scenario=scenario, group="g1")
        store.add_samples({**key(build, number, attempt), "scenario": scenario}, "A", [v for v in values])
        store.add_trial(row)
        kept.add(row, [("A", *v) for v in values])

    def on_disk() -> pd.DataFrame:
        frame = store.samples()
        return frame[frame["scenario"] == "reread-1g"].reset_index(drop=True)

    kept = KeptSamples(store, "reread-1g")
    assert kept.frame().empty and list(kept.frame().columns) == [*SAMPLE_COLUMNS, "group"]
    trial("set4", 0)
    trial("two_choice", 0)
    kept = KeptSamples(store, "reread-1g")   # a resume: what is on disk, read once
    pd.testing.assert_frame_equal(kept.frame(), on_disk())
    for number, build, outcome, scenario in [(1, "set4", OK, "reread-1g"), (1, "two_choice", INVALID, "reread-1g"),
                                             (1, "two_choice", OK, "reread-1g"), (1, "set4", OK, "reread-4g"),
                                             (2, "set4", FAILED, "reread-1g"), (2, "two_choice", OK, "reread-1g")]:
        trial(build, number, outcome, scenario)
        pd.testing.assert_frame_equal(kept.frame(), on_disk())
    assert len(kept.frame()) == 4 * 5   # five ok trials of the scenario, four samples each


# A seeded run on the quiet simulated lab (two candidates, the short scenario), as the suite decided it
# when each look read samples.csv whole: each verdict's figures, and the sha256 of its samples' lines
# (build, trial, request, host, rank, metric, value; the wall-clock times left out), sorted.
# the margins that are shares of the baseline (hit rate's 1 %, KV pages' 2 %) are tested as c - k x b with the
# baseline mean's noise: their p-values; the difference is the builds' own (c - k x b shifted back by the estimated
# boundary read -2.500000000003638 here)
BEFORE_VERDICTS = [
    ("hit_rate-no_regression[A-new-start]", "set8", "pass", 0.9948190763244347, 0.9948330303320256,
     1.39540075909661e-05, 1.803937445695449e-06, 2, 2),
    ("kv_pages-no_regression[startup]", "set8", "pass", 41316.0, 41313.5, -2.5, 0.00025046471039833856,
     2, 2),
    ("bad_starts-no_excess[starts]", "set8", "pass", 0.0, 0.0, 0.0, 1.0, 2, 2),
    ("hit_rate-no_regression[A-new-start]", "two_choice", "pass", 0.9948190763244347, 0.9948330303320256,
     1.39540075909661e-05, 1.803937445695449e-06, 2, 2),
    ("kv_pages-no_regression[startup]", "two_choice", "pass", 41316.0, 41306.5, -9.5,
     0.0003663741816851687, 2, 2),
    ("bad_starts-no_excess[starts]", "two_choice", "pass", 0.0, 0.0, 0.0, 1.0, 2, 2)]
# The same run's lines before a quantity a build does not export stopped being written as NaN: 582, 48 of them
# NaN (refused_exported); these are the 534 others, which are all the run writes now.
BEFORE_SAMPLES = (534, "eacb24b03caa1c198f2650cd16f289b26a74a24d762ffab420910a9d8cb751b4")
TIMED = ("client_time_s", "startup_s")  # wall-clock: differ from run to run


@pytest.mark.slow
def test_a_seeded_run_measures_and_decides_as_when_each_look_read_the_file(tmp_path: Path) -> None:
    import hashlib
    import json

    from tests.support.labfixtures import run_qualify, small_scenario_option, write_inventory

    run = run_qualify(write_inventory(tmp_path, noise="quiet"), tmp_path / "reports", "--run-id", "det",
                      *small_scenario_option(tmp_path, "det-short"), "--trials", "2", "--max-trials", "4",
                      "--seed", "5", "--candidate", "set8,two_choice", timeout_s=600)
    assert run.returncode == 0, run.output
    folder = tmp_path / "reports" / "det"
    verdicts = json.loads((folder / "verdicts-det-short.json").read_text(encoding="utf-8"))
    keys = ("id", "arm", "outcome", "baseline_mean", "candidate_mean", "difference", "p_value", "trials_baseline",
            "trials_candidate")
    assert [tuple(v[k] for k in keys) for v in verdicts] == BEFORE_VERDICTS
    lines = (folder / "samples.csv").read_text(encoding="utf-8").splitlines()[1:]
    kept = sorted(",".join(line.split(",")[i] for i in (2, 3, 6, 7, 8, 9, 10)) for line in lines)
    kept = [line for line in kept if line.split(",")[5] not in TIMED]
    assert (len(kept), hashlib.sha256("\n".join(kept).encode()).hexdigest()) == BEFORE_SAMPLES
    assert all(line.split(",")[6] != "nan" for line in kept)   # no stand-in for what was not measured


@pytest.mark.slow
def test_a_runs_end_parses_trials_csv_once_and_its_predictions_are_read_once(tmp_path: Path) -> None:
    """The run's end hands one folder to the outcome, the report, the history and the terminal: trials.csv is
    parsed once there, however many of them read it. Before the end the predictions file is read once (the
    recorder's, before its first trial), however many prediction tests and hit-rate verdicts show them: the
    gate takes them from what the qualification holds."""
    from tests.support.countparses import PARSES_ENV, PREDICTION_READS_ENV
    from tests.support.labfixtures import run_qualify, small_scenario, write_inventory

    scenario = small_scenario(tmp_path, "parsed-once")
    counted, read = tmp_path / "parses", tmp_path / "prediction-reads"
    run = run_qualify(write_inventory(tmp_path), tmp_path / "reports", "--scenario", str(scenario),
                      "-p", "tests.support.countparses", env={PARSES_ENV: str(counted), PREDICTION_READS_ENV: str(read)},
                      timeout_s=500)
    assert run.returncode in (0, 1) and (run.run_dir() / "summary.md").is_file(), run.output
    assert int(counted.read_text(encoding="utf-8")) <= 1, counted.read_text(encoding="utf-8")
    cases = run.testcases()
    shown = [name for name in cases if name.startswith("test_prediction[")
             or any(p.get("name", "").startswith("predicted_hit_rate") for p in cases[name].iter("property"))]
    assert len(shown) >= 3, sorted(cases)       # every build's prediction test and the hit-rate verdicts
    assert int(read.read_text(encoding="utf-8")) == 1, read.read_text(encoding="utf-8")
