"""The row-cache kernels compiled ahead of time: built, loaded without numba, and counter for
counter the jitted ones (which the reference tests check against the rules)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cache_qualify.sim import aot
from cache_qualify.sim.gathers import GatherTrace
from cache_qualify.sim.layout import POLICIES
from cache_qualify.sim.rowcache import RowCache


@pytest.fixture(scope="module")
def built() -> tuple[Path, ...]:
    """The modules for the current sources (built once per change of them, as a rank would)."""
    return aot.build()


def test_a_fresh_interpreter_loads_the_built_kernel_without_numba(built: tuple[Path, ...]) -> None:
    assert built == aot.module_paths(aot.stamp()) and all(path.is_file() for path in built)
    code = ("import sys, numpy as np; from cache_qualify.sim.rowcache import RowCache; "
            "c = RowCache('two_choice', 64, seed=1); c.gather(np.arange(1, 90, dtype=np.uint64)); "
            "print(c.compiled_ahead, 'numba' in sys.modules, c.counters().misses)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["True", "False", "89"]


@pytest.mark.parametrize("policy", POLICIES)
def test_the_compiled_kernel_matches_the_jitted_one_gather_by_gather(built: tuple[Path, ...], policy: str) -> None:
    rng = np.random.default_rng(11)
    sizes = rng.integers(0, 300, size=400)
    sizes[::37] = 0  # empty gathers too
    trace = GatherTrace.of([rng.zipf(1.2, size=n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
                            for n in sizes])
    ways = {"set8": 8, "set16": 16}.get(policy, 4)
    compiled, jitted = (RowCache(policy, 40 * ways, seed=5, sketch_bytes=128, halve_after=3000,
                                 ahead_of_time=ahead) for ahead in (True, False))
    assert compiled.compiled_ahead and not jitted.compiled_ahead
    for part in np.array_split(np.arange(len(sizes)), 3):  # state carries over between calls
        bounds = trace.bounds[part[0]:part[-1] + 2]
        rows = trace.rows[bounds[0]:bounds[-1]]
        misses = [cache.replay(rows, bounds - bounds[0]) for cache in (compiled, jitted)]
        assert misses[0].tolist() == misses[1].tolist()
        assert compiled.counters() == jitted.counters()
    assert compiled.counters().evictions > 0
    assert (compiled.counters().refused > 0) == compiled.admission


def test_the_compiled_kernel_lets_other_threads_run(built: tuple[Path, ...]) -> None:
    """As the jitted kernels' nogil=True: rank 0 replays its share while its threads send the
    job to the other ranks."""
    cache = RowCache("set4", 1 << 20, seed=1)
    assert cache.compiled_ahead
    rows = np.random.default_rng(2).integers(0, 1 << 40, size=4_000_000).astype(np.uint64)
    bounds = np.append(np.arange(0, rows.size, 98_304), rows.size)
    ticks = [0]
    done = threading.Event()

    def tick() -> None:
        while not done.wait(0.001):   # waiting releases the GIL, as the sleep of a real thread would
            ticks[0] += 1

    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.02)
    before = ticks[0]
    started = time.perf_counter()
    cache.replay(rows, bounds)
    took_s = time.perf_counter() - started
    done.set()
    ticker.join()
    assert took_s > 0.05, f"the replay took {took_s:.3f} s: too short to tell"
    # a kernel that held the GIL would let the ticker tick at most once (as the call begins or ends),
    # however long it ran; three ticks need the GIL released, and a loaded machine still gives them
    assert ticks[0] - before >= 3, f"the other thread ticked {ticks[0] - before} times in {took_s:.2f} s"


def test_a_missing_module_falls_back_to_the_jitted_kernel(tmp_path: Path) -> None:
    assert aot.kernel("set4", folder=tmp_path) is None
    assert not RowCache("set4", 64, seed=0, ahead_of_time=False).compiled_ahead


def test_a_failed_build_is_noted_and_not_retried_in_the_background(tmp_path: Path) -> None:
    note = aot.note_path(aot.stamp(), tmp_path)
    note.write_text("CompileError: no C compiler\n")
    said = aot.build_in_background(tmp_path)
    assert said == "not built ahead of time here (CompileError: no C compiler)"
    assert sorted(p.name for p in tmp_path.iterdir()) == [note.name]  # nothing started


def test_each_policy_is_in_its_part_and_the_parts_hold_every_policy(built: tuple[Path, ...]) -> None:
    """The build's parts are compiled side by side; a rank loads the one part its policy is in."""
    key = aot.stamp()
    exported = {part: sorted(name.removeprefix("replay_") for name in dir(aot._load(path, aot.module_name(key, part)))
                             if name.startswith("replay_"))
                for part, path in enumerate(built)}
    assert sorted(p for names in exported.values() for p in names) == sorted(POLICIES)
    assert all(policy in exported[aot.part_of(policy)] for policy in POLICIES)
    assert len(built) == aot.PARTS > 1 and all(exported.values())


def test_a_build_removes_other_stamps_builds_only_once_they_are_stale(tmp_path: Path) -> None:
    """The cache folder may be shared by checkouts and versions, each loading its own stamp's build:
    a build leaves another stamp's files alone until they are `STALE_AFTER_S` old."""
    suffix = ".cpython-311-x86_64-linux-gnu.so"
    own, recent, old = (tmp_path / f"rowcache_kernels_{key}_0{suffix}" for key in ("a" * 16, "b" * 16, "c" * 16))
    note = tmp_path / f"rowcache_kernels_{'c' * 16}.failed"
    for path in (own, recent, old, note):
        path.write_text("")
    week_ago = time.time() - aot.STALE_AFTER_S - 60
    for path in (own, old, note):
        os.utime(path, (week_ago, week_ago))
    aot._remove_stale(tmp_path, "a" * 16)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([own.name, recent.name])
