"""Run in vLLM's own environment (`tests.support.vllm_build`): vLLM's KVCacheManager replays prompts one
request at a time as its scheduler admits them, offline (no server, no model).

Reads ``{"block_size", "num_gpu_blocks", "prompts", "outputs"}`` as JSON on stdin (``outputs``, per request
its max_tokens, 1 each when left out); prints ``{"hits": [cached tokens per request], "queries",
"total_hits"}`` (its PrefixCacheStats, what vllm:prefix_cache_queries_total and _hits_total count). Per
request: get_computed_blocks, allocate_slots for the rest of the prompt, record_prefix_cache_stats; then, as
the scheduler runs its decode steps, each generated token but the last appended and a slot allocated for
it (allocate_slots with one new token); then free (a request of max_tokens 1 finishes with its prefill).
"""

import json
import sys

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request


def main() -> None:
    spec = json.load(sys.stdin)
    block_size, blocks = spec["block_size"], spec["num_gpu_blocks"]
    init_none_hash(sha256)
    group = KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                                          dtype=torch.float32))
    manager = KVCacheManager(KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[group]),
                             max_model_len=blocks * block_size, scheduler_block_size=block_size,
                             hash_block_size=block_size, enable_caching=True, log_stats=True)
    hasher = get_request_block_hasher(block_size, sha256)
    hits = []
    outputs = spec.get("outputs") or [1] * len(spec["prompts"])
    for i, (prompt, generated) in enumerate(zip(spec["prompts"], outputs)):
        request = Request(str(i), prompt, SamplingParams(max_tokens=generated), None, block_hasher=hasher)
        computed_blocks, computed, _ = manager.get_computed_blocks(request)
        assert manager.allocate_slots(request, len(prompt) - computed, computed, computed_blocks) is not None
        manager.record_prefix_cache_stats(request, computed)
        request.num_computed_tokens = len(prompt)
        hits.append(computed)
        for k in range(generated - 1):   # each decode step computes the token the step before sampled
            request.append_output_token_ids(1_000_000 + 1_000 * i + k)
            assert manager.allocate_slots(request, 1) is not None
            request.num_computed_tokens += 1
        manager.free(request)
    stats = manager.make_prefix_cache_stats()
    print(json.dumps({"hits": hits, "queries": stats.queries, "total_hits": stats.hits}))


if __name__ == "__main__":
    main()
