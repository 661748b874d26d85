"""Rank 0's prefix cache and the gather plan built around it."""

from __future__ import annotations

import numpy as np

from cache_qualify.sim.prefill import PrefillJob, plan_job
from cache_qualify.sim.prefix import PrefixCache


def prompt(n: int, start: int = 100) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.uint32)


def test_chained_pages_reuse_only_a_shared_prefix() -> None:
    cache = PrefixCache()
    assert cache.reuse(prompt(1000)) == ()
    assert cache.reuse(prompt(1000)) == ((0, 896),)          # 7 full pages; the last token is computed
    assert cache.reuse(prompt(257)) == ((0, 256),)
    changed = prompt(1000)
    changed[:16] = 3
    assert cache.reuse(changed) == ()


def test_content_keyed_pages_reuse_after_a_new_start() -> None:
    cache = PrefixCache(content_keyed=True)
    cache.reuse(prompt(1000))
    changed = prompt(1000)
    changed[:16] = 3
    assert cache.reuse(changed) == ((128, 896),)


def test_plan_skips_cached_tokens_and_adds_one_gather_per_decode_step() -> None:
    job = plan_job(4, prompt(10_000), np.array([7, 8], dtype=np.uint32), cached=((0, 1024),),
                   first_request=False, chunk_tokens=4096)
    assert job.kept == ((1024, 10_000), (10_000, 10_002))
    assert job.gathers == ((0, 4096), (4096, 8192), (8192, 8976), (8976, 8977), (8977, 8978))
    first = plan_job(1, prompt(1200), np.zeros(0, dtype=np.uint32), cached=(), first_request=True,
                     chunk_tokens=4096)
    assert len(first.gathers) == 12 and first.gathers[-1] == (1100, 1200)


def test_a_job_survives_the_wire() -> None:
    job = plan_job(9, prompt(5000), np.array([5], dtype=np.uint32), cached=((0, 128),),
                   first_request=False, chunk_tokens=4096)
    back = PrefillJob.decode(job.encode())
    assert (back.request_id, back.kept, back.gathers) == (job.request_id, job.kept, job.gathers)
    assert np.array_equal(back.tokens, job.tokens)
    assert len(job.encode()) < 4 * 5001 + 200
