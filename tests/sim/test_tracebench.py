"""`cache-qualify bench-trace`: the Zipf trace, and the benchmark run as a real process."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from cache_qualify.sim.tracebench import zipf_trace
from tests.support.labfixtures import run_cli


def test_zipf_trace_is_seeded_and_follows_the_law() -> None:
    trace = zipf_trace(400_000, exponent=1.0, universe=1_000_000, seed=4)
    assert trace.dtype == np.uint64
    assert np.array_equal(trace, zipf_trace(400_000, exponent=1.0, universe=1_000_000, seed=4))
    assert not np.array_equal(trace, zipf_trace(400_000, exponent=1.0, universe=1_000_000, seed=5))
    counts = np.sort(np.unique(trace, return_counts=True)[1])[::-1]
    # continuous bounded Zipf, s = 1: P(rank 1) = ln 2 / ln(N + 1), P(rank <= k) = ln(k + 1) / ln(N + 1)
    assert counts[0] / trace.size == pytest.approx(math.log(2) / math.log(1_000_001), rel=0.05)
    assert counts[:99].sum() / trace.size == pytest.approx(math.log(100) / math.log(1_000_001),
                                                           rel=0.05)
    steeper = zipf_trace(400_000, exponent=1.3, universe=1_000_000, seed=4)
    assert np.unique(steeper).size < np.unique(trace).size
    with pytest.raises(ValueError, match="exponent > 0"):
        zipf_trace(10, exponent=0.0)


@pytest.mark.slow
def test_bench_trace_times_both_replays_on_one_trace(tmp_path: Path) -> None:
    """Well-formed figures only (speed is judged by running the benchmark); the saved trace
    replayed by `emulate --trace` gives the hit rate the benchmark measured."""
    saved = tmp_path / "zipf.npy"
    done = run_cli("bench-trace", "--lookups", "60000", "--gather", "1,64", "--policy", "set4,lru4",
                   "--repeat", "1", "--save", str(saved), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["rows"] == 60_000 and np.load(saved).size == 60_000
    results = report["results"]
    assert [(r["policy"], r["gather"]) for r in results] == [("set4", 1), ("set4", 64),
                                                            ("lru4", 1), ("lru4", 64)]
    for r in results:
        assert 0 < r["lookups"] <= 60_000
        assert r["ratio"] == pytest.approx(r["lookups_per_s"] / r["naive_lookups_per_s"])
    assert report["below_target"] == [f"{r['policy']} --gather {r['gather']}" for r in results
                                      if r["ratio"] < report["target_ratio"]]
    emulated = run_cli("emulate", "--trace", str(saved), "--gather", "64", "--policy", "set4", "--json")
    assert emulated.returncode == 0, emulated.stderr
    assert json.loads(emulated.stdout)["hit_rate"] == pytest.approx(results[1]["hit_rate"], abs=1e-12)


@pytest.mark.slow
def test_bench_trace_prints_a_table_and_names_bad_options() -> None:
    done = run_cli("bench-trace", "--lookups", "20000", "--gather", "16", "--repeat", "1")
    assert done.returncode == 0, done.stderr
    row = re.search(r"^set4 +16 +\d+\.\d% +(\d+\.\d) M +(\d+\.\d) M +(\d+\.\d\d)x$", done.stdout,
                    re.MULTILINE)
    assert row, done.stdout
    bad = run_cli("bench-trace", "--lookups", "10", "--zipf-exponent", "0")
    assert bad.returncode == 2
    assert "--zipf-exponent/--universe: need lookups >= 0, universe >= 1 and exponent > 0" in bad.stderr


@pytest.mark.slow
def test_bench_trace_saves_where_np_save_would_and_names_a_file_it_cannot_write(tmp_path: Path) -> None:
    args = ("bench-trace", "--lookups", "1000", "--gather", "1", "--repeat", "1", "--json", "--save")
    done = run_cli(*args, str(tmp_path / "zipf"))
    assert done.returncode == 0, done.stderr
    assert np.load(tmp_path / "zipf.npy").size == 1000 and not (tmp_path / "zipf").exists()
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    out = tmp_path / "a-file" / "zipf.npy"
    bad = run_cli(*args, str(out))
    assert bad.returncode == 2 and bad.stderr.startswith(f"cache-qualify: error: --save {out}: cannot write it: ")
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr, bad.stderr
