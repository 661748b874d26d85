"""The prefix-cache emulators (cache_qualify.emulation): each against a plain reference of its rules on
seeded random workloads, counter for counter, and on small cases worked by hand from the runtimes'
source (docs/emulation.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cache_qualify.emulation import EMULATORS, Prompts, emulator, parameters, predict
from cache_qualify.emulation.block_reference import exact_keys, reference_replay
from cache_qualify.emulation.llama_slot import LlamaSlotCache
from cache_qualify.emulation.sglang_radix import POLICIES, SglangRadixCache
from cache_qualify.emulation.vllm_block import VllmBlockCache
from cache_qualify.errors import EmulationError
from tests.support.emulation_reference import ReferenceRadix, reference_llama
from tests.support.labfixtures import REPO, run_cli
from tests.support.vllm_server import vllm_python


def random_prompts(rng: np.random.Generator, *, count: int, longest: int, vocabulary: int = 3) -> list[np.ndarray]:
    """Prompts that share prefixes often: cuts of a few bases, each with a short random tail."""
    bases = [rng.integers(0, vocabulary, size=int(rng.integers(1, longest))) for _ in range(5)]
    out = []
    for _ in range(count):
        base = bases[int(rng.integers(len(bases)))]
        cut = base[:int(rng.integers(1, base.size + 1))]
        out.append(np.concatenate([cut, rng.integers(0, vocabulary, size=int(rng.integers(0, 8)))])[:longest])
    return out


def cached(name: str, prompts: list[list[int]], **params: object) -> list[int]:
    result: list[int] = predict(name, params, Prompts.of(prompts)).cached_tokens.tolist()
    return result


# -- vLLM ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_vllm_block_cache_matches_the_ordered_dict_pool_on_random_workloads(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(40):
        block_size, blocks = int(rng.integers(1, 6)), int(rng.integers(4, 40))
        prompts = Prompts.of(random_prompts(rng, count=int(rng.integers(1, 40)), longest=(blocks - 1) * block_size))
        prediction = VllmBlockCache(block_size, blocks).predict(prompts)
        expected, evicted = reference_replay(exact_keys(prompts, block_size), prompts.lengths,
                                             block_size=block_size, num_gpu_blocks=blocks)
        assert prediction.cached_tokens.tolist() == expected
        assert prediction.evicted == evicted
        assert prediction.hits == sum(expected) and prediction.queries == int(prompts.lengths.sum())


@pytest.mark.parametrize("seed", range(3))
def test_vllm_decode_blocks_match_the_ordered_dict_pool_on_random_workloads(seed: int) -> None:
    """Each request generating 1 to 9 tokens: the blocks its decode steps fill, in the jitted pool and the
    plain one alike."""
    rng = np.random.default_rng(100 + seed)
    for _ in range(40):
        block_size, blocks = int(rng.integers(1, 6)), int(rng.integers(14, 40))
        raw = random_prompts(rng, count=int(rng.integers(1, 40)), longest=(blocks - 3) * block_size - 8)
        prompts = Prompts.of(raw, rng.integers(1, 10, size=len(raw)))
        prediction = VllmBlockCache(block_size, blocks).predict(prompts)
        expected, evicted = reference_replay(exact_keys(prompts, block_size), prompts.lengths,
                                             block_size=block_size, num_gpu_blocks=blocks,
                                             kv_lengths=prompts.kv_lengths)
        assert prediction.cached_tokens.tolist() == expected and prediction.evicted == evicted


@pytest.mark.parametrize(("generated", "served"), [(1, [0, 0, 4]), (2, [0, 0, 0])])
def test_vllm_s_decode_step_allocates_a_block_and_can_evict(generated: int, served: list[int]) -> None:
    """Blocks of 4, a pool of 5 (the null block and 4), prompts of 8 and 12 tokens then the first 8 again:
    with one generated token each the first prompt's leading block survives the second; with two, the
    second request's decode step takes the pool's last free block, evicting it (vllm/v1/core/
    kv_cache_manager.py allocate_slots, scheduler.py: a decode step schedules one token), so vLLM 0.32.0
    serves 0 cached tokens on the third (checked on its own KVCacheManager, and on a real vLLM by
    tests/test_vllm_server.py)."""
    first, second = list(range(100, 108)), list(range(200, 212))
    prediction = VllmBlockCache(4, 5).predict(Prompts.of([first, second, first], generated))
    assert prediction.cached_tokens.tolist() == served


def test_vllm_never_serves_the_block_a_prompt_ends_in() -> None:
    """max_cache_hit_length = num_tokens - 1: 8 tokens in blocks of 4 reuse one block, 9 reuse two."""
    prompt = list(range(8))
    assert cached("vllm-block", [prompt, prompt, prompt + [99]], block_size=4, num_gpu_blocks=10) == [0, 4, 8]


def test_vllm_keys_chain_from_the_first_block() -> None:
    """A changed first block: no later block is reused, though each has the same tokens."""
    first = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert cached("vllm-block", [first, [0, 2, 3, 4, 5, 6, 7, 8, 9], first], block_size=2,
                  num_gpu_blocks=20) == [0, 0, 8]


def test_vllm_evicts_a_finished_prompt_s_tail_first() -> None:
    """Four usable blocks of 2: P1 and P2 fill them, a one-block prompt then evicts P1's tail block
    (the older prompt's, freed first, so at the queue's front): P1's head block still serves, and
    all of P2."""
    p1, p2 = [1, 2, 3, 4], [5, 6, 7, 8]
    assert cached("vllm-block", [p1, p2, [9, 10], p1 + [0]], block_size=2, num_gpu_blocks=5) == [0, 0, 0, 2]
    assert cached("vllm-block", [p1, p2, [9, 10], p2 + [0]], block_size=2, num_gpu_blocks=5) == [0, 0, 0, 4]


def test_vllm_recomputes_a_whole_block_prompt_s_last_block_into_a_copy() -> None:
    """The same two-block prompt four times in four usable blocks: each repeat computes its last block
    into a new block holding the cached key again, so the fourth evicts one copy, and a longer prompt
    still finds the key in another."""
    prompt, params = [1, 2, 3, 4], {"block_size": 2, "num_gpu_blocks": 5}
    assert predict("vllm-block", params, Prompts.of([prompt] * 4)).evicted == 1
    assert cached("vllm-block", [prompt] * 4 + [prompt + [5]], **params) == [0, 2, 2, 2, 4]


def test_vllm_without_prefix_caching_counts_no_query() -> None:
    result = predict("vllm-block", {"block_size": 2, "num_gpu_blocks": 9, "prefix_caching": False},
                     Prompts.of([[1, 2, 3]] * 3))
    assert (result.queries, result.hits, result.cached_tokens.tolist()) == (0, 0, [0, 0, 0])


def test_vllm_refuses_a_prompt_larger_than_the_pool() -> None:
    with pytest.raises(EmulationError, match=r"request 1 holds 9 tokens \(its prompt and generated tokens\), more "
                                             r"than the 4 usable blocks of 2 tokens"):
        predict("vllm-block", {"block_size": 2, "num_gpu_blocks": 5}, Prompts.of([[1], list(range(9))]))
    # 7 tokens fit 4 blocks of 2, but not with 3 generated (the first two written into the cache)
    with pytest.raises(EmulationError, match=r"request 0 holds 9 tokens"):
        predict("vllm-block", {"block_size": 2, "num_gpu_blocks": 5}, Prompts.of([list(range(7))], 3))


# -- SGLang -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", list(POLICIES))
def test_sglang_radix_cache_matches_the_reference_on_random_workloads(policy: str) -> None:
    rng = np.random.default_rng(len(policy))
    for _ in range(25):
        page, pages = int(rng.integers(1, 4)), int(rng.integers(6, 30))
        raw = random_prompts(rng, count=int(rng.integers(1, 30)), longest=pages * page - page)
        prediction = SglangRadixCache(page, pages * page, policy).predict(Prompts.of(raw))
        reference = ReferenceRadix(page, pages * page, policy)
        assert prediction.cached_tokens.tolist() == [reference.request(p) for p in raw]
        assert prediction.evicted == reference.evicted


def test_sglang_lfu_keeps_the_prompt_read_most_where_lru_keeps_the_latest() -> None:
    """Ten tokens of pool: A three times, then B, then C needs four: lru evicts A (touched before B),
    lfu evicts B (hit once, A three times); A again finds itself only under lfu."""
    a, b, c = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    workload = [a, a, a, b, c, a]
    assert cached("sglang-radix", workload, page_size=1, max_total_num_tokens=10, eviction_policy="lru")[-1] == 0
    assert cached("sglang-radix", workload, page_size=1, max_total_num_tokens=10, eviction_policy="lfu")[-1] == 3


@pytest.mark.parametrize(("page_size", "served"), [(4, [0, 0, 0]), (1, [0, 0, 7])])
def test_sglang_asks_a_page_more_than_a_paged_request_needs(page_size: int, served: list[int]) -> None:
    """4-token pages, a 12-token pool, prompts of 8, 4, then the first 8 again: the 4-token prompt's
    allocation asks its page and one more (SGLang 0.5.23, mem_cache/allocation.py
    alloc_paged_token_slots_extend), so the first prompt's leaf (both its pages) is evicted and the third
    request is served 0; unpaged, the new tokens alone are asked and the first prompt stays."""
    first, second = list(range(100, 108)), list(range(200, 204))
    assert cached("sglang-radix", [first, second, first], page_size=page_size, max_total_num_tokens=12) == served


@pytest.mark.parametrize(("chunk", "served"), [(-1, 0), (8, 8)], ids=["whole", "chunks-of-8"])
def test_sglang_evicts_a_chunked_prompt_s_last_chunk_and_keeps_its_first(chunk: int, served: int) -> None:
    """4-token pages, a 20-token pool, prompts of 16, 4, then the first 16 again. Prefilled in chunks of 8
    (--chunked-prefill-size 8), the first prompt is inserted into the tree a chunk at a time (SGLang 0.5.23,
    mem_cache/common.py checkpoint_kv_cache, radix_cache.py:510-543): two nodes of two pages, so the 4-token
    prompt's allocation (its page and one more, a page short) evicts the last chunk's leaf only and the third
    request is served the first chunk, 8 tokens; inserted whole, the prompt is one leaf, evicted whole (0)."""
    first, second = list(range(100, 116)), list(range(200, 204))
    assert cached("sglang-radix", [first, second, first], page_size=4, max_total_num_tokens=20,
                  chunked_prefill_size=chunk) == [0, 0, served]


@pytest.mark.parametrize("seed", range(3))
def test_chunked_replays_that_evict_nothing_serve_what_whole_ones_do(seed: int) -> None:
    """Random workloads under every modelled policy, chunks of 1 to 5 pages, a pool none of them fills: the chunk
    boundaries split nodes but free nothing, so every request is served what it is served prefilled whole."""
    rng = np.random.default_rng(560 + seed)
    for _ in range(20):
        raw = random_prompts(rng, count=int(rng.integers(1, 25)), longest=60, vocabulary=2)
        params = {"page_size": int(rng.choice([1, 2, 4])), "max_total_num_tokens": 10_000,
                  "eviction_policy": str(rng.choice(["lru", "lfu", "slru"]))}
        chunk = int(rng.integers(1, 6)) * params["page_size"]  # type: ignore[operator]
        whole = predict("sglang-radix", params, Prompts.of(raw))
        chunked = predict("sglang-radix", {**params, "chunked_prefill_size": chunk}, Prompts.of(raw))
        assert chunked.cached_tokens.tolist() == whole.cached_tokens.tolist() and chunked.evicted == 0


def test_chunks_change_only_what_an_eviction_takes() -> None:
    """Without eviction a chunked prompt ends in the tree as it would whole: the prediction is the same, and as
    exact (the warm-up's leaves aside: they matter only once the pool evicts)."""
    prompts = Prompts.of([list(range(100)), list(range(30)), list(range(90))])
    params = {"page_size": 4, "max_total_num_tokens": 1000}
    whole, chunked = (predict("sglang-radix", {**params, "chunked_prefill_size": c}, prompts) for c in (-1, 16))
    assert whole.cached_tokens.tolist() == chunked.cached_tokens.tolist() == [0, 28, 88]
    assert whole.exact and chunked.exact


def test_sglang_s_slru_protects_from_the_threshold_its_config_sets() -> None:
    """Ten tokens of pool: A twice (2 hits), B once, then C needs three tokens more than are free. SLRU's default
    threshold 2 protects A, so B goes and A is served; `{"protected_threshold": 3}` leaves both probationary
    and the older A goes, its two nodes (evict_policy.py SLRUStrategy of 0.5.23)."""
    a, b, c = [1, 2, 3], [4, 5, 6], [7, 8, 9, 10, 11, 12, 13]
    workload = [a, a, b, c, a]
    assert cached("sglang-radix", workload, page_size=1, max_total_num_tokens=10, eviction_policy="slru")[-1] == 2
    assert cached("sglang-radix", workload, page_size=1, max_total_num_tokens=10, eviction_policy="slru",
                  slru_protected_threshold=3)[-1] == 0


def test_the_warm_up_s_leaves_make_an_evicting_or_one_token_page_replay_not_exact() -> None:
    """SGLang's warm-up (entrypoints/http_server.py:2360) and readiness probes (:751) leave leaves of a length
    the model decides in the tree at ready: they take pool pages (an eviction comes earlier) and may share a
    one-token page (BOS) with the first prompt, so a replay that evicts, or on one-token pages, is not exact."""
    first, second = list(range(100, 108)), list(range(200, 204))
    assert predict("sglang-radix", {"page_size": 4, "max_total_num_tokens": 64}, Prompts.of([first, first])).exact
    assert not predict("sglang-radix", {"page_size": 4, "max_total_num_tokens": 12},
                       Prompts.of([first, second, first])).exact
    assert not predict("sglang-radix", {"page_size": 1, "max_total_num_tokens": 64}, Prompts.of([first, first])).exact


def test_sglang_matches_whole_pages_short_of_the_last_token() -> None:
    ten, nine = list(range(10)), list(range(9))
    assert cached("sglang-radix", [ten, ten, nine], page_size=4, max_total_num_tokens=64) == [0, 8, 8]
    assert cached("sglang-radix", [ten, [7] + ten[1:]], page_size=4, max_total_num_tokens=64) == [0, 0]
    assert cached("sglang-radix", [ten, ten], page_size=4, max_total_num_tokens=64, radix_cache=False) == [0, 0]


# -- llama.cpp ----------------------------------------------------------------------------------------

def test_llama_slot_reuses_the_common_prefix_less_the_last_token() -> None:
    p = list(range(100))
    hits = cached("llama-slot", [p, p[:60] + [500] * 10, p[:60] + [500] * 10], n_ctx=4096, cache_ram_mib=0)
    assert hits == [0, 60, 69]


def test_llama_cache_ram_restores_an_earlier_prompt_the_slot_lost() -> None:
    """A, then B sharing nothing (the slot is taken as least recently used: A is saved), then A extended:
    restored from host memory with --cache-ram, computed again without it or when A's state exceeds it."""
    a, b = list(range(100)), list(range(1000, 1100))
    workload = [a, b, a + [7] * 20]
    assert cached("llama-slot", workload, n_ctx=4096, cache_ram_mib=64, state_bytes_per_token=1024)[-1] == 100
    assert cached("llama-slot", workload, n_ctx=4096, cache_ram_mib=0)[-1] == 0
    too_big = 1024 * 1024 // 50  # 100 tokens of this are about 2 MiB: over a 1 MiB cache
    assert cached("llama-slot", workload, n_ctx=4096, cache_ram_mib=1, state_bytes_per_token=too_big)[-1] == 0


def test_llama_host_cache_holds_the_whole_context_not_a_slots() -> None:
    """Two slots of 1,024 cells each (-np 2 -c 2048, no unified buffer) and an unlimited --cache-ram: the host
    cache's token limit is the server's context, 2,048 (server-context.cpp:1097 and :1340), so the first
    conversation's saved 600 tokens outlive the second's save and are restored for its continuation; a limit of
    one slot's 1,024 would have dropped them (0 cached)."""
    a, b, c = ([*range(k * 1000, k * 1000 + 600)] for k in (1, 2, 3))
    two_slots = {"n_ctx": 1024, "cache_ram_mib": -1, "state_bytes_per_token": 1, "n_slots": 2, "kv_unified": False}
    assert cached("llama-slot", [a, b, c, a + [7] * 10], **two_slots) == [0, 0, 0, 600]
    assert cached("llama-slot", [a, b, c, a + [7] * 10], **two_slots, n_ctx_total=1024) == [0, 0, 0, 0]
    # one buffer shared by the slots: each may use all of it, so the context is the slot's
    assert LlamaSlotCache(**{**two_slots, "kv_unified": True}).context_tokens == 1024  # type: ignore[arg-type]


# The real llama-server's measured cached tokens with one slot (tests/support/LLAMA_SERVER.md, checked
# against the server by tests/test_llama_server.py::test_what_each_cache_flag_reuses): fresh 5,000-token
# prompts; the tiny model's state is 700,048 bytes at 5,000 tokens ("failed to restore state with size").
TINY_STATE = {"state_bytes_per_token": 140, "state_overhead_bytes": 48}
MEASURED = [
    ({}, "A, B, A, B", [0, 0, 4999, 4999]),
    ({"cache_ram_mib": 0}, "A, B, A, B", [0, 0, 0, 0]),
    ({"cache_prompt": False}, "A, B, A, B", [0, 0, 0, 0]),
    ({"cache_ram_mib": 0}, "A, A", [0, 4999]),
    ({"cache_prompt": False}, "A, A", [0, 0]),
    ({}, "A, A[16:], B, B[16:]", [0, 0, 0, 0]),
    ({}, "A, B, A[16:], B[16:]", [0, 0, 0, 0]),
    ({}, "A, X+A[16:]", [0, 0]),
]


@pytest.mark.parametrize(("flags", "sequence", "measured"), MEASURED, ids=[f"{f}: {s}" for f, s, _ in MEASURED])
def test_llama_slot_gives_what_the_real_server_measured(flags: dict[str, object], sequence: str,
                                                        measured: list[int]) -> None:
    rng = np.random.default_rng(10)
    a, b = (rng.integers(259, 32_000, 5_000).tolist() for _ in range(2))
    x = rng.integers(259, 32_000, 16).tolist()
    prompts = {"A, B, A, B": [a, b, a, b], "A, A": [a, a], "A, A[16:], B, B[16:]": [a, a[16:], b, b[16:]],
               "A, B, A[16:], B[16:]": [a, b, a[16:], b[16:]], "A, X+A[16:]": [a, x + a[16:]]}[sequence]
    params = {"n_ctx": 8_192, **TINY_STATE, **flags}
    assert cached("llama-slot", prompts, **params) == measured


@pytest.mark.parametrize("seed", range(4))
def test_llama_slot_cache_matches_the_reference_on_random_workloads(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    for _ in range(25):
        raw = random_prompts(rng, count=int(rng.integers(1, 30)), longest=60, vocabulary=2)
        params = {"n_ctx": int(rng.integers(61, 200)), "cache_ram_mib": int(rng.choice([-1, 0, 1])),
                  "state_bytes_per_token": int(rng.choice([1, 20_000, 60_000])),
                  "slot_prompt_similarity": float(rng.choice([0.0, 0.1, 0.5]))}
        prediction = LlamaSlotCache(**params).predict(Prompts.of(raw))  # type: ignore[arg-type]
        expected, dropped = reference_llama(raw, n_ctx=params["n_ctx"], cache_ram_mib=params["cache_ram_mib"],
                                            bytes_per_token=params["state_bytes_per_token"],
                                            similarity=params["slot_prompt_similarity"])
        assert prediction.cached_tokens.tolist() == expected
        assert prediction.evicted == dropped


# -- the registry -------------------------------------------------------------------------------------

def test_the_registry_names_each_emulator_and_its_parameters() -> None:
    assert list(EMULATORS) == ["vllm-block", "sglang-radix", "llama-slot"]
    assert parameters("vllm-block") == ("block_size", "num_gpu_blocks", "prefix_caching")
    assert emulator("sglang-radix", {"page_size": 1, "max_total_num_tokens": 8}) == SglangRadixCache(1, 8)
    shown = predict("vllm-block", {"block_size": 2, "num_gpu_blocks": 9}, Prompts.of([[1, 2, 3]] * 2)).as_dict()
    assert shown == {"emulator": "vllm-block", "queries": 6, "hits": 2, "prompt_tokens": 6, "hit_rate": 2 / 6,
                     "evicted": 0, "evicted_unit": "blocks", "exact": True, "cached_tokens": [0, 2]}


@pytest.mark.parametrize(("name", "params", "message"), [
    ("vllm", {}, r"no cache emulator named 'vllm': the emulators are vllm-block, sglang-radix, llama-slot"),
    ("vllm-block", {"block_size": 16, "blocks": 9},
     r"emulator vllm-block: unknown parameter\(s\) blocks; it takes block_size, num_gpu_blocks, prefix_caching"),
    ("vllm-block", {"block_size": 16}, r"emulator vllm-block: .*num_gpu_blocks"),
    ("vllm-block", {"block_size": 0, "num_gpu_blocks": 9}, r"parameter `block_size` must be a positive integer, found 0"),
    ("vllm-block", {"block_size": 16, "num_gpu_blocks": 1}, r"`num_gpu_blocks` must be at least 2 \(the null block"),
    ("sglang-radix", {"page_size": 1, "max_total_num_tokens": 8, "eviction_policy": "lfru"},
     r"`eviction_policy` must be one of lru, lfu, slru, priority, tlru \(the choices of --radix-eviction-policy\), "
     r"found 'lfru'"),
    # evict_policy.py ranks fifo, but SGLang 0.5.23's command line does not accept it (arg_groups/choices.py:190)
    ("sglang-radix", {"page_size": 1, "max_total_num_tokens": 8, "eviction_policy": "fifo"},
     r"`eviction_policy` must be one of lru, lfu, slru, priority, tlru"),
    ("sglang-radix", {"page_size": 1, "max_total_num_tokens": 8, "eviction_policy": "tlru"},
     r"^not predicted: --radix-eviction-policy tlru is not modelled \(it ranks by each conversation's length"),
    ("llama-slot", {"n_ctx": 512}, r"parameter `state_bytes_per_token` must be a positive integer, found 0"),
])
def test_bad_parameters_are_one_line_naming_the_parameter(name: str, params: dict[str, object], message: str) -> None:
    with pytest.raises(EmulationError, match=message):
        emulator(name, params)


def test_an_empty_prompt_is_refused() -> None:
    with pytest.raises(EmulationError, match=r"prompt 1 of the workload is empty"):
        Prompts.of([[1], []])


def test_importing_the_emulators_loads_no_numba() -> None:
    """numba is imported by a vLLM replay, never by the import: the gate's processes stay light."""
    code = "import sys, cache_qualify.emulation; print('numba' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


# -- the benchmark ------------------------------------------------------------------------------------

NUMBER = r"\d+(?:\.\d+)?"


@pytest.mark.slow
def test_the_benchmark_prints_both_speeds_and_their_ratio() -> None:
    """`bench-prefix-emulator` on a small workload: its lines, and a ratio that is the two speeds'."""
    done = run_cli("bench-prefix-emulator", "--requests", "200", "--repeat", "1")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(rf"^bench-prefix-emulator: vLLM block cache, 200 prompts .* blocks of 16 tokens, 20,000 "
                     rf"blocks: [\d,]+ block lookups, hit rate {NUMBER} %, same hits in both$", out, re.M), out
    speeds = {name: float(value) for name, value in re.findall(rf"^(jitted|OrderedDict) +({NUMBER}) M/s$", out, re.M)}
    assert set(speeds) == {"jitted", "OrderedDict"}, out
    ratio = re.search(rf"^ratio +({NUMBER})x \(targets: jitted >= 10 M/s, ratio >= 5x\)$", out, re.M)
    assert ratio, out
    assert abs(float(ratio.group(1)) - speeds["jitted"] / speeds["OrderedDict"]) <= 0.1 + 0.02 * float(ratio.group(1))
    assert re.search(rf"^keys +{NUMBER} M blocks/s", out, re.M), out


@pytest.mark.slow
def test_vllm_block_cache_matches_vllm_s_own_kv_cache_manager() -> None:
    """vLLM 0.32.0's KVCacheManager, run offline in its own environment, on seeded workloads under
    eviction pressure: the same cached tokens per request and the same counters."""

    python = vllm_python()
    rng = np.random.default_rng(7)
    for block_size, blocks in ((1, 12), (2, 9), (4, 30), (16, 40)):
        raw = random_prompts(rng, count=120, longest=(blocks - 1) * block_size, vocabulary=2 + block_size)
        spec = {"block_size": block_size, "num_gpu_blocks": blocks, "prompts": [p.tolist() for p in raw]}
        vllm = own_manager(python, spec)
        prediction = VllmBlockCache(block_size, blocks).predict(Prompts.of(raw))
        assert prediction.cached_tokens.tolist() == vllm["hits"], (block_size, blocks)
        assert (prediction.queries, prediction.hits) == (vllm["queries"], vllm["total_hits"])
        assert prediction.hits > 0 and prediction.evicted > 0  # reuse and eviction both exercised


def own_manager(python: Path, spec: dict[str, object]) -> dict[str, Any]:
    """What vLLM's own KVCacheManager serves for `spec` (tests/support/vllm_kv_manager.py)."""
    done = subprocess.run([str(python), "-m", "tests.support.vllm_kv_manager"], input=json.dumps(spec),
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    served: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return served


@pytest.mark.slow
def test_vllm_decode_blocks_match_vllm_s_own_kv_cache_manager() -> None:
    """Generated tokens written into the blocks step by step, as vLLM 0.32.0's KVCacheManager allocates them
    offline: the decode counterexample with 2 and 16 output tokens, and seeded workloads of 1 to 20 output
    tokens a request under eviction pressure, the same cached tokens per request."""
    python = vllm_python()
    first, second = list(range(100, 108)), list(range(200, 212))
    for generated, blocks in ((2, 5), (16, 8)):
        spec = {"block_size": 4, "num_gpu_blocks": blocks, "prompts": [first, second, first],
                "outputs": [generated] * 3}
        prediction = VllmBlockCache(4, blocks).predict(Prompts.of([first, second, first], generated))
        assert prediction.cached_tokens.tolist() == own_manager(python, spec)["hits"] == [0, 0, 0], generated
    rng = np.random.default_rng(11)
    for block_size, blocks in ((2, 20), (4, 30), (16, 12)):
        raw = random_prompts(rng, count=100, longest=(blocks - 3) * block_size - 20, vocabulary=2 + block_size)
        outputs = rng.integers(1, 21, size=len(raw))
        spec = {"block_size": block_size, "num_gpu_blocks": blocks, "prompts": [p.tolist() for p in raw],
                "outputs": outputs.tolist()}
        prediction = VllmBlockCache(block_size, blocks).predict(Prompts.of(raw, outputs))
        assert prediction.cached_tokens.tolist() == own_manager(python, spec)["hits"], (block_size, blocks)
        assert prediction.hits > 0 and prediction.evicted > 0
