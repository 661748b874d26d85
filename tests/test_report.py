"""The RowCache study of a run folder, rendered from real files written through SampleStore.

A small synthetic run (three hosts, two builds, three requests, four valid
trials per build, one start that failed, one attempt cut short) is written the
way a qualification writes it, with verdicts from `cache_qualify.stats.verdict.evaluate`;
the tests check the rendered numbers against values computed here.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from cache_qualify.cli import main
from cache_qualify.errors import SamplesError
from cache_qualify.report.markdown import estimate, show
from cache_qualify.report.tables import fmt
from cache_qualify.report.provenance import provenance
from cache_qualify.report.render import render_run, verdict_table
from cache_qualify.samples.rundata import load_run, scenario_description
from cache_qualify.samples.records import dump
from cache_qualify.units import unit
from cache_qualify.samples.store import OK, START_FAILED, SampleStore, TrialRow, new_attempt
from cache_qualify.session.setup import builds_of
from cache_qualify.config.inventory import load_inventory
from cache_qualify.config.scenario import find_scenario
from cache_qualify.stats.verdict import Assertion, evaluate

SCENARIO = "reread-1g"  # a shipped scenario, so provenance can hash its file
BASE, CAND = "set4", "two_choice"
HOSTS = (("gb10-a", 0), ("gb10-b", 1), ("gb10-c", 2))
REQUESTS = ("A", "B-new-start", "A-third-read")
TRIALS = 4
LOOKUPS = 1_000_000  # per host and request

# hit rate per build and request; each host and trial moves it a little
HIT_RATE = {BASE: {"A": 0.095, "B-new-start": 0.8706, "A-third-read": 0.8785},
            CAND: {"A": 0.100, "B-new-start": 0.9951, "A-third-read": 0.8790}}
KV_PAGES = {BASE: [41358, 41301, 41290, 41400], CAND: [41350, 41320, 41280, 41390]}

INVENTORY = """\
lab: report-lab
hosts:
  - {name: gb10-a, address: 127.0.0.11, rank: 0, transport: local}
  - {name: gb10-b, address: 127.0.0.12, rank: 1, transport: local}
  - {name: gb10-c, address: 127.0.0.13, rank: 2, transport: local}
server:
  runtime: flare
  command: "{python} -m cache_qualify.sim.server --rank {rank} {flags}"
  http_port: 18080
  kv_pages: {metric: flare_kv_cache_pages}
builds:
  set4: {path: bin/server-a, ref: bbad44fe, flags: [--sim-policy, set4], description: four-way sets}
  two_choice: {path: bin/server-b, ref: 0572fd12, flags: [--sim-policy, two_choice]}
baseline: set4
candidate: two_choice
"""

START_FAILURE = ("host gb10-b rank 1: rank exited during startup (exit status 3)\n"
                 "--- last lines of the rank's log ---\n"
                 "error: cannot allocate the KV cache: 0 pages left")


@dataclass
class Expected:
    """What the synthetic run holds, computed while writing it."""

    hit_rate: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)  # (build, request, host)
    evictions: dict[tuple[str, str], list[float]] = field(default_factory=dict)      # (build, request), all hosts
    wait_ns: dict[tuple[str, str], list[float]] = field(default_factory=dict)        # rank 0's
    time_s: dict[tuple[str, str], list[float]] = field(default_factory=dict)


def _host_rows(build: str, request: str, trial: int, host: str, rank: int) -> dict[str, float]:
    rate = HIT_RATE[build][request] + 0.002 * (trial - 1.5) + 0.001 * rank
    hits = round(rate * LOOKUPS)
    misses = LOOKUPS - hits
    evictions = 1000 * (rank + 1) + 137 * trial + (50_000 if build == BASE else 0)
    refused = misses // 10
    rows_added = misses - evictions - refused
    return {"hits": hits, "misses": misses, "evictions": evictions, "inserts": rows_added,
            "rows_added": rows_added, "refused_inserts": refused, "refused_exported": math.nan,
            "resident_rows": 2_000_000, "capacity_rows": 3_613_836, "hit_rate": hits / LOOKUPS,
            "readiness_wait_ns": int(6400 * misses + 1_000_000 * trial)}


def _write_request(store: SampleStore, key: dict[str, object], build: str, request: str, trial: int,
                   expected: Expected | None) -> None:
    per_host = {h: _host_rows(build, request, trial, h, r) for h, r in HOSTS}
    rows = [(h, r, m, v) for h, r in HOSTS for m, v in per_host[h].items()]
    total = {m: sum(per_host[h][m] for h, _ in HOSTS) for m in ("hits", "misses", "evictions")}
    rate = total["hits"] / (total["hits"] + total["misses"])
    wait = per_host["gb10-a"]["readiness_wait_ns"]
    time_s = 5.0 + 0.01 * trial + (0.5 if build == BASE else 0.0)
    rows += [("all", -1, "hits", total["hits"]), ("all", -1, "misses", total["misses"]),
             ("all", -1, "evictions", total["evictions"]), ("all", -1, "hit_rate", rate),
             ("all", -1, "readiness_wait_ns", wait),
             ("all", -1, "readiness_wait_sum_ns", sum(per_host[h]["readiness_wait_ns"] for h, _ in HOSTS)),
             ("all", -1, "refused_inserts", sum(per_host[h]["refused_inserts"] for h, _ in HOSTS)),
             ("all", -1, "client_time_s", time_s)]
    store.add_samples(key, request, rows)
    if expected is not None:
        for h, _ in HOSTS:
            expected.hit_rate.setdefault((build, request, h), []).append(per_host[h]["hit_rate"])
        expected.hit_rate.setdefault((build, request, "all"), []).append(rate)
        expected.evictions.setdefault((build, request), []).append(total["evictions"])
        expected.wait_ns.setdefault((build, request), []).append(wait)
        expected.time_s.setdefault((build, request), []).append(time_s)


def _trial(store: SampleStore, build: str, trial: int, *, outcome: str = OK, reason: str = "",
           expected: Expected | None = None, record: bool = True) -> str:
    """One trial as TrialRunner writes it; `record=False` leaves it cut short (no trials.csv row)."""
    attempt = new_attempt()
    key = {"run": "r1", "scenario": SCENARIO, "build": build, "trial": trial, "block": trial, "attempt": attempt}
    store.add_samples(key, "startup", [(h, r, "page_cache_dropped", 1.0) for h, r in HOSTS])
    pages = (KV_PAGES[build][trial] if record else 1000) if outcome == OK else -1  # 1000: would show if counted
    if outcome == OK:
        store.add_samples(key, "startup", [*((h, r, "kv_pages", float(pages + 10 * r)) for h, r in HOSTS),
                                           ("all", -1, "kv_pages", float(pages)), ("all", -1, "startup_s", 12.5)])
        for request in REQUESTS:
            _write_request(store, key, build, request, trial, expected if record else None)
    if record:
        store.add_trial(TrialRow(run="r1", scenario=SCENARIO, build=build, trial=trial, block=trial,
                                 position=0, attempt=attempt, outcome=outcome, reason=reason,
                                 started_at="2026-01-01T00:00:00+00:00", finished_at="2026-01-01T00:01:00+00:00"))
    return attempt


ASSERTIONS = (
    Assertion("hit_rate", "B-new-start", "gain", True, min_effect=0.02),
    Assertion("hit_rate", "A-third-read", "gain", True, min_effect=0.02),
    Assertion("readiness_wait_ns", "B-new-start", "gain", False, min_effect=2e8),
    Assertion("hit_rate", "A", "no_regression", True, margin=0.05),
    Assertion("kv_pages", "startup", "no_regression", True, margin=0.02),
)


def _verdicts(expected: Expected, assertions: tuple[Assertion, ...]) -> list[dict[str, object]]:
    def pair(a: Assertion) -> tuple[list[float], list[float]]:
        if a.metric == "kv_pages":
            return [float(p) for p in KV_PAGES[BASE]], [float(p) for p in KV_PAGES[CAND]]
        table = expected.hit_rate if a.metric == "hit_rate" else expected.wait_ns
        key = (lambda b: (b, a.request, "all")) if a.metric == "hit_rate" else (lambda b: (b, a.request))
        return table[key(BASE)], table[key(CAND)]  # type: ignore[index]

    return [v.as_dict() for v in evaluate(assertions, {a.id: pair(a) for a in assertions}, alpha=0.01)]


@dataclass(frozen=True)
class Run:
    path: Path
    inventory: Path
    expected: Expected
    verdicts: list[dict[str, object]]
    failed_attempt: str


def write_run(root: Path, *, failing: bool) -> Run:
    """A run folder under root/reports/ with the inventory at root/hosts.yaml, as `pytest qualify` leaves it."""
    inventory = root / "hosts.yaml"
    inventory.write_text(INVENTORY, encoding="utf-8")
    run = root / "reports" / "r1"
    store = SampleStore(run)
    store.create()
    (run / "logs").mkdir()
    expected = Expected()
    for trial in range(TRIALS):
        for build in (BASE, CAND):
            _trial(store, build, trial, expected=expected)
    failed = ""
    if failing:
        failed = _trial(store, CAND, TRIALS, outcome=START_FAILED, reason=START_FAILURE)
        (run / "logs" / f"{SCENARIO}-{CAND}-t{TRIALS}-{failed}-gb10-b-rank1.log").write_text(
            "error: cannot allocate the KV cache\n", encoding="utf-8")
        _trial(store, BASE, TRIALS, record=False)  # cut short: its samples must not count
    assertions = ASSERTIONS if failing else tuple(a for a in ASSERTIONS if a.request != "A-third-read")
    verdicts = _verdicts(expected, assertions)
    (run / f"verdicts-{SCENARIO}.json").write_text(json.dumps(verdicts, indent=2) + "\n", encoding="utf-8")
    # the plan as a run writes it when it starts: its builds as the inventory described them then
    plan = {"run_id": "r1", "seed": 1234, "lab": "report-lab", "inventory": "hosts.yaml",
            "inventory_sha256": hashlib.sha256(inventory.read_bytes()).hexdigest(), "baseline": BASE,
            "candidate": CAND, "scenarios": [SCENARIO], "created": "2026-01-01T00:00:00+00:00",
            "command": ["pytest", "qualify", "--hosts", "hosts.yaml"],
            "builds": {label: dump(b) for label, b in builds_of(load_inventory(inventory)).items()}, "version": 2}
    (run / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    facts = {h: {"kernel": "6.8.0-1015-nvidia", "hostname": f"spark-{r}", "address": f"127.0.0.1{r + 1}",
                 "rank": r} for h, r in HOSTS}
    (run / "facts-default.json").write_text(json.dumps(facts), encoding="utf-8")
    return Run(run, inventory, expected, verdicts, failed)


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run = write_run(tmp_path_factory.mktemp("failing"), failing=True)
    render_run(run.path)
    return run


@pytest.fixture(scope="module")
def summary(failing_run: Run) -> str:
    return (failing_run.path / "summary.md").read_text(encoding="utf-8")


def _row(summary: str, first_cell: str, *, after: str) -> list[str]:
    """Cells of the first table row starting with `first_cell` after the heading `after`."""
    text = summary[summary.index(after):]
    line = next(line for line in text.splitlines() if line.startswith(f"| {first_cell} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def _reference(values: list[float], scale: float, decimals: int, suffix: str = "", upper: float = math.inf) -> str:
    """Mean ± 95 % CI half-width, computed with scipy's t interval (the reference); a quantity at most `upper`
    (a fraction's 1, its least then 0) whose interval reaches past its bounds: the clipped ends."""
    mean = float(np.mean(values))
    low, high = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
    if math.isfinite(upper) and (low < 0 or high > upper):
        return (f"{mean * scale:,.{decimals}f}{suffix} ({max(low, 0.0) * scale:,.{decimals}f} to "
                f"{min(high, upper) * scale:,.{decimals}f})")
    return f"{mean * scale:,.{decimals}f}{suffix} ± {(mean - low) * scale:,.{decimals}f}"


# --- numbers -------------------------------------------------------------------------------------

def test_formats_follow_the_domain_report() -> None:
    assert fmt(0.9506, "fraction") == "95.06 %"
    assert fmt(175_506, "rows", suffix=False) == "175,506"
    assert fmt(2.14e9, "ns") == "2.140 s"
    assert fmt(-0.0203, "fraction", signed=True) == "-2.03 pp"
    assert fmt(math.nan, "fraction") == "n/a"
    # a verdict file written before units were recorded: the study's unit of its metric
    assert fmt(2.14e9, "", metric="readiness_wait_ns") == "2.140 s"
    assert fmt(41_301, "", metric="kv_pages") == "41,301 pages"


def test_estimate_matches_the_t_interval_and_degrades_without_noise_estimate() -> None:
    values = [0.86, 0.87, 0.88, 0.875]
    low, high = stats.t.interval(0.95, 3, loc=np.mean(values), scale=stats.sem(values))
    est = estimate([*values, math.nan])
    assert est.n == 4 and est.mean == pytest.approx(np.mean(values))
    assert est.half_width == pytest.approx((high - low) / 2)
    single = estimate([0.5])
    assert single.n == 1 and math.isnan(single.half_width) and show(single, unit("fraction"), suffix=True) == "50.00 %"


# --- summary.md ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_summary_leads_with_run_lab_builds_and_overall_verdict(summary: str) -> None:
    head = summary.splitlines()[:5]
    assert head[0] == "# cache-qualify run `r1`: FAIL"
    # the reviewer's answer first: a trial failed, so the run is undecided and says how to go on
    assert head[2] == "**Undecided**: reread-1g: build two_choice trial 5: start_failed: host gb10-b rank 1: rank " \
        "exited during startup (exit status 3); once that is mended, " \
        "rerun with `pytest qualify --hosts hosts.yaml`.", head[2]
    assert "Lab `report-lab`: baseline `set4` vs candidate `two_choice`. **Overall: FAIL.**" in head[4]


@pytest.mark.parametrize("request_name", REQUESTS)
def test_request_table_has_means_and_cis_over_all_hosts(failing_run: Run, summary: str, request_name: str) -> None:
    cells = _row(summary, request_name, after="### Requests, all hosts")
    e = failing_run.expected
    builds = (BASE, CAND)
    # columns: hit rate x2, evictions x2, refused x2, readiness wait x2, time x2
    assert cells[1:3] == [_reference(e.hit_rate[(b, request_name, "all")], 100, 2, " %", upper=1.0) for b in builds]
    assert cells[3:5] == [_reference(e.evictions[(b, request_name)], 1, 0) for b in builds]
    assert cells[7:9] == [_reference(e.wait_ns[(b, request_name)], 1e-9, 3) for b in builds]
    assert cells[9:11] == [_reference(e.time_s[(b, request_name)], 1, 3) for b in builds]
    assert "," in cells[3]  # thousands separators, as in the RowCache study


def test_host_table_has_every_host(failing_run: Run, summary: str) -> None:
    header = _row(summary, "Request", after="### Hit rate per host")
    assert header[1:] == [f"{h} (rank {r}), {b}" for h, r in HOSTS for b in (BASE, CAND)]
    cells = _row(summary, "B-new-start", after="### Hit rate per host")
    assert cells[5] == _reference(failing_run.expected.hit_rate[(BASE, "B-new-start", "gb10-c")], 100, 2, " %",
                                  upper=1.0)


def test_every_per_start_quantity_per_build(summary: str) -> None:
    """By the names and titles the runtime declares, over the starts with a trial row (not the cut-short one)."""
    cells = _row(summary, "KV pages", after="### Per start")
    assert cells[1:3] == [BASE, "4"]
    assert cells[3] == _reference([float(p) for p in KV_PAGES[BASE]], 1, 0)
    assert cells[4:6] == ["41,290", "41,400"]
    assert _row(summary, "Startup (s)", after="### Per start")[1:3] == [BASE, "4"]


def test_trials_table_and_failure_with_reason_and_log(failing_run: Run, summary: str) -> None:
    assert _row(summary, CAND, after="### Trials")[1:] == ["5", "4", "0", "1", "0"]
    assert _row(summary, BASE, after="### Trials")[1:] == ["4", "4", "0", "0", "0"]  # the cut-short one is not a trial
    assert f"- **{CAND} trial {TRIALS + 1}: start_failed** (logs: [gb10-b rank 1](logs/" in summary
    assert failing_run.failed_attempt in summary
    for line in START_FAILURE.splitlines():
        assert f"  {line}" in summary


def test_verdicts_table_and_reasons(failing_run: Run, summary: str) -> None:
    section = summary[summary.index("### Verdicts"):]
    for v in failing_run.verdicts:
        cells = _row(section, f"`{v['id']}`", after="### Verdicts")
        assert cells[1] == str(v["outcome"]).upper()
        assert cells[-1] == f"{TRIALS} / {TRIALS}"   # no "Trials needed" column: no verdict has the figure
        if v["outcome"] != "pass":   # said once: the outcome in bold, then the reason without its own label
            assert f"- `{v['id']}` **{str(v['outcome']).upper()}**: {str(v['reason']).split(': ', 1)[1]}" in section
    third = next(v for v in failing_run.verdicts if v["id"] == "hit_rate-gain[A-third-read]")
    assert third["outcome"] != "pass"  # the synthetic data has no gain there
    cells = _row(section, "`hit_rate-gain[B-new-start]`", after="### Verdicts")
    b = next(v for v in failing_run.verdicts if v["id"] == "hit_rate-gain[B-new-start]")
    assert cells[1:6] == ["PASS", f"{100 * float(b['baseline_mean']):.2f} %",  # type: ignore[arg-type]
                          f"{100 * float(b['candidate_mean']):.2f} %",  # type: ignore[arg-type]
                          f"{100 * float(b['difference']):+.2f} pp",  # type: ignore[arg-type]
                          f"{100 * float(b['null_boundary']):+.2f} pp"]  # type: ignore[arg-type]
    # the interval's header says its level to the digits it has (a sequential look's 99.78 %, not "100 %")
    assert "| 98 % CI |" in section.replace("---:", "")
    assert "where lower is better (readiness wait, time), when its upper end is below it" in section


def test_plots_are_png_files_linked_from_the_summary(failing_run: Run, summary: str) -> None:
    for name in (f"{SCENARIO}-requests.png", f"{SCENARIO}-start-kv-pages.png", f"{SCENARIO}-start-startup-s.png"):
        data = (failing_run.path / "plots" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
        width, height = struct.unpack(">II", data[16:24])
        assert width >= 300 and height >= 200
        assert f"(plots/{name})" in summary


# --- verdicts.json, provenance.json, terminal lines ------------------------------------------------

def test_verdicts_json_merges_scenarios(failing_run: Run) -> None:
    merged = json.loads((failing_run.path / "verdicts.json").read_text(encoding="utf-8"))
    assert merged["run_id"] == "r1" and merged["overall"] == "fail"
    assert [v["id"] for v in merged["scenarios"][SCENARIO]] == [a.id for a in ASSERTIONS]


def test_provenance_records_builds_hosts_and_hashes(failing_run: Run) -> None:
    prov = json.loads((failing_run.path / "provenance.json").read_text(encoding="utf-8"))
    digest = hashlib.sha256(failing_run.inventory.read_bytes()).hexdigest()
    assert prov["inventory"] == {"path": "hosts.yaml", "sha256": digest}
    assert prov["builds"][BASE] == {"role": "baseline", "path": "bin/server-a", "ref": "bbad44fe",
                                    "flags": ["--sim-policy", "set4"], "description": "four-way sets",
                                    "source": "path", "digest": None}
    assert prov["builds"][CAND]["ref"] == "0572fd12"
    assert prov["hosts"]["default"]["gb10-b"]["kernel"] == "6.8.0-1015-nvidia"
    assert prov["seed"] == 1234 and prov["command"][:2] == ["pytest", "qualify"]
    scenario_hash = hashlib.sha256(find_scenario(SCENARIO).read_bytes()).hexdigest()
    assert prov["scenarios"][SCENARIO]["sha256"] == scenario_hash
    assert prov["software"]["packages"]["numpy"] == np.__version__


def test_verdict_table_lines(failing_run: Run) -> None:
    lines = verdict_table(failing_run.path)
    assert len(lines) == len(ASSERTIONS) + 1
    b_line = next(line for line in lines if "hit_rate-gain[B-new-start]" in line)
    b = next(v for v in failing_run.verdicts if v["id"] == "hit_rate-gain[B-new-start]")
    assert b_line.startswith("PASS")
    assert (f"{100 * float(b['baseline_mean']):.2f} % -> "  # type: ignore[arg-type]
            f"{100 * float(b['candidate_mean']):.2f} %") in b_line  # type: ignore[arg-type]
    assert f"p adj {float(b['p_adjusted']):.3g}" in b_line  # type: ignore[arg-type]
    counts = {o: sum(v["outcome"] == o for v in failing_run.verdicts) for o in ("pass", "fail", "inconclusive")}
    assert lines[-1] == (f"overall: FAIL ({counts['pass']} pass, {counts['fail']} fail, "
                         f"{counts['inconclusive']} inconclusive over 1 scenario(s))")


def test_clean_run_passes_and_tolerates_a_torn_last_line(tmp_path: Path) -> None:
    run = write_run(tmp_path, failing=False)
    with (run.path / "samples.csv").open("a", encoding="utf-8") as f:
        f.write("r1,reread-1g,set4,0,0,abc")  # a crash mid-write
    assert all(v["outcome"] == "pass" for v in run.verdicts)
    summary = render_run(run.path).read_text(encoding="utf-8")
    assert summary.startswith("# cache-qualify run `r1`: PASS")
    cells = _row(summary, "B-new-start", after="### Requests, all hosts")
    assert cells[1] == _reference(run.expected.hit_rate[(BASE, "B-new-start", "all")], 100, 2, " %", upper=1.0)
    assert verdict_table(run.path)[-1].startswith("overall: PASS")


def test_builds_are_the_plans_whatever_the_inventory_says_now(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build's ref and flags are what the run recorded when it started: an inventory edited or gone
    since changes nothing, and a plan from before runs recorded builds says so (nothing is guessed)."""
    run = write_run(tmp_path, failing=False)
    monkeypatch.chdir(tmp_path)
    run.inventory.write_text(INVENTORY.replace("ref: bbad44fe", "ref: feedc0de"), encoding="utf-8")
    assert provenance(load_run(run.path))["builds"][BASE]["ref"] == "bbad44fe"
    run.inventory.unlink()
    prov = provenance(load_run(run.path))
    assert prov["builds"][BASE] == {"role": "baseline", "path": "bin/server-a", "ref": "bbad44fe",
                                    "flags": ["--sim-policy", "set4"], "description": "four-way sets",
                                    "source": "path", "digest": None}
    assert prov["inventory"]["sha256"] == load_run(run.path).plan.inventory_sha256
    plan = json.loads((run.path / "plan.json").read_text(encoding="utf-8"))
    del plan["builds"], plan["version"]  # as plan.json was written before runs recorded their builds
    (run.path / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    assert provenance(load_run(run.path))["builds"][BASE] == {
        "role": "other", "unavailable": "not recorded: the run was made before runs recorded their builds"}


def test_a_scenario_without_verdicts_fails_after_a_failed_start(copied_run: Path) -> None:
    (copied_run / f"verdicts-{SCENARIO}.json").unlink()
    lines = verdict_table(copied_run)  # from the files, verdicts.json not rendered yet
    assert lines == ["FAIL  reread-1g: no verdict  the run stopped before the first look",
                     "overall: FAIL (0 pass, 0 fail, 0 inconclusive over 1 scenario(s))"]


# --- the command and its errors --------------------------------------------------------------------

@pytest.fixture
def copied_run(failing_run: Run, tmp_path: Path) -> Iterator[Path]:
    target = tmp_path / "reports" / "r1"
    shutil.copytree(failing_run.path, target)
    shutil.copy(failing_run.inventory, tmp_path / "hosts.yaml")
    for rendered in ("summary.md", "verdicts.json", "provenance.json"):
        (target / rendered).unlink()
    shutil.rmtree(target / "plots")
    yield target


@pytest.mark.slow
def test_cli_report_rerenders(copied_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(copied_run)]) == 0
    out = capsys.readouterr().out
    assert f"summary: {copied_run / 'summary.md'}" in out
    assert "overall: FAIL" in out
    assert (copied_run / "plots" / f"{SCENARIO}-requests.png").is_file()
    assert (copied_run / "provenance.json").is_file()


def test_cli_reports_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "nope: no such run folder; expected a folder reports/<run-id>/" in capsys.readouterr().err


def test_a_sequential_runs_tables_say_which_looks_trials_they_cover(copied_run: Path, summary: str) -> None:
    """Verdicts decided at a look of 2 trials per build beside tables over all 4: the summary says which
    covers what (a verdict's 1.278 s over 4 trials stood beside a Requests table's 0.916 s over 8)."""
    assert "the look that decided it" not in summary   # verdicts over every trial: nothing to tell apart
    path = copied_run / f"verdicts-{SCENARIO}.json"
    verdicts = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps([{**v, "trials_baseline": 2, "trials_candidate": 2} for v in verdicts]),
                    encoding="utf-8")
    section = render_run(copied_run, plots=False).read_text(encoding="utf-8").split("### Verdicts", 1)[1]
    assert (f"Trials: each verdict is over the trials of the look that decided it (its Trials column); the "
            f"tables above, of requests and starts, are over every valid trial of the run ({BASE} {TRIALS}, "
            f"{CAND} ") in section, section


def test_empty_samples_file_is_explained(copied_run: Path) -> None:
    (copied_run / "samples.csv").write_text("", encoding="utf-8")
    with pytest.raises(SamplesError, match=r"samples\.csv is empty: the run recorded nothing"):
        render_run(copied_run)


@pytest.mark.slow
def test_damaged_samples_file_is_explained(copied_run: Path) -> None:
    with (copied_run / "samples.csv").open("a", encoding="utf-8") as f:
        f.write("r1,reread-1g,set4\n")
    with pytest.raises(SamplesError, match=r"samples\.csv: line \d+ has the wrong number of fields"):
        render_run(copied_run)


def test_missing_plan_and_damaged_verdicts_are_explained(copied_run: Path) -> None:
    (copied_run / f"verdicts-{SCENARIO}.json").write_text('[{"id": "x"', encoding="utf-8")
    with pytest.raises(SamplesError, match=r"verdicts-reread-1g\.json: expected a list of verdicts as JSON, "
                                           r"found damaged JSON at line 1"):
        render_run(copied_run)
    (copied_run / "plan.json").unlink()
    with pytest.raises(SamplesError, match=r"plan\.json does not exist; every run writes it"):
        render_run(copied_run)


def test_the_summary_shows_the_scenarios_description_from_the_file_the_run_used(tmp_path: Path) -> None:
    run = write_run(tmp_path, failing=False)
    scenario_file = tmp_path / f"{SCENARIO}.yaml"
    shutil.copy(find_scenario(SCENARIO), scenario_file)
    plan = json.loads((run.path / "plan.json").read_text(encoding="utf-8"))
    plan.update(scenario_files={SCENARIO: str(scenario_file)},
                scenario_sha256={SCENARIO: hashlib.sha256(scenario_file.read_bytes()).hexdigest()})
    (run.path / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    render_run(run.path)
    summary = " ".join((run.path / "summary.md").read_text(encoding="utf-8").split())
    assert "without losing first-read hit rate or KV pages." in summary
    assert scenario_description(load_run(run.path), SCENARIO).startswith("Five requests as in the")
    scenario_file.write_text(scenario_file.read_text(encoding="utf-8") + "# edited after the run\n",
                             encoding="utf-8")
    assert scenario_description(load_run(run.path), SCENARIO) == ""   # not the file the run used
    scenario_file.unlink()
    assert scenario_description(load_run(run.path), SCENARIO) == ""


def test_the_description_the_setup_kept_is_shown_with_no_scenario_file_read(tmp_path: Path) -> None:
    run = write_run(tmp_path, failing=False)
    plan = json.loads((run.path / "plan.json").read_text(encoding="utf-8"))
    plan.update(scenario_files={SCENARIO: str(tmp_path / "gone.yaml")},
                scenario_descriptions={SCENARIO: "What the run checked, as its setup read it."})
    (run.path / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    assert scenario_description(load_run(run.path), SCENARIO) == "What the run checked, as its setup read it."
    render_run(run.path)
    assert "as its setup read it." in (run.path / "summary.md").read_text(encoding="utf-8")


def test_flagged_starts_are_listed_with_their_logs(copied_run: Path) -> None:
    """A start the verdicts set aside as far out (cache_qualify.stats.starts) is listed once, with its logs."""
    path = copied_run / f"verdicts-{SCENARIO}.json"
    verdicts = json.loads(path.read_text())
    flag = {"arm": "candidate", "trial": 1, "block": 1, "metric": "readiness_wait_ns",
            "requests": ["B-new-start"], "studentized_distance": [9.5], "excluded": True}
    for v in verdicts[:2]:
        v["flagged_starts"] = [flag]
    path.write_text(json.dumps(verdicts))
    summary = render_run(copied_run).read_text()
    names = ", ".join(f"{v['id']} (set aside)" for v in verdicts[:2])
    assert f"- **{CAND} trial 2**: {names}" in summary
    assert "Flagged starts (every value of a metric far out of the build's other starts):" in summary


def test_a_fractions_own_interval_stays_within_0_and_100_per_cent() -> None:
    """A hit rate near 1 (or near 0) whose t interval runs past 100 % (or below 0 %) is shown clipped to the
    values a fraction can take, with its ends; a count's interval is the usual mean ± half-width."""
    from cache_qualify.stats.intervals import Estimate
    from cache_qualify.units import unit

    assert show(Estimate(0.995, 0.01, 4), unit("fraction")) == "99.50 (98.50 to 100.00)"
    assert show(Estimate(0.004, 0.01, 4), unit("fraction")) == "0.40 (0.00 to 1.40)"
    assert show(Estimate(0.5, 0.01, 4), unit("fraction")) == "50.00 ± 1.00"
    assert show(Estimate(3.0, 5.0, 4), unit("pages")) == "3 ± 5"
