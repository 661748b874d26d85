"""Real vLLM 0.32.0 starts of examples/vllm-trace.yaml (tests/data/vllm-trace-starts.json) as a run folder.

Each recorded start is one replay of the example's trace slice, open loop, on a build of
examples/vllm.yaml: what the started server's /metrics said of its cache (the lines the emulator
reads) and the warm half's measured prefix-cache hit rate. `write_recorded_trace_run` writes the run
folder `pytest qualify` leaves after those starts (rows, the window's samples as the request
`replay`, each start's log and kept /metrics) and predicts each start with the run's own recorder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cache_qualify.config.scenario import load_scenario
from cache_qualify.samples.store import ALL, OK, WINDOW, TrialRow, new_attempt
from cache_qualify.trials.runner import TrialResult
from cache_qualify.workload.trace import scenario_trace
from tests.support.labfixtures import REPO
from tests.support.recorded_vllm import DATA, body, recorded_facts, recorded_folder

TRACE_EXAMPLE = REPO / "examples" / "vllm-trace.yaml"
TRACE_SCENARIO = "vllm-trace"


@dataclass(frozen=True)
class TraceStart:
    """One recorded start: its build and trial, its kept /metrics lines and the warm half's figures."""

    build: str
    trial: int
    metrics: str
    hits: int
    prompt_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.prompt_tokens if self.prompt_tokens else 0.0


def trace_starts() -> list[TraceStart]:
    listed = json.loads((DATA / "vllm-trace-starts.json").read_text(encoding="utf-8"))["starts"]
    return [TraceStart(**start) for start in listed]


def write_recorded_trace_run(root: Path, starts: list[TraceStart], *, prediction: str = "fail") -> Path:
    """A run folder under `root` of the recorded `starts` (their builds in order, the first the baseline)."""
    scenario = load_scenario(TRACE_EXAMPLE).model_copy(update={"prediction": prediction})
    labels = list(dict.fromkeys(s.build for s in starts))
    run_dir, store, recorder = recorded_folder(root, labels, TRACE_SCENARIO)
    trace = scenario_trace(scenario)
    for start in starts:
        attempt = new_attempt()
        tag = f"{TRACE_SCENARIO}-{start.build}-t{start.trial}-{attempt}"
        facts = recorded_facts(recorder.inventory, scenario, start.build, body("vllm-start.log"), start.metrics,
                               run_dir, tag)
        key = {"run": "recorded", "scenario": TRACE_SCENARIO, "build": start.build, "trial": start.trial,
               "block": start.trial, "attempt": attempt}
        store.add_samples(key, WINDOW, [(ALL, -1, "hit_rate", start.hit_rate)])
        row = TrialRow(run="recorded", scenario=TRACE_SCENARIO, build=start.build, trial=start.trial,
                       block=start.trial, position=labels.index(start.build), attempt=attempt, outcome=OK, reason="",
                       started_at="2026-01-01T00:00:00.000+00:00", finished_at="2026-01-01T00:01:00.000+00:00")
        store.add_trial(row)
        recorder.trial_predicted(scenario, TrialResult(row, build=start.build, facts=facts, trace=trace))
    return run_dir


__all__ = ["TRACE_EXAMPLE", "TRACE_SCENARIO", "TraceStart", "trace_starts", "write_recorded_trace_run"]
