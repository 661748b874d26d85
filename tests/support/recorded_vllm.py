"""vLLM 0.32.0's recorded starts (tests/data, METRICS.md) as a profile reads them, and as a run folder.

`figures` turns two recorded /metrics bodies into the `vllm` profile's figures over a request, as the
trials do. `write_recorded_run` writes a run folder the way `pytest qualify` leaves one after trials of
examples/vllm.yaml's builds that each measured one recorded start (P, Q, P again: caching on, or off):
per trial its row, its request samples, the start's log and the /metrics lines its cache's emulator
reads (kept beside the log, as a start keeps them), and its prediction by the run's own recorder.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path

from cache_qualify.config.inventory import Inventory, load_inventory
from cache_qualify.config.measurement import Measurement
from cache_qualify.config.scenario import Scenario, scenario_model
from cache_qualify.qualification.recording import RunRecorder
from cache_qualify.qualification.results import RunOptions
from cache_qualify.samples import runfolder
from cache_qualify.samples.records import Plan, StartFacts
from cache_qualify.samples.store import ALL, OK, SampleStore, TrialRow, new_attempt
from cache_qualify.trials.figures import combine, delta
from cache_qualify.trials.measure import Snapshot, emulator_metrics, metric_lines, parse_metrics
from cache_qualify.trials.runner import TrialResult
from cache_qualify.workload.requests import Request
from tests.support.labfixtures import REPO

DATA = REPO / "tests" / "data"
EXAMPLE = REPO / "examples" / "vllm.yaml"
STARTS = {"on": "vllm-metrics.txt", "off": "vllm-metrics-no-caching.txt"}   # caching on / off
SCENARIO = "recorded-resend"
REQUESTS = ("P", "Q", "P-again")
PROMPT_TOKENS = 4000
BLOCK = 128


def body(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def vllm_bodies(name: str) -> list[str]:
    """The bodies of one recorded vLLM start: before P, after P, after Q, after P again."""
    return body(name).split("\n# --- next scrape ---\n")


def snapshot(text: str, model: Measurement, at: float) -> Snapshot:
    return Snapshot(host="gpu0", rank=0, taken_at=at,
                    values=parse_metrics(text, host="gpu0", rank=0, table_label=model.table_label))


def figures(model: Measurement, before: str, after: str) -> dict[str, float]:
    """The profile's figures over one request, between two bodies of one rank (as a trial combines them)."""
    rank = delta(snapshot(before, model, 1.0), snapshot(after, model, 2.0), model)
    return dict(combine([rank], model).values)


def two_prompts() -> tuple[list[int], list[int]]:
    """P and Q as the recorded starts sent them: 4,000 seeded token IDs each."""
    rng = random.Random(1)
    return ([rng.randrange(100, 31000) for _ in range(PROMPT_TOKENS)],
            [rng.randrange(100, 31000) for _ in range(PROMPT_TOKENS)])


def recorded_requests() -> list[Request]:
    import numpy as np

    p, q = two_prompts()
    return [Request(name, np.asarray(tokens, dtype=np.int64)) for name, tokens in zip(REQUESTS, (p, q, p))]


def recorded_scenario(*, prediction: str = "fail") -> Scenario:
    """A scenario of the three named requests, measuring prefix reuse (its corpus is never read here)."""
    return Scenario.model_validate({
        "name": SCENARIO, "description": "P, Q, then P again, as the recorded vLLM starts", "corpus": {"default": True},
        "prefix_reuse": "measure", "prediction": prediction, "request": {"max_tokens": 1, "logprobs": None},
        "requests": [{"name": n, "start": 0, "stop": PROMPT_TOKENS} for n in REQUESTS],
        "expectations": [{"metric": "hit_rate", "request": "P-again", "kind": "gain", "min_effect": 0.5}]})


def recorded_folder(root: Path, labels: Sequence[str], scenario: str) -> tuple[Path, SampleStore, RunRecorder]:
    """A run folder under `root` of examples/vllm.yaml's builds `labels` (the first the baseline) on
    `scenario`, its sample store and its recorder keeping the scenario's samples."""
    run_dir = root / "reports" / "recorded"
    runfolder.create(run_dir, Plan(run_id="recorded", seed=1, lab="vllm-cpu", runtime="vllm", baseline=labels[0],
                                   candidates=tuple(labels[1:]), scenarios=(scenario,)))
    store = SampleStore(run_dir)
    store.create()
    recorder = RunRecorder(load_inventory(EXAMPLE), RunOptions(run_id="recorded", run_dir=run_dir, seed=1))
    recorder.keep(scenario)
    return run_dir, store, recorder


def recorded_facts(inventory: Inventory, scenario: Scenario, build: str, log: str, metrics: str, run_dir: Path,
                   tag: str) -> StartFacts:
    """A recorded start's facts as its trial hands them on (its command line: the build's flags, then the
    scenario's), its log and kept /metrics lines also in the run folder, as a start keeps them."""
    (runfolder.logs_dir(run_dir) / f"{tag}-cpu0-rank0.log").write_text(log, encoding="utf-8")
    runfolder.write_start_metrics(run_dir, tag, "cpu0", 0, metrics)
    return StartFacts(tuple(inventory.start_words(build, scenario.server_flags)), metrics, log)


def write_recorded_run(root: Path, arms: Mapping[str, str], *, trials: int = 2, prediction: str = "fail") -> Path:
    """A run folder under `root` whose arms (examples/vllm.yaml's builds, the first the baseline) each measured
    the recorded start `arms[build]` names (``on`` or ``off``) in every one of `trials` trials."""
    inventory = load_inventory(EXAMPLE)
    run_dir, store, recorder = recorded_folder(root, list(arms), SCENARIO)
    scenario = recorded_scenario(prediction=prediction)
    model = scenario_model(scenario, inventory.measurement)
    for trial in range(trials):
        for position, (build, start) in enumerate(arms.items()):
            attempt = new_attempt()
            tag = f"{SCENARIO}-{build}-t{trial}-{attempt}"
            bodies = vllm_bodies(STARTS[start])
            facts = recorded_facts(inventory, scenario, build, body("vllm-start.log"),
                                   metric_lines(bodies[0], emulator_metrics(model)), run_dir, tag)
            key = {"run": "recorded", "scenario": SCENARIO, "build": build, "trial": trial, "block": trial,
                   "attempt": attempt}
            for i, request in enumerate(REQUESTS):
                got = figures(model, bodies[i], bodies[i + 1])
                store.add_samples(key, request, [(ALL, -1, metric, value) for metric, value in got.items()])
            row = TrialRow(run="recorded", scenario=SCENARIO, build=build, trial=trial, block=trial,
                           position=position, attempt=attempt, outcome=OK, reason="",
                           started_at="2026-01-01T00:00:00.000+00:00", finished_at="2026-01-01T00:01:00.000+00:00")
            store.add_trial(row)
            recorder.trial_predicted(scenario, TrialResult(row, build=build, facts=facts,
                                                           requests=tuple(recorded_requests())))
    return run_dir


__all__ = ["BLOCK", "PROMPT_TOKENS", "REQUESTS", "SCENARIO", "body", "figures", "recorded_facts", "recorded_folder",
           "recorded_requests", "recorded_scenario", "snapshot", "two_prompts", "vllm_bodies", "write_recorded_run"]
