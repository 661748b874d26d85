"""`replaybench`'s lines and its wait-for-a-CPU reading; the benchmark itself runs in
tests/test_benchmarks.py (slow): speed is measured there, never asserted."""

from __future__ import annotations

import dataclasses
import math
import sys
import threading

import pytest

from cache_qualify.replaybench import Lateness, ReplayBench, cpu_wait_s, format_replay_bench

RESULT = ReplayBench(build="set4", rate=100, requests=500, prompt_tokens=16,
                     open_loop=Lateness(0.001, 0.00587, 0.00929, 0), naive=Lateness(36.0, 74.72, 75.3, 0),
                     load_1min=3.66, open_e2e_p50_s=0.1685, open_cpu_per_request_s=0.00195,
                     open_cpu_wait_per_request_s=0.00194)


def test_the_lines_give_the_load_the_cpu_and_the_wait_beside_the_lateness() -> None:
    assert format_replay_bench(RESULT) == [
        "bench-replay: build set4, 500 streamed requests at 100/s, 16-token prompts; load average 3.66 "
        "(after the open loop)",
        "open loop (trials.replay): lateness p50 1.00 ms, p99 5.87 ms, max 9.29 ms; 0 errors "
        "(target p99 <= 10 ms: met)",
        "open loop: end-to-end p50 168.5 ms, client CPU 1.95 ms per request, 1.94 ms per request waiting for a CPU",
        "naive sequential loop: lateness p50 36000.00 ms, p99 74720.00 ms, max 75300.00 ms; 0 errors",
        "ratio of p99s (naive / open loop): 12729.1x"]


def test_a_wait_not_reported_is_left_out() -> None:
    lines = format_replay_bench(dataclasses.replace(RESULT, open_cpu_wait_per_request_s=math.nan))
    assert lines[2] == "open loop: end-to-end p50 168.5 ms, client CPU 1.95 ms per request"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's schedstat only")
def test_the_wait_is_read_in_any_thread_and_never_goes_back() -> None:
    first = cpu_wait_s()
    readings: list[float] = []
    other = threading.Thread(target=lambda: readings.append(cpu_wait_s()))
    other.start()
    other.join()
    assert 0 <= first <= cpu_wait_s()
    assert readings[0] >= 0
