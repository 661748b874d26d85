"""Replays sized by a command, not by hope: `cache-qualify plan --sd` sizes a replay's aggregate (a p50 or
p99 time, one value per start, decided on its log with `--relative`; a hit rate in points), and the shipped
trace scenarios say in their description what their starts decide."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from cache_qualify.config.scenario import load_scenario
from cache_qualify.sizing.planning import planned_trials
from cache_qualify.stats.assertion import Assertion
from cache_qualify.stats.relative import log_null
from cache_qualify.stats.verdict import Trials, VerdictWarning, evaluate
from cache_qualify.validation.promises import power_tolerance
from tests.support.labfixtures import REPO, run_cli

P99 = Assertion("ttft_p99_s", "replay", "gain", False, min_effect=0.05, unit="s", relative=True)
FASTER = -math.log(0.7)       # a candidate 30 % faster, on the oriented log scale
TRACES = ("fixtures/cache_qualify/config/scenarios/trace-replay.yaml", "examples/vllm-trace.yaml",
          "examples/llama-cpp-trace.yaml", "examples/vllm-trace-serial.yaml")


def p99_passes(blocks: int, *, runs: int, seed: int, log_sd: float = 0.3) -> int:
    """Runs in which the gate passes a 5 % relative gain of a p99 whose starts vary by `log_sd` on the log
    scale, the candidate 30 % faster, at 0.01."""
    rng = np.random.default_rng(seed)
    ids = tuple(range(blocks))
    passes = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VerdictWarning)
        for _ in range(runs):
            base = np.exp(log_sd * rng.standard_normal(blocks))
            cand = 0.7 * np.exp(log_sd * rng.standard_normal(blocks))
            pair = (Trials(tuple(base), ids, ids), Trials(tuple(cand), tuple(100 + i for i in ids), ids))
            v, = evaluate([P99], {P99.id: pair}, alpha=0.01)
            passes += v.outcome == "pass"
    return passes


@pytest.mark.slow
def test_plan_sizes_a_replay_s_p99_and_its_count_reaches_the_power() -> None:
    """`plan --sd 0.3 --relative` prints 28 starts a build; at 28 the gate passes the 30 % faster candidate
    in at least 90 % of runs (less the simulation's error); at the examples' 6 it passes in a fraction."""
    done = run_cli("plan", "--metric", "ttft_p99_s", "--request", "replay", "--relative", "--sd", "0.3",
                   "--min-effect", "0.05", "--effect", "0.3", "--alpha", "0.01", "--json", timeout_s=300)
    assert done.returncode == 0, done.stderr
    [sized] = json.loads(done.stdout)
    assert sized["trials_per_build"] == 28 and sized["relative"] and not sized["higher_is_better"], sized
    runs = 300
    assert p99_passes(28, runs=runs, seed=28) >= (0.9 - power_tolerance(runs)) * runs
    assert p99_passes(6, runs=runs, seed=6) < 0.5 * runs


def test_the_trace_scenarios_say_what_their_starts_decide() -> None:
    """Each shipped trace scenario's description gives the p99's count, as `plan` computes it."""
    assert planned_trials(FASTER - log_null(P99), 0.3, alpha=0.01) == 28
    assert planned_trials(FASTER - log_null(P99), 0.1, alpha=0.01) == 6
    for path in TRACES:
        text = load_scenario(REPO / path).description
        assert "needs 6 starts a build at a start-to-start log-SD of 0.1 and 28 at 0.3" in text, path
        assert "cache-qualify plan --metric ttft_p99_s --relative --sd 0.3" in text, path
    # the hit rates' and the TTFT p50's counts the descriptions give, within the starts each asks for
    assert planned_trials(0.0025, 0.0005, alpha=0.01) <= 6                    # trace-replay: 0.5 pp at 0.05 pp
    assert planned_trials(0.9, 0.2, alpha=0.01, margin=0.9) <= 6             # its TTFT p50 within 90 % at 20 %
    assert planned_trials(0.9, 0.3, alpha=0.01, margin=0.9) == 10
    assert planned_trials(0.015, 0.005, alpha=0.01) <= 6 and planned_trials(0.015, 0.01, alpha=0.01) == 15
    assert planned_trials(0.05, 0.015, alpha=0.01) <= 6                      # llama-cpp-trace: 10 pp at 1.5


@pytest.mark.slow
def test_a_relative_sd_with_a_share_it_cannot_be_is_one_line() -> None:
    done = run_cli("plan", "--metric", "ttft_p99_s", "--relative", "--sd", "0.3", "--min-effect", "1.2",
                   timeout_s=120)
    assert done.returncode == 2 and "expected a min_effect below 100 %" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr

