"""The change-point method's false-alarm and detection rates, measured on simulated series.

A series is a build's per-start values across runs, drawn from the simulated
lab's noise model (hit rate 0.860 with sd 0.001 between
starts, every start independent; four starts per run, the default scenario's
trials per build). Without a change, 30 runs; with one, 20 runs and then the
mean moved by 2 sd, seen after one, two and three further runs. Run
``python -m tests.support.history_sim`` to print the figures quoted in docs/history.md;
tests/test_history.py checks a quick version. Also here: run folders written
with the suite's own writers from such a series, and a lab's history of
qualifications (two builds, their refs, a bad start, a second runtime) for the
page; ``python -m tests.history_sim --page 36`` measures the page of 36 runs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np

from cache_qualify.config.profiles import resolve
from cache_qualify.history.changes import ALPHA, change_points
from cache_qualify.report.render import merged_verdicts, render_run
from cache_qualify.samples import runfolder
from cache_qualify.samples.records import BuildRecord, Plan, QuantityRecord, VerdictRecord
from cache_qualify.samples.rundata import load_run
from cache_qualify.samples.store import ALL, OK, SampleStore, TrialRow
from cache_qualify.stats.outcome import run_decision
from cache_qualify.stats.starts import Trials, flag_starts

STARTS = 4          # per run and build: the default scenario's trials
QUIET_RUNS = 30     # a series without a change
BEFORE = 20         # runs before the step
STEP_SD = 2.0       # the step, in start-to-start standard deviations
AFTER = (1, 2, 3)   # runs after the step when the series is looked at
# the simulated lab's set4 re-read hit rate (B with a new start) and its start-to-start SD
# (set-hash seeds; `cache-qualify noise` measures it)
MEAN, SD = 0.860, 0.001


def quiet_series(rng: np.random.Generator, runs: int = QUIET_RUNS) -> list[Sequence[float]]:
    return [list(rng.normal(MEAN, SD, STARTS)) for _ in range(runs)]


# other noise for the false-alarm rate: heavy tails (Student t, 3 degrees of freedom, scaled to SD),
# and runs that are off as a whole (a between-run sd of half the start-to-start sd), which the
# permutation of starts does not model
def _heavy_tails(rng: np.random.Generator) -> np.ndarray:
    return MEAN + SD * rng.standard_t(3, STARTS)


def _run_effect(rng: np.random.Generator) -> np.ndarray:
    return MEAN + SD * (0.5 * rng.normal() + rng.normal(size=STARTS))


NOISE = {"heavy tails (t3)": _heavy_tails, "run effect 0.5 sd": _run_effect}


def other_noise_false_alarms(series: int, *, seed: int, kinds: Sequence[str] = tuple(NOISE)) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    return {name: sum(bool(change_points([list(NOISE[name](rng)) for _ in range(QUIET_RUNS)], seed=i))
                      for i in range(series)) / series
            for name in kinds}


def step_series(rng: np.random.Generator, after: int) -> list[Sequence[float]]:
    return quiet_series(rng, BEFORE) + [list(rng.normal(MEAN + STEP_SD * SD, SD, STARTS)) for _ in range(after)]


@dataclass(frozen=True)
class Rates:
    series: int
    false_alarms: int                 # quiet series with any change point
    found_exact: dict[int, int]       # runs after the step -> series with a change at run BEFORE
    found_near: dict[int, int]        # ... within one run of it
    seconds: float

    def as_dict(self) -> dict[str, object]:
        n = self.series
        return {"series": n, "alpha": ALPHA, "false_alarm_rate": self.false_alarms / n,
                "found_at_the_step": {k: v / n for k, v in self.found_exact.items()},
                "found_within_one_run": {k: v / n for k, v in self.found_near.items()},
                "seconds": round(self.seconds, 1)}


def measure(series: int, *, seed: int, after: Sequence[int] = AFTER) -> Rates:
    """Run the detector on `series` quiet and `series` stepped series per look."""
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    alarms = sum(bool(change_points(quiet_series(rng), seed=i)) for i in range(series))
    exact = {k: 0 for k in after}
    near = {k: 0 for k in after}
    for k in after:
        for i in range(series):
            found = [c.index for c in change_points(step_series(rng, k), seed=i)]
            exact[k] += BEFORE in found
            near[k] += any(abs(x - BEFORE) <= 1 for x in found)
    return Rates(series, alarms, exact, near, time.perf_counter() - started)


# --- run folders from a series ----------------------------------------------------------------------

SCENARIO, REQUEST, METRIC = "reread-1g", "B-new-start", "hit_rate"
Start = dict[str, dict[str, float]]  # one start's values: request -> metric -> value (all hosts)


def write_folder(reports: Path, plan: Plan, starts: Mapping[str, Sequence[Start]],
                 verdicts: Sequence[VerdictRecord] = (), *, summary: bool = False,
                 seconds: Mapping[str, float] | None = None) -> Path:
    """A finished run folder of `plan`'s one scenario whose builds' starts measured `starts`, written
    by the suite's own writers, with `verdicts`; `summary`: its summary.md too, as the run's end renders
    it (without plots); `seconds`: each build's start takes that long (else its start and end are one
    instant)."""
    run_dir = reports / plan.run_id
    runfolder.create(run_dir, plan)
    store = SampleStore(run_dir)
    store.create()
    scenario, builds = plan.scenarios[0], list(starts)
    created = datetime.fromisoformat(plan.created)
    for build, measured in starts.items():
        for trial, start in enumerate(measured):
            attempt = f"{plan.run_id}-{build}-{trial}"
            key = {"run": plan.run_id, "scenario": scenario, "build": build, "trial": trial, "block": trial,
                   "attempt": attempt}
            for request, values in start.items():
                store.add_samples(key, request, [(ALL, -1, metric, float(v)) for metric, v in values.items()])
            began = created + timedelta(seconds=trial)
            stamp = began.isoformat(timespec="milliseconds")
            end = (began + timedelta(seconds=(seconds or {}).get(build, 0.0))).isoformat(timespec="milliseconds")
            store.add_trial(TrialRow(plan.run_id, scenario, build, trial, trial, builds.index(build), attempt, OK,
                                     "", stamp, end))
    runfolder.write_verdicts(run_dir, scenario, verdicts)
    run = load_run(run_dir)
    runfolder.write_outcome(run_dir, run_decision(run))
    if summary:
        render_run(run_dir, plots=False)
    else:
        runfolder.write_merged_verdicts(run_dir, merged_verdicts(run))
    return run_dir


def write_run(reports: Path, run_id: str, created: datetime, values: dict[str, Sequence[float]],
              ref: str | None = None) -> Path:
    """A finished run folder whose builds' starts measured `values` (hit rate on B new start, all
    hosts), written by the suite's own writers; its builds were made from `ref`."""
    builds = list(values)
    roles = {builds[0]: "baseline", builds[-1]: "candidate"}
    plan = Plan(run_id=run_id, seed=0, lab="simulated-gb10", baseline=builds[0], candidates=(builds[-1],),
                scenarios=(SCENARIO,), created=created.isoformat(timespec="seconds"),
                builds={b: BuildRecord(b, roles[b], ref=ref) for b in builds})
    return write_folder(reports, plan, {b: [{REQUEST: {METRIC: v}} for v in vs] for b, vs in values.items()})


def write_series(reports: Path, series: Sequence[Sequence[float]], *, build: str = "set4",
                 prefix: str = "run") -> list[Path]:
    """One run folder per run of `series`, a day apart, in order; run i's build is made from ref `ci`
    (one commit per run, as a pre-merge gate sees them)."""
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return [write_run(reports, f"{prefix}{i:03d}", start + timedelta(days=i), {build: list(values)}, f"c{i}")
            for i, values in enumerate(series)]


# --- a lab's history, for the page ------------------------------------------------------------------

# the simulated lab's builds on the default scenario's asserted re-reads (`pytest qualify --seed 7`):
# hit rate (a fraction) and readiness wait (ns) per request, and KV pages per start
LAB_MEANS = {"set4": {"B-new-start": (0.879, 2.040e9), "A-third-read": (0.885, 0.651e9)},
             "two_choice": {"B-new-start": (0.993, 0.221e9), "A-third-read": (0.995, 0.053e9)}}
LAB_PAGES = {"set4": 41_293.0, "two_choice": 41_362.0}
WAIT_SD = 0.02e9         # ns: a start's shift of all its waits (the same for both builds, so the rule's
BAD_START = 4.0          # pooled spread fits both); a bad start: every wait of it about four times longer
LAB_STARTS = 6           # per run and build (a bad start can be flagged from four on)
LAB_STEP_RUN = 4         # set4's re-read hit rate steps up by LAB_STEP here, with its ref
LAB_STEP = 0.005
SET4_REFS = ("3f9c2e1a", "8b1d7a40")  # set4's ref before and from LAB_STEP_RUN
LLAMA_SCENARIO, LLAMA_REQUEST = "llama-prompt", "A-again"


def _lab_start(rng: np.random.Generator, build: str, hit_shift: float, bad: bool) -> Start:
    shift, factor = float(rng.normal(0.0, WAIT_SD)), BAD_START if bad else 1.0
    start: Start = {request: {"hit_rate": hit + hit_shift + float(rng.normal(0, SD)),
                              "readiness_wait_ns": wait * factor + shift}
                    for request, (hit, wait) in LAB_MEANS[build].items()}
    start["startup"] = {"kv_pages": float(round(LAB_PAGES[build] + rng.normal(0, 30)))}
    return start


def _lab_verdicts(plan: Plan, starts: dict[str, list[Start]], quantities: Mapping[str, QuantityRecord]) \
        -> list[VerdictRecord]:
    """The default scenario's asserted re-reads and KV pages, each verdict with the starts the suite's
    own rule flags on its metric (`cache_qualify.stats.starts`)."""
    baseline, candidate = plan.baseline, plan.candidate
    asserted = [(m, r) for r in LAB_MEANS[baseline] for m in ("hit_rate", "readiness_wait_ns")]
    asserted.append(("kv_pages", "startup"))
    flagged = {}
    for metric in ("hit_rate", "readiness_wait_ns", "kv_pages"):
        series = [(r, Trials(tuple(s[r][metric] for s in starts[baseline])),
                   Trials(tuple(s[r][metric] for s in starts[candidate]))) for m, r in asserted if m == metric]
        flagged[metric] = [f.as_dict() for f in flag_starts(metric, series)]
    units = {m: (quantities[m].unit if m in quantities else STUDY_UNITS[m]) for m, _ in asserted}
    return [VerdictRecord.of(candidate, {"id": f"{m}-{'no_regression' if m == 'kv_pages' else 'gain'}[{r}]",
                                         "metric": m, "request": r, "unit": units[m], "outcome": "pass",
                                         "kind": "no_regression" if m == "kv_pages" else "gain",
                                         "flagged_starts": flagged[m]})
            for m, r in asserted]


STUDY_UNITS = {"hit_rate": "fraction", "readiness_wait_ns": "ns", "kv_pages": "pages"}


def profile_quantities(runtime: str) -> dict[str, QuantityRecord]:
    """A runtime profile's quantities as a run's plan records them."""
    model = resolve(runtime)
    return {q.name: QuantityRecord(unit=q.unit, direction=q.direction, per=q.per, title=q.title,
                                   source=q.describe(), combine=q.combine) for q in model.quantities.values()}


def write_lab_history(reports: Path, runs: int, *, seed: int, bad_run: int | None = None,
                      old_plans: int = 1, llama_runs: int = 2) -> list[Path]:
    """A lab's history as its run folders: `runs` qualifications of two_choice against set4 a day apart
    (the first `old_plans` written as plans were before they recorded units), set4's re-read hit rate
    up by LAB_STEP from run LAB_STEP_RUN on (its ref changes there; two_choice's with every run), one
    bad start of set4 in run `bad_run` (flagged by the suite's rule), each run with its summary; then
    `llama_runs` runs of llama-server's runtime (prompt time in s, KV cells)."""
    rng = np.random.default_rng(seed)
    begin = datetime(2026, 3, 2, 9, 30, tzinfo=timezone.utc)
    folders = []
    for i in range(runs):
        refs = {"set4": SET4_REFS[i >= LAB_STEP_RUN], "two_choice": f"{(i * 2654435761) % 16**8:08x}"}
        builds = {b: BuildRecord(b, role, ref=refs[b]) for b, role in (("set4", "baseline"), ("two_choice", "candidate"))}
        quantities = profile_quantities("flare") if i >= old_plans else {}
        plan = Plan(run_id=f"lab{i:03d}", seed=i, lab="simulated-gb10", baseline="set4", candidates=("two_choice",),
                    scenarios=(SCENARIO,), created=(begin + timedelta(days=i, hours=i % 3)).isoformat(),
                    builds=builds, quantities=quantities)
        shift = LAB_STEP if i >= LAB_STEP_RUN else 0.0
        starts = {b: [_lab_start(rng, b, shift if b == "set4" else 0.0, b == "set4" and i == bad_run and t == 2)
                      for t in range(LAB_STARTS)] for b in builds}
        folders.append(write_folder(reports, plan, starts, _lab_verdicts(plan, starts, quantities), summary=True))
    for i in range(llama_runs):
        builds = {"llama-b6500": BuildRecord("llama-b6500", "baseline", ref="b6500"),
                  "llama-reuse": BuildRecord("llama-reuse", "candidate", ref=f"b65{i + 1:02d}")}
        plan = Plan(run_id=f"llama{i:03d}", seed=i, lab="simulated-gb10", baseline="llama-b6500",
                    candidates=("llama-reuse",), scenarios=(LLAMA_SCENARIO,), runtime="llama-cpp",
                    created=(begin + timedelta(days=runs + i)).isoformat(), builds=builds,
                    quantities=profile_quantities("llama-cpp"))
        starts = {b: [{LLAMA_REQUEST: {"prompt_time_s": float(rng.normal(0.40 if b == "llama-b6500" else 0.05, 0.01))},
                       "startup": {"kv_pages": 8192.0}} for _ in range(4)] for b in builds}
        verdicts = [VerdictRecord.of("llama-reuse", {"id": f"prompt_time_s-gain[{LLAMA_REQUEST}]", "metric": "prompt_time_s",
                                                     "request": LLAMA_REQUEST, "unit": "s", "kind": "gain",
                                                     "outcome": "pass"}),
                    VerdictRecord.of("llama-reuse", {"id": "kv_pages-no_regression[startup]", "metric": "kv_pages",
                                                     "request": "startup", "unit": "cells", "kind": "no_regression",
                                                     "outcome": "pass"})]
        folders.append(write_folder(reports, plan, starts, verdicts, summary=True))
    return folders


def measure_page(folder: Path, runs: int, *, seed: int) -> dict[str, object]:
    """Write a lab history of `runs` runs (plus two of llama-server) into `folder`/reports, its page into
    reports/history, and open it in the tests' headless Chromium: the page's size, the time to write
    it, Chromium's load time and the time a change of the filter takes."""
    from cache_qualify.cli import main as cli
    from tests.support.chromium import chromium

    reports = folder / "reports"
    folders = write_lab_history(reports, runs, seed=seed, bad_run=runs // 2)
    assert cli(["history", "import", "--reports-dir", str(reports), *map(str, folders)]) == 0
    started, cpu = time.perf_counter(), time.process_time()
    assert cli(["history", "html", "--reports-dir", str(reports), str(reports / "history")]) == 0
    written, cpu = time.perf_counter() - started, time.process_time() - cpu
    page = reports / "history" / "index.html"
    driver: Any = chromium()
    try:
        driver.set_window_size(1300, 1000)
        driver.get(page.as_uri())
        load = driver.execute_script("return performance.getEntriesByType('navigation')[0].loadEventEnd")
        change = driver.execute_script(
            "const b = document.getElementById('build'), t = performance.now();"
            "b.value = 'two_choice'; b.dispatchEvent(new Event('change')); document.body.offsetHeight;"
            "return performance.now() - t")
    finally:
        driver.quit()
    return {"runs": runs + 2, "trends": page.read_text(encoding="utf-8").count('<figure class="trend"'),
            "bytes": page.stat().st_size, "write_s": round(written, 2), "write_cpu_s": round(cpu, 2),
            "chromium_load_ms": round(load), "filter_change_ms": round(change)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--series", type=int, default=1000, help="series per case (default 1000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--page", type=int, metavar="RUNS", help="measure the history page of a lab history of "
                        "RUNS runs instead (written to a temporary folder)")
    args = parser.parse_args(argv)
    if args.page:
        with tempfile.TemporaryDirectory() as folder:
            print(json.dumps(measure_page(Path(folder), args.page, seed=args.seed), indent=2))
        return 0
    figures = measure(args.series, seed=args.seed).as_dict()
    figures["false_alarm_rate_other_noise"] = other_noise_false_alarms(args.series, seed=args.seed)
    print(json.dumps(figures, indent=2))
    return 0


__all__ = ["ALPHA", "BEFORE", "LAB_STEP_RUN", "LLAMA_SCENARIO", "MEAN", "SD", "SET4_REFS", "STEP_SD", "Rates",
           "measure", "measure_page", "other_noise_false_alarms", "profile_quantities", "quiet_series", "step_series",
           "write_folder", "write_lab_history", "write_run", "write_series"]


if __name__ == "__main__":
    raise SystemExit(main())
