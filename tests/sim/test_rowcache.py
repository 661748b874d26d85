"""The RowCache emulator: the RowCache study's rules, the jitted loop against the reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from cache_qualify.sim.gathers import GatherTrace
from cache_qualify.sim.naive import naive_replay
from cache_qualify.sim.reference import ReferenceRowCache
from cache_qualify.sim.layout import POLICIES
from cache_qualify.sim.rowcache import CacheCounters, RowCache


def rows(*ids: int) -> np.ndarray:
    return np.array(ids, dtype=np.uint64)


def test_uniform_rows_at_three_per_set_fill_as_poisson_says() -> None:
    """The RowCache study: 3.0 rows per 4-way set fill E[min(X, 4)]/4 = 67 % of slots, ~35 % of sets full."""
    sets = 50_000
    cache = RowCache("set4", 4 * sets, seed=7)
    distinct = np.random.default_rng(1).choice(1 << 40, size=3 * sets, replace=False)
    for start in range(0, distinct.size, 4096):
        cache.gather(distinct[start:start + 4096].astype(np.uint64))
    counters = cache.counters()
    fill = counters.resident_rows / counters.capacity_rows
    poisson = stats.poisson(3.0)
    expected_fill = sum(min(k, 4) * poisson.pmf(k) for k in range(60)) / 4
    assert expected_fill == pytest.approx(0.670, abs=0.001)
    assert fill == pytest.approx(0.670, abs=0.005)
    full = np.mean(cache.set_fill() == 4)
    assert full == pytest.approx(poisson.sf(3), abs=0.01)  # 35.3 %
    assert counters.misses == 3 * sets == counters.inserts + counters.evictions + counters.refused


@pytest.mark.parametrize("policy", POLICIES)
def test_each_distinct_row_is_looked_up_once_per_gather(policy: str) -> None:
    cache = RowCache(policy, 64, seed=0)
    assert cache.gather(rows(5, 6, 5, 5, 7, 6)) == 3
    assert cache.counters().lookups == 3
    # misses were inserted after the gather: the next gather hits them
    assert cache.gather(rows(7, 5, 6, 7)) == 0
    assert cache.counters().hits == 3


def _one_set_with_hot_rows(policy: str) -> RowCache:
    cache = RowCache(policy, 4, seed=0)  # one set (lru4, set4) of four ways
    for _ in range(3):
        cache.gather(rows(1, 2, 3, 4))
    return cache


def test_admission_refuses_a_row_colder_than_the_victim() -> None:
    cache = _one_set_with_hot_rows("set4")
    assert cache.gather(rows(99)) == 1
    after = cache.counters()
    assert (after.refused, after.evictions) == (1, 0)
    assert cache.gather(rows(1, 2, 3, 4)) == 0  # every hot row stayed


def test_lru4_evicts_the_least_recently_used_without_admission() -> None:
    cache = _one_set_with_hot_rows("lru4")
    cache.gather(rows(99))
    assert (cache.counters().refused, cache.counters().evictions) == (0, 1)
    # row 1 was used least recently, so it is the one gone
    assert cache.gather(rows(1)) == 1
    assert cache.gather(rows(99)) == 0


def test_a_row_as_hot_as_the_victim_replaces_it() -> None:
    cache = RowCache("set4", 4, seed=0)
    cache.gather(rows(1, 2, 3, 4))  # every estimate is 1
    cache.gather(rows(5))           # estimate 1 >= victim's 1: admitted, row 1 (oldest) goes
    assert cache.counters().evictions == 1
    assert cache.gather(rows(2, 3, 4, 5)) == 0


def test_two_choice_uses_the_emptier_candidate_set() -> None:
    cache = RowCache("two_choice", 4 * 1024, seed=3)
    cache.gather(np.arange(3 * 1024, dtype=np.uint64))
    # at 3 rows per set the second choice evens the load: far more sets are full for set4
    set4 = RowCache("set4", 4 * 1024, seed=3)
    set4.gather(np.arange(3 * 1024, dtype=np.uint64))
    assert cache.counters().resident_rows > set4.counters().resident_rows
    assert np.max(cache.set_fill()) == 4 and np.mean(cache.set_fill() == 0) < 0.01


def test_counters_add_rate_and_dict() -> None:
    a = CacheCounters(lookups=10, hits=6, misses=4, inserts=2, evictions=1, refused=1,
                      resident_rows=2, capacity_rows=8)
    total = a + a
    assert total.hits == 12 and total.capacity_rows == 16
    assert total.hit_rate == pytest.approx(0.6)
    assert math.isnan(CacheCounters(0, 0, 0, 0, 0, 0, 0, 8).hit_rate)
    assert set(a.as_dict()) == {"lookups", "hits", "misses", "inserts", "evictions", "refused",
                                "resident_rows", "capacity_rows", "hit_rate"}
    delta = total - a
    assert delta.hits == 6 and delta.capacity_rows == 16  # gauges keep the later value


@pytest.mark.parametrize(("policy", "capacity", "kwargs", "message"), [
    ("set5", 64, {}, r"`policy` must be one of set4, set8"),
    ("set16", 8, {}, r"`capacity_rows` must hold at least one set of 16 ways for set16, found 8"),
    ("set4", 64, {"sketch_bytes": 3}, r"`sketch_bytes` must be >= 4"),
    ("set4", 64, {"halve_after": -1}, r"`halve_after` must be >= 0"),
])
@pytest.mark.parametrize("cache_type", [RowCache, ReferenceRowCache])
def test_bad_parameters_are_named(cache_type: type, policy: str, capacity: int,
                                  kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cache_type(policy, capacity, seed=0, **kwargs)


def test_set8_capacity_is_whole_sets() -> None:
    assert RowCache("set8", 1_806_916, seed=0).counters().capacity_rows == 1_806_912
    assert RowCache("set4", 1_806_916, seed=0).counters().capacity_rows == 1_806_916


gathers = st.lists(st.lists(st.integers(0, 300), max_size=60), min_size=1, max_size=25)


@pytest.mark.slow
@pytest.mark.parametrize("ahead_of_time", [False, True], ids=["jitted", "compiled-ahead-when-built"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES), sets=st.integers(1, 12), seed=st.integers(0, 2**32),
       sketch_bytes=st.integers(4, 256), halve_after=st.sampled_from([None, 0, 1, 7, 50]),
       trace=gathers, big_ids=st.booleans())
def test_jitted_loop_and_reference_agree_counter_for_counter(
        ahead_of_time: bool, policy: str, sets: int, seed: int, sketch_bytes: int,
        halve_after: int | None, trace: list[list[int]], big_ids: bool) -> None:
    """The kernel against the reference: the jitted one, and the one compiled ahead of time when
    it is built (test_aot.py builds it and checks it against the jitted one besides)."""
    ways = {"set8": 8, "set16": 16}.get(policy, 4)
    caches: list[RowCache | ReferenceRowCache] = [
        RowCache(policy, sets * ways, seed=seed, sketch_bytes=sketch_bytes, halve_after=halve_after,
                 ahead_of_time=ahead_of_time),
        ReferenceRowCache(policy, sets * ways, seed=seed, sketch_bytes=sketch_bytes, halve_after=halve_after)]
    offset = np.uint64(2**64 - 400) if big_ids else np.uint64(0)  # IDs near 2**64 hash fine too
    for gather in trace:
        ids = np.array(gather, dtype=np.uint64) + offset
        assert caches[0].gather(ids) == caches[1].gather(ids)
        assert caches[0].counters() == caches[1].counters()
    c = caches[0].counters()
    assert c.misses == c.inserts + c.evictions + c.refused
    assert c.lookups == c.hits + c.misses
    assert c.resident_rows <= c.capacity_rows


def test_saturated_counters_and_halving_agree_on_a_long_trace() -> None:
    """Hot rows drive counters to 255 and halving runs many times; both still agree."""
    rng = np.random.default_rng(5)
    caches = [cls("two_choice", 64, seed=1, sketch_bytes=64, halve_after=900)
              for cls in (RowCache, ReferenceRowCache)]
    for _ in range(120):
        ids = rng.zipf(1.3, size=200).astype(np.uint64)
        assert caches[0].gather(ids) == caches[1].gather(ids)
    assert caches[0].counters() == caches[1].counters()
    assert caches[0].counters().lookups > 5 * 900


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES), sets=st.integers(1, 12), seed=st.integers(0, 2**32),
       sketch_bytes=st.integers(4, 256), halve_after=st.sampled_from([None, 0, 1, 7, 50]),
       trace=st.lists(st.lists(st.integers(0, 300), max_size=40), min_size=1, max_size=40),
       split=st.integers(0, 40))
def test_one_call_replay_matches_the_reference_gather_by_gather(
        policy: str, sets: int, seed: int, sketch_bytes: int, halve_after: int | None,
        trace: list[list[int]], split: int) -> None:
    """A whole trace in one kernel call (empty gathers included, in two calls at `split`) gives
    the reference's misses per gather and counters; so does the naive loop `bench-trace` times."""
    ways = {"set8": 8, "set16": 16}.get(policy, 4)
    fast = RowCache(policy, sets * ways, seed=seed, sketch_bytes=sketch_bytes, halve_after=halve_after)
    reference = ReferenceRowCache(policy, sets * ways, seed=seed, sketch_bytes=sketch_bytes,
                                  halve_after=halve_after)
    expected = [reference.gather(np.array(g, dtype=np.uint64)) for g in trace]
    split = min(split, len(trace))
    got: list[int] = []
    for part in (trace[:split], trace[split:]):
        joined = GatherTrace.of([np.array(g, dtype=np.uint64) for g in part])
        got += fast.replay(joined.rows, joined.bounds).tolist()
    assert got == expected
    assert fast.counters() == reference.counters()
    whole = GatherTrace.of([np.array(g, dtype=np.uint64) for g in trace])
    counted = RowCache(policy, sets * ways, seed=seed, sketch_bytes=sketch_bytes, halve_after=halve_after)
    assert counted.replay(whole.rows, whole.bounds, per_gather=False).size == 0
    assert counted.counters() == reference.counters()
    assert naive_replay(policy, sets * ways, whole.rows, whole.bounds, seed=seed,
                        sketch_bytes=sketch_bytes, halve_after=halve_after) == reference.counters()


def test_replay_refuses_bounds_that_do_not_cover_the_rows() -> None:
    cache = RowCache("set4", 64, seed=0)
    for bounds in ([0, 3], [1, 4], [0, 3, 2, 4], []):
        with pytest.raises(ValueError, match=r"`bounds` must rise from 0 to the 4 rows"):
            cache.replay(rows(1, 2, 3, 4), np.array(bounds, dtype=np.int64))
    assert cache.counters().lookups == 0


def test_gather_trace_cuts_joins_and_iterates() -> None:
    chunked = GatherTrace.chunked(np.arange(10), 4)
    assert chunked.bounds.tolist() == [0, 4, 8, 10]
    assert [g.tolist() for g in chunked] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    joined = GatherTrace.of([rows(5), rows(), rows(6, 7)])
    assert (len(joined), joined.rows.tolist(), joined.bounds.tolist()) == (3, [5, 6, 7], [0, 1, 1, 3])
    assert len(GatherTrace.of([])) == 0
    with pytest.raises(ValueError, match=r"`size` must be >= 1, found 0"):
        GatherTrace.chunked(rows(1), 0)
