"""A rank's replay memo: remembered results are exactly the replayed ones, whatever the history."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from cache_qualify.sim import memo as memo_module
from cache_qualify.sim.memo import ReplayMemo
from cache_qualify.sim.prefill import PrefillJob, PrefillResult, RankWorker, plan_job
from cache_qualify.sim.rowcache import CacheCounters

CACHE_BYTES = 64 << 20   # 9,360 rows a table: the jobs below evict, refuse and hit


def jobs(seed: int, n: int = 5) -> list[PrefillJob]:
    """A start's requests: prompts over a small vocabulary (rows repeat), decode tokens fed back,
    part of a prompt served from the prefix cache now and then."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt = rng.integers(0, 3000, size=int(rng.integers(2000, 6000)), dtype=np.uint32)
        fed_back = rng.integers(0, 3000, size=int(rng.integers(0, 40)), dtype=np.uint32)
        cached = ((0, 512),) if i % 2 else ()
        out.append(plan_job(i, prompt, fed_back, cached=cached, first_request=i == 0, chunk_tokens=1024))
    return out


def worker(memo: ReplayMemo | None, *, seed: int = 11, policy: str = "two_choice") -> RankWorker:
    return RankWorker(rank=1, policy=policy, cache_bytes=CACHE_BYTES, seed=seed, memo=memo)


def served(w: RankWorker, sequence: list[PrefillJob]) -> list[tuple[PrefillResult, list[CacheCounters]]]:
    """Each job's result and the counters the rank exports after it."""
    return [(w.run(job), w.counters()) for job in sequence]


def replayed_lookups(w: RankWorker) -> int:
    return sum(cache.counters().lookups for cache in w.caches)


def test_a_remembered_start_gives_every_figure_of_a_replayed_one_without_replaying(tmp_path: Path) -> None:
    sequence = jobs(1)
    reference = served(worker(None), sequence)
    assert sum(c.refused + c.evictions for c in reference[-1][1]) > 0 and 0 < reference[-1][1][0].hit_rate < 1
    cold = worker(ReplayMemo(tmp_path))
    assert served(cold, sequence) == reference
    assert cold.memo is not None and (cold.memo.read, cold.memo.written) == (0, len(sequence))
    warm = worker(ReplayMemo(tmp_path))
    assert served(warm, sequence) == reference   # misses, waits (their noise too) and counters
    assert warm.memo is not None and warm.memo.read == len(sequence)
    assert replayed_lookups(warm) == 0, "a remembered start replayed its trace"


def test_a_start_that_departs_from_a_remembered_one_catches_up_exactly(tmp_path: Path) -> None:
    sequence = jobs(1)
    served(worker(ReplayMemo(tmp_path)), sequence)
    departing = sequence[:3] + jobs(2, n=1) + sequence[3:]
    reference = served(worker(None), departing)
    w = worker(ReplayMemo(tmp_path))
    assert served(w, departing) == reference
    assert w.memo is not None and w.memo.read == 3   # the rest follow another history: replayed
    assert replayed_lookups(w) == reference[-1][1][0].lookups + reference[-1][1][1].lookups


@pytest.mark.parametrize("other", [{"seed": 12}, {"policy": "set4"}])
def test_a_rank_made_otherwise_reads_nothing_of_another(tmp_path: Path, other: dict[str, object]) -> None:
    sequence = jobs(1, n=2)
    served(worker(ReplayMemo(tmp_path)), sequence)
    w = worker(ReplayMemo(tmp_path), **other)  # type: ignore[arg-type]
    assert served(w, sequence) == served(worker(None, **other), sequence)  # type: ignore[arg-type]
    assert w.memo is not None and w.memo.read == 0


def test_a_damaged_entry_is_replayed_and_written_again(tmp_path: Path) -> None:
    sequence = jobs(1, n=3)
    first = ReplayMemo(tmp_path)
    reference = served(worker(first), sequence)
    entries = sorted(first.folder.glob("*.json"))
    assert len(entries) == 3
    for entry in entries:
        entry.write_text('{"misses": [1, 2')
    again = worker(ReplayMemo(tmp_path))
    assert served(again, sequence) == reference
    assert again.memo is not None and (again.memo.read, again.memo.written) == (0, 3)
    assert served(worker(ReplayMemo(tmp_path)), sequence) == reference


def test_results_of_other_code_are_removed_once_stale_and_the_folder_stays_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another version's folder is another checkout's (sharing the cache folder) or older code's:
    kept while it is in use, removed once nothing was written to it for `STALE_AFTER_S`."""
    stale, recent = tmp_path / "0123456789abcdef", tmp_path / "fedcba9876543210"
    for other in (stale, recent):
        other.mkdir()
        (other / "x.json").write_text("{}")
    week_ago = time.time() - memo_module.STALE_AFTER_S - 60
    os.utime(stale, (week_ago, week_ago))
    monkeypatch.setattr(memo_module, "MAX_ENTRIES", 4)
    memo = ReplayMemo(tmp_path)
    counters = [CacheCounters(1, 0, 1, 1, 0, 0, 1, 8)]
    for i in range(5):
        memo.put(f"{i:040x}", (1,), counters)
    assert not stale.exists() and (recent / "x.json").exists()
    memo._bound()
    assert len(list(memo.folder.glob("*.json"))) == 3   # the oldest half of five (two) dropped


def test_a_folder_that_cannot_be_written_is_no_memo_and_no_error(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    sequence = jobs(1, n=2)
    w = worker(ReplayMemo(blocked))
    assert served(w, sequence) == served(worker(None), sequence)
    assert w.memo is not None and w.memo.written == 0
