"""The KV-pages memory model against the RowCache study's figures."""

from __future__ import annotations

import numpy as np
import pytest

from cache_qualify.sim.memory import (GIB, MIN_KV_PAGES, MemoryModel, draw_kv_pages, kv_budget,
                                 shortfall_message)

LOWERED, DEFAULT = 40, 20   # HOST_SYSTEM_SHARE: the RowCache study's patched runtime, and the stock one


def pages(share: int, cache_gib: float, starts: int = 400) -> np.ndarray:
    budget = kv_budget(MemoryModel(host_system_share=share, row_cache_bytes=int(cache_gib * GIB)))
    return np.array([draw_kv_pages(budget, np.random.default_rng(seed)) for seed in range(starts)])


def test_lowered_reserve_at_1g_is_near_41300_with_small_noise() -> None:
    budget = kv_budget(MemoryModel(host_system_share=LOWERED))
    assert 41_300 <= budget.expected_pages <= 41_360       # the RowCache study: 41,358 and 41,301
    drawn = pages(LOWERED, 1)
    assert 41_200 <= drawn.min() and drawn.max() <= 41_500
    assert 10 < drawn.std() < 100


def test_4g_under_lowered_reserve_is_near_12900_with_noise_of_thousands() -> None:
    drawn = pages(LOWERED, 4)
    assert 12_000 <= np.median(drawn) <= 14_000            # the RowCache study: 14,215 and 11,548
    assert 800 < drawn.std() < 3_000
    assert np.percentile(drawn, 5) < 11_548 + 1_000 and np.percentile(drawn, 95) > 14_215


def test_3_gib_of_cache_costs_about_28400_pages() -> None:
    lost = (kv_budget(MemoryModel(host_system_share=LOWERED)).expected_pages
            - kv_budget(MemoryModel(host_system_share=LOWERED, row_cache_bytes=4 * GIB)).expected_pages)
    assert 27_500 <= lost <= 29_500


def test_default_reserve_at_1g_spans_the_reports_starts() -> None:
    drawn = pages(DEFAULT, 1)
    assert 11_000 <= np.median(drawn) <= 12_500
    assert 1_000 < drawn.std() < 3_000                      # "noise of thousands"
    # the RowCache study's starts (12,528 in the table; 11,320 to 16,952) are ordinary draws
    assert np.percentile(drawn, 2) < 11_320 and np.percentile(drawn, 98) > 16_000
    assert np.percentile(drawn, 25) < 12_528 < np.percentile(drawn, 90)
    assert drawn.min() >= MIN_KV_PAGES


def test_4g_under_default_reserve_does_not_fit_and_says_what_to_change() -> None:
    budget = kv_budget(MemoryModel(host_system_share=DEFAULT, row_cache_bytes=4 * GIB))
    assert not budget.fits
    message = shortfall_message(budget, cache_flag="4G")
    assert "not enough memory for the KV cache" in message
    assert "6.4 GiB system reserve (1/20 of host memory, HOST_SYSTEM_SHARE 20)" in message
    assert "4.0 GiB row cache (--embedding-table-cache-size 4G)" in message
    assert "needs at least" in message and "more than available" in message
    assert "Lower --embedding-table-cache-size or lower the system reserve (--host-system-share 40" in message
    with pytest.raises(ValueError, match="the KV budget does not fit: not enough memory"):
        draw_kv_pages(budget, np.random.default_rng(0))


def test_extra_cache_share_takes_about_6_percent_of_pages_at_1g() -> None:
    base = kv_budget(MemoryModel(host_system_share=LOWERED)).expected_pages
    more = kv_budget(MemoryModel(host_system_share=LOWERED, extra_cache_share=0.25)).expected_pages
    assert 0.05 <= 1 - more / base <= 0.07


def test_prefix_cache_memory_comes_out_of_the_kv_cache() -> None:
    base = kv_budget(MemoryModel(host_system_share=LOWERED)).expected_pages
    with_prefix = kv_budget(MemoryModel(host_system_share=LOWERED, prefix_cache_bytes=GIB)).expected_pages
    assert base - with_prefix == pytest.approx(GIB / MemoryModel().page_bytes)
    message = shortfall_message(kv_budget(MemoryModel(prefix_cache_bytes=20 * GIB)), cache_flag="1G")
    assert "20.0 GiB prefix cache (--prefix-cache-memory)" in message


def test_a_start_is_reproducible_from_its_seed() -> None:
    budget = kv_budget(MemoryModel())
    assert draw_kv_pages(budget, np.random.default_rng(7)) == draw_kv_pages(budget, np.random.default_rng(7))
    assert len(set(pages(DEFAULT, 1, starts=20))) > 15


@pytest.mark.parametrize(("field", "value", "match"), [
    ("host_system_share", 0, "`host_system_share` must be >= 1, got 0"),
    ("extra_cache_share", -0.1, "`extra_cache_share` must be >= 0, got -0.1"),
    ("page_bytes", 0, "`page_bytes` must be >= 1, got 0"),
])
def test_invalid_models_are_refused(field: str, value: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MemoryModel(**{field: value})  # type: ignore[arg-type]
