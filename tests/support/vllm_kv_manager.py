"""Run in vLLM's own environment (`tests.support.vllm_build`): vLLM's KVCacheManager replays prompts one
request at a time as its scheduler admits them, offline (no server, no model).

Reads ``{"block_size", "num_gpu_blocks", "prompts"}`` as JSON on stdin; prints ``{"hits": [cached tokens
per request], "queries", "total_hits"}`` (its PrefixCacheStats, what vllm:prefix_cache_queries_total and
_hits_total count). Per request: get_computed_blocks, allocate_slots for the rest of the prompt,
record_prefix_cache_stats, then free (a request of max_tokens 1 finishes with its prefill).
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
    for i, prompt in enumerate(spec["prompts"]):
        request = Request(str(i), prompt, SamplingParams(max_tokens=1), None, block_hasher=hasher)
        computed_blocks, computed, _ = manager.get_computed_blocks(request)
        assert manager.allocate_slots(request, len(prompt) - computed, computed, computed_blocks) is not None
        manager.record_prefix_cache_stats(request, computed)
        hits.append(computed)
        manager.free(request)
    stats = manager.make_prefix_cache_stats()
    print(json.dumps({"hits": hits, "queries": stats.queries, "total_hits": stats.hits}))


if __name__ == "__main__":
    main()
