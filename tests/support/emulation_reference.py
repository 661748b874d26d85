"""Plain references of the SGLang and llama.cpp emulators' rules (docs/emulation.md), written apart
from the emulators: tokens instead of page ids, scans instead of heaps, lists instead of arrays."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Tokens = tuple[int, ...]


class _Seg:
    def __init__(self, key: Tokens, parent: _Seg | None, now: int) -> None:
        self.key, self.parent = key, parent
        self.kids: dict[Tokens, _Seg] = {}
        self.lock = 0
        self.seen = now
        self.hits = 0


RANK: dict[str, Callable[[int], Callable[[_Seg], tuple[int, ...]]]] = {
    "lru": lambda _: lambda s: (s.seen,), "lfu": lambda _: lambda s: (s.hits, s.seen),
    "slru": lambda threshold: lambda s: (int(s.hits >= threshold), s.seen)}


class ReferenceRadix:
    """SGLang's RadixCache one request at a time, on token tuples."""

    def __init__(self, page: int, capacity_tokens: int, policy: str, threshold: int = 2) -> None:
        self.page, self.capacity = page, capacity_tokens // page * page
        self.rank = RANK[policy](threshold)
        self.now = 0
        self.root = _Seg((), None, 0)
        self.root.lock = 1
        self.evicted = 0

    def _time(self) -> int:
        self.now += 1
        return self.now

    def _all(self) -> list[_Seg]:
        out, todo = [], [self.root]
        while todo:
            seg = todo.pop()
            out.append(seg)
            todo.extend(seg.kids.values())
        return out

    def held(self) -> int:
        return sum(len(s.key) for s in self._all())

    def _lcp_pages(self, a: Tokens, b: Tokens) -> int:
        n = 0
        while n + self.page <= min(len(a), len(b)) and a[n:n + self.page] == b[n:n + self.page]:
            n += self.page
        return n

    def _split(self, seg: _Seg, at: int) -> _Seg:
        parent = seg.parent
        assert parent is not None
        upper = _Seg(seg.key[:at], parent, self._time())
        upper.hits, upper.lock = seg.hits, seg.lock
        seg.key, seg.parent = seg.key[at:], upper
        upper.kids[seg.key[:self.page]] = seg
        parent.kids[upper.key[:self.page]] = upper
        return upper

    def _go(self, key: Tokens, insert: bool) -> tuple[_Seg, int]:
        now = self._time()
        seg, done = self.root, 0
        seg.seen = now
        while key[done:done + self.page] in seg.kids and len(key) - done >= self.page:
            kid = seg.kids[key[done:done + self.page]]
            kid.seen = now
            n = self._lcp_pages(kid.key, key[done:])
            done += n
            if n < len(kid.key):
                seg = self._split(kid, n)
                if insert:
                    seg.hits += 1
                    continue
                break
            seg = kid
            if insert:
                seg.hits += 1
        return seg, done

    def request(self, prompt: Sequence[int]) -> int:
        tokens = tuple(int(t) for t in prompt)
        aligned = len(tokens) // self.page * self.page
        limit = (len(tokens) - 1) // self.page * self.page
        last, matched = self._go(tokens[:limit], insert=False)
        node: _Seg | None = last
        while node is not None and node is not self.root:
            node.lock += 1
            node = node.parent
        need = -(-(len(tokens) - matched) // self.page) * self.page
        # paged, SGLang asks a page more per request than the new tokens (mem_cache/allocation.py)
        short = len(tokens) - matched + (self.page if self.page > 1 else 0) - (self.capacity - self.held())
        freed = 0
        while freed < short:
            leaves = [s for s in self._all() if s is not self.root and not s.kids and s.lock == 0]
            if not leaves:
                break
            victim = min(leaves, key=self.rank)
            assert victim.parent is not None
            del victim.parent.kids[victim.key[:self.page]]
            freed += len(victim.key)
        self.evicted += max(freed, 0)
        assert need <= self.capacity - self.held(), "prompt does not fit"
        seg, done = self._go(tokens[:aligned], insert=True)
        if done < aligned:
            leaf = _Seg(tokens[done:aligned], seg, self._time())
            leaf.hits = 1
            seg.kids[leaf.key[:self.page]] = leaf
        node = last
        while node is not None and node is not self.root:
            node.lock -= 1
            node = node.parent
        return matched


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def reference_llama(prompts: Sequence[Sequence[int]], *, n_ctx: int, cache_ram_mib: int, bytes_per_token: int,
                    overhead: int = 0, similarity: float = 0.1) -> tuple[list[int], int]:
    """(cached tokens per request, prompt states dropped) of llama-server's one slot and --cache-ram."""
    f = np.float32
    limit = max(cache_ram_mib, 0) * 1024 * 1024
    states: list[list[int]] = []
    dropped = 0
    slot: list[int] = []
    out = []

    def size(s: list[int]) -> int:
        return overhead + bytes_per_token * len(s)

    def drop_while(cond: Callable[[], bool]) -> None:
        nonlocal dropped
        while states and cond():
            states.pop(0)
            dropped += 1

    for prompt in prompts:
        new = [int(t) for t in prompt]
        update = True
        if similarity != 0 and slot:
            sim = f(_lcp(slot, new)) / f(len(new))
            if sim > f(0) and sim > f(similarity):
                update = bool(sim * f(len(new)) / f(len(slot)) < f(0.5))
        if update and cache_ram_mib != 0:
            fits = not (limit and size(slot) > limit)
            if slot and fits and not any(_lcp(s, slot) == len(slot) for s in states):
                states[:] = [s for s in states if _lcp(s, slot) != len(s)]
                drop_while(lambda: bool(limit) and sum(map(size, states)) + size(slot) > limit)
                states.append(list(slot))
            keep_best = f(_lcp(slot, new)) / f(len(slot)) if slot else f(-1)
            sim_best = f(_lcp(slot, new)) / f(len(new))
            best = None
            for s in states:
                keep, sim = f(_lcp(s, new)) / f(len(s)), f(_lcp(s, new)) / f(len(new))
                if keep >= f(0.25) and keep_best < keep and sim_best < sim:
                    keep_best, sim_best, best = keep, sim, s
            if best is not None:
                states.remove(best)
                slot = best
            drop_while(lambda: bool(limit) and sum(map(size, states)) > limit)
            per = max(f(1), f(sum(map(size, states))) / f(max(1, sum(map(len, states)))))
            tokens = max(n_ctx, int(f(limit) / per)) if limit else n_ctx
            drop_while(lambda: sum(map(len, states)) > tokens)
        past = _lcp(slot, new)
        out.append(past - 1 if past == len(new) else past)
        slot = new
    return out, dropped
