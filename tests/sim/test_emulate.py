"""`cache-qualify emulate` and `bench-emulator`, run as real processes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cache_qualify.sim.capacity import table_capacities
from cache_qualify.units import parse_size
from cache_qualify.sim.emulate import replay, sequence_gathers
from cache_qualify.sim.reference import ReferenceRowCache
from cache_qualify.sim.layout import POLICIES
from cache_qualify.sim.rowcache import RowCache
from cache_qualify.workload.requests import study_sequence
from tests.support.labfixtures import run_cli


@pytest.fixture(scope="module")
def default_runs() -> dict[str, dict[str, Any]]:
    done = run_cli("emulate", "--json")
    assert done.returncode == 0, done.stderr
    runs = [json.loads(line) for line in done.stdout.splitlines()]
    return {run["policy"]: run for run in runs}


def rate(run: dict[str, object], request: str) -> float:
    requests = run["requests"]
    assert isinstance(requests, dict)
    return float(requests[request]["hit_rate"])


@pytest.mark.slow
def test_default_sequence_at_1_gib_lands_in_the_reports_regime(
        default_runs: dict[str, dict[str, Any]]) -> None:
    assert list(default_runs) == list(POLICIES)
    set4 = default_runs["set4"]
    assert set4["capacity_rows"] == 3_613_836
    assert 0.80 <= rate(set4, "B-new-start") <= 0.93
    assert rate(default_runs["two_choice"], "B-new-start") >= 0.97
    for request in ("B-new-start", "A-third-read"):
        rates = [rate(default_runs[p], request) for p in ("set4", "set8", "set16", "two_choice")]
        assert rates == sorted(rates) and len(set(rates)) == 4, (request, rates)
    assert rate(default_runs["lru4"], "A-third-read") < rate(set4, "A-third-read")
    # every policy saw the same lookups; the identity of the RowCache study holds
    assert len({run["lookups"] for run in default_runs.values()}) == 1
    for run in default_runs.values():
        assert run["misses"] == run["inserts"] + run["evictions"] + run["refused"]
    # about 2.7 M distinct rows read: two_choice keeps nearly all of them
    assert 2_200_000 <= int(default_runs["two_choice"]["resident_rows"]) <= 3_000_000


@pytest.mark.slow
def test_table_is_shaped_like_the_reports() -> None:
    done = run_cli("emulate", "--policy", "set4", "--policy", "two_choice", "--cache-size", "4G")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:4]] == ["Request", "set4", "two_choice"]
    names = [line.split("|")[1].strip() for line in lines[2:8]]
    assert names == ["A", "A-new-start", "B", "B-new-start", "A-third-read", "Slots filled"]
    assert "capacity 15,118,212 rows" in done.stdout
    b_new = lines[5].split("|")
    assert float(b_new[2].strip(" %")) > 99.0  # 4 GiB: the RowCache study's 99.81 %


@pytest.mark.slow
def test_trace_replay_matches_the_reference(tmp_path: Path) -> None:
    trace = np.random.default_rng(3).integers(0, 3000, 20_000).astype(np.uint64)
    np.save(tmp_path / "trace.npy", trace)
    done = run_cli("emulate", "--trace", str(tmp_path / "trace.npy"), "--gather", "50",
               "--capacity-rows", "1024", "--policy", "set8,lru4", "--sketch-bytes", "4K",
               "--seed", "9", "--json")
    assert done.returncode == 0, done.stderr
    runs = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["policy"] for r in runs] == ["set8", "lru4"]
    for run in runs:
        reference = ReferenceRowCache(str(run["policy"]), 1024, seed=9, sketch_bytes=4096)
        for start in range(0, trace.size, 50):
            reference.gather(trace[start:start + 50])
        expected = reference.counters().as_dict()
        assert {k: run[k] for k in expected} == expected


@pytest.mark.slow
@pytest.mark.parametrize(("args", "message"), [
    (["--policy", "set4,fifo"], r"argument --policy: --policy must be among set4, set8, set16, two_choice, lru4, found fifo"),
    (["--cache-size", "1Q"], r"argument --cache-size: size must be a number with an optional unit"),
    (["--gather", "0"], r"argument --gather: expected a whole number >= 1, found '0'"),
    (["--cache-size", "1G", "--capacity-rows", "8"], r"not allowed with argument --cache-size"),
])
def test_bad_options_name_the_option(args: list[str], message: str) -> None:
    done = run_cli("emulate", *args)
    assert done.returncode == 2
    assert re.search(message, done.stderr), done.stderr


@pytest.mark.slow
def test_unreadable_trace_is_a_clear_error(tmp_path: Path) -> None:
    np.save(tmp_path / "floats.npy", np.zeros(4))
    done = run_cli("emulate", "--trace", str(tmp_path / "floats.npy"))
    assert done.returncode == 2
    assert "floats.npy: expected a 1-D integer array of row IDs (uint64), found shape (4,) of float64" \
        in done.stderr


@pytest.mark.slow
def test_replay_per_request_deltas_add_up() -> None:
    corpus = np.random.default_rng(0).integers(3, 5000, 130_000).astype(np.uint32)
    requests = study_sequence(corpus)
    gathers = sequence_gathers(requests)
    run = replay("set4", [r.name for r in requests], gathers, table_capacities(parse_size("256M")))
    assert sum(c.misses for _, c in run.requests) == run.total.misses
    assert run.requests[-1][1].resident_rows == run.total.resident_rows
    # the first request runs as 12 gathers, the others in 4,096-token chunks
    assert [len(g[0]) for g in gathers] == [12, 5, 15, 15, 5]
    assert isinstance(RowCache("set4", 64, seed=0).counters().hit_rate, float)


@pytest.mark.slow
def test_bench_reports_lookups_per_second_and_the_reference_ratio() -> None:
    """Well-formed figures only: speed is judged by running the benchmark, not by a test."""
    done = run_cli("bench-emulator", "--policy", "set4,two_choice", "--reference-lookups", "20000",
               "--repeat", "1", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    results = {r["policy"]: r for r in report["results"]}
    assert list(results) == ["set4", "two_choice"]
    assert len({r["lookups"] for r in results.values()}) == 1  # the same trace for each
    for r in results.values():
        assert r["lookups"] > 1_000_000  # the whole sequence, not the reference's prefix
        assert 10_000 < r["reference_lookups"] <= 20_000  # distinct rows of the first 20,000
        assert r["lookups_per_s"] > 0 and r["reference_lookups_per_s"] > 0
        assert r["ratio"] == pytest.approx(r["lookups_per_s"] / r["reference_lookups_per_s"])
    assert report["below_target"] == [p for p, r in results.items()  # both have a target
                                      if r["lookups_per_s"] < report["target_lookups_per_s"]]
    assert report["sequence_seconds"] > 0


@pytest.mark.slow
def test_bench_prints_a_table_of_policy_rate_and_ratio() -> None:
    done = run_cli("bench-emulator", "--policy", "lru4", "--reference-lookups", "5000",
               "--repeat", "1")
    assert done.returncode == 0, done.stderr
    row = re.search(r"^lru4 +(\d+\.\d) M +(\d+\.\d\d) M +(\d+)x$", done.stdout, re.MULTILINE)
    assert row, done.stdout
    rate, reference, ratio = float(row[1]), float(row[2]), int(row[3])
    assert rate > 0 and reference > 0
    assert ratio == pytest.approx(rate / reference, rel=0.1, abs=1)  # printed rounded
    assert re.search(r"default sequence, both tables, row IDs included \(lru4\): \d+\.\d{3} s",
                     done.stdout)
