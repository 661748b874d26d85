"""splitmix64's finalizer, written once per form (`cache_qualify.hashing`): the jitted, the array and the int
forms agree bit for bit on seeded inputs and on splitmix64's published first output, and only the jitted form
loads numba."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from cache_qualify import hashing

REPO = Path(__file__).resolve().parents[1]
# splitmix64 seeded with 0 first returns the finalizer of its increment (Vigna's splitmix64.c)
FIRST_OUTPUT_OF_SEED_0 = 0xE220A8397B1DCDAF


def test_the_three_forms_agree_bit_for_bit_on_seeded_inputs() -> None:
    rng = np.random.default_rng(20261207)
    edges = np.array([0, 1, 2**63 - 1, 2**63, 2**64 - 1, int(hashing.GOLDEN)], dtype=np.uint64)
    xs = np.concatenate([edges, rng.integers(0, 2**64, size=4000, dtype=np.uint64, endpoint=False)])
    as_array = hashing.mix64_array(xs)
    as_int = [hashing.mix64_int(int(x)) for x in xs]
    as_jitted = [int(hashing.mix64(x)) for x in xs]
    assert as_array.dtype == np.uint64
    assert as_array.tolist() == as_int == as_jitted
    assert len(set(as_int)) == xs.size   # a bijection: distinct inputs stay distinct


def test_each_form_gives_splitmix64s_published_first_output() -> None:
    state = int(hashing.GOLDEN)
    assert hashing.mix64_int(state) == FIRST_OUTPUT_OF_SEED_0
    assert int(hashing.mix64_array(np.array([state], dtype=np.uint64))[0]) == FIRST_OUTPUT_OF_SEED_0
    assert int(hashing.mix64(hashing.GOLDEN)) == FIRST_OUTPUT_OF_SEED_0


def test_the_int_form_wraps_as_the_others_do() -> None:
    assert hashing.mix64_int(2**64 + 5) == hashing.mix64_int(5)
    assert hashing.mix64_int(-1) == hashing.mix64_int(2**64 - 1)


def test_the_workload_and_emulation_users_load_no_numba() -> None:
    """The array and int forms come without numba; the jitted one brings it, when asked for."""
    code = ("import sys, cache_qualify.workload.trace, cache_qualify.emulation.vllm_block, cache_qualify.sim.rowcache\n"
            "before = 'numba' in sys.modules\n"
            "from cache_qualify.hashing import mix64\n"
            "print(before, 'numba' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "True"], done.stderr
