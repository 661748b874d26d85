"""The change-point method's false-alarm and detection rates, measured on simulated series.

A series is a build's per-start values across runs, drawn from the simulated
lab's noise model (hit rate 0.860 with sd 0.001 between
starts, every start independent; four starts per run, the default scenario's
trials per build). Without a change, 30 runs; with one, 20 runs and then the
mean moved by 2 sd, seen after one, two and three further runs. Run
``python -m tests.support.history_sim`` to print the figures quoted in docs/history.md;
tests/test_history.py checks a quick version. Also here: run folders written
with the suite's own writers from such a series, for the tests to import.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from cache_qualify.history.changes import ALPHA, change_points
from cache_qualify.report.rundata import load_run, merged_verdicts
from cache_qualify.samples import runfolder
from cache_qualify.samples.records import BuildRecord, Plan
from cache_qualify.samples.store import ALL, OK, SampleStore, TrialRow

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


def write_run(reports: Path, run_id: str, created: datetime, values: dict[str, Sequence[float]],
              ref: str | None = None) -> Path:
    """A finished run folder whose builds' starts measured `values` (hit rate on B new start, all
    hosts), written by the suite's own writers; its builds were made from `ref`."""
    run_dir = reports / run_id
    builds = list(values)
    roles = {builds[0]: "baseline", builds[-1]: "candidate"}
    runfolder.create(run_dir, Plan(run_id=run_id, seed=0, lab="simulated-gb10", baseline=builds[0],
                                   candidates=(builds[-1],), scenarios=(SCENARIO,),
                                   created=created.isoformat(timespec="seconds"),
                                   builds={b: BuildRecord(b, roles[b], ref=ref) for b in builds}))
    store = SampleStore(run_dir)
    store.create()
    for build, starts in values.items():
        for trial, value in enumerate(starts):
            attempt = f"{run_id}-{build}-{trial}"
            key = {"run": run_id, "scenario": SCENARIO, "build": build, "trial": trial, "block": trial,
                   "attempt": attempt}
            store.add_samples(key, REQUEST, [(ALL, -1, METRIC, float(value))])
            stamp = (created + timedelta(seconds=trial)).isoformat(timespec="milliseconds")
            store.add_trial(TrialRow(run_id, SCENARIO, build, trial, trial, builds.index(build), attempt, OK, "",
                                     1.0, 41_300, stamp, stamp))
    runfolder.write_verdicts(run_dir, SCENARIO, [])
    run = load_run(run_dir)
    runfolder.write_outcome(run_dir, run.decision)
    runfolder.write_merged_verdicts(run_dir, merged_verdicts(run))
    return run_dir


def write_series(reports: Path, series: Sequence[Sequence[float]], *, build: str = "set4",
                 prefix: str = "run") -> list[Path]:
    """One run folder per run of `series`, a day apart, in order; run i's build is made from ref `ci`
    (one commit per run, as a pre-merge gate sees them)."""
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return [write_run(reports, f"{prefix}{i:03d}", start + timedelta(days=i), {build: list(values)}, f"c{i}")
            for i, values in enumerate(series)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--series", type=int, default=1000, help="series per case (default 1000)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    figures = measure(args.series, seed=args.seed).as_dict()
    figures["false_alarm_rate_other_noise"] = other_noise_false_alarms(args.series, seed=args.seed)
    print(json.dumps(figures, indent=2))
    return 0


__all__ = ["ALPHA", "BEFORE", "MEAN", "SD", "STEP_SD", "Rates", "measure", "other_noise_false_alarms",
           "quiet_series", "step_series",
           "write_run", "write_series"]


if __name__ == "__main__":
    raise SystemExit(main())
