"""Print `tests/data/sglang-metrics.txt`: SGLang's /metrics as its source defines and prometheus_client prints it.

SGLang has no CPU build to run here, so its metrics are defined as SGLang 0.5.23's
`python/sglang/srt/observability/metrics_collector.py` defines them (names, help texts, label names,
buckets, gauges' `multiprocess_mode`, in the source's order), in the multiprocess mode SGLang runs
prometheus_client in with `--enable-metrics`, and driven as its server drives them: the warm-up request
that `/health_generate` waits for, then one request. The values are not a real server's
(tests/data/METRICS.md says which). Run it as a program, so prometheus_client is imported after
PROMETHEUS_MULTIPROC_DIR is set: `python -m tests.support.sglang_sample > tests/data/sglang-metrics.txt`.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

SERVED_MODEL = "tiny"
# SchedulerMetricsCollector.init_new: the scheduler's labels (tp 1, no dp, no priority scheduling)
SCHEDULER = {"model_name": SERVED_MODEL, "engine_type": "unified", "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}
# tokenizer_metric_labels(): a tokenizer metric's labels before each request's own
TOKENIZER = {"model_name": SERVED_MODEL, "engine_type": "unified"}
# radix_cache_metric_labels (0.5.21 on): the cache's class and its rank
RADIX = {"cache_type": "RadixCache", "tp_rank": 0, "pp_rank": 0, "dp_rank": 0}
# TokenizerMetricsCollector's default time-to-first-token buckets
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
POOL_TOKENS = 262144      # not a real server's: the scheduler's max_total_num_tokens
WARMUP_IDS = [10, 11, 12]  # _execute_server_warmup's input_ids under --skip-tokenizer-init
WARMUP_NEW_TOKENS = 8      # its max_new_tokens (a generation model)

HEADER = """\
# SGLang's /metrics as SGLang 0.5.23's source defines it (python/sglang/srt/observability/metrics_collector.py),
# printed by prometheus_client in multiprocess mode (tests/support/sglang_sample.py); not read from a live
# server (SGLang needs a GPU). Names, help texts, labels, buckets and which series exist when are the
# source's; the values are not (see METRICS.md). Part 1: the server once /health_generate answers, which it
# does only after its warm-up request (3 token IDs, 8 generated) finished and was counted.
"""
BETWEEN = """\
# --- next scrape ---
# Part 2: after one request of 4,000 prompt tokens, one generated, none cached: sglang:cached_tokens_total
# has no series (`if cached_tokens > 0`), nor sglang:evicted_tokens_total (`num_evicted > 0`: nothing evicted).
"""


def define() -> dict[str, Any]:
    """The metrics the profile reads and the scheduler's main gauges, defined as the source does."""
    from prometheus_client import Counter, Gauge, Histogram

    def gauge(name: str, documentation: str) -> Gauge:
        return Gauge(name=name, documentation=documentation, labelnames=SCHEDULER.keys(),
                     multiprocess_mode="mostrecent")

    tokenizer = list(TOKENIZER)
    return {
        "num_running_reqs": gauge("sglang:num_running_reqs", "The number of running requests."),
        "cache_hit_rate": gauge("sglang:cache_hit_rate", "The prefix cache hit rate."),
        "token_usage": gauge("sglang:token_usage", "The token usage."),
        "num_used_tokens": gauge("sglang:num_used_tokens", "The number of used tokens."),
        "max_total_num_tokens": gauge("sglang:max_total_num_tokens",
                                      "Maximum total number of tokens in the KV cache pool."),
        "prompt_tokens": Counter(name="sglang:prompt_tokens_total", documentation="Number of prefill tokens processed.",
                                 labelnames=[*tokenizer, "is_streaming"]),
        "generation_tokens": Counter(name="sglang:generation_tokens_total",
                                     documentation="Number of generation tokens processed.",
                                     labelnames=[*tokenizer, "is_streaming"]),
        "cached_tokens": Counter(name="sglang:cached_tokens_total",
                                 documentation="Number of cached prompt tokens by source (device/host/storage).",
                                 labelnames=[*tokenizer, "cache_source"]),
        "num_requests": Counter(name="sglang:num_requests_total", documentation="Number of requests processed.",
                                labelnames=[*tokenizer, "is_streaming"]),
        "ttft": Histogram(name="sglang:time_to_first_token_seconds",
                          documentation="Histogram of time to first token in seconds.",
                          labelnames=[*tokenizer, "is_streaming"], buckets=TTFT_BUCKETS),
        "evicted_tokens": Counter(name="sglang:evicted_tokens_total", documentation=(
            "The number of device KV token slots freed by eviction, regardless of whether the data was backed "
            "up to host (see sglang:hicache_backup_tokens_total) or destroyed (see "
            "sglang:hicache_dropped_tokens_total)."), labelnames=RADIX.keys()),
    }


def request(metrics: dict[str, Any], *, prompt: int, generated: int, ttft_s: float, used: int) -> None:
    """What one finished, non-streaming request without a cache hit moves: the scheduler's log_stats of its
    prefill batch, then the tokenizer manager's collect_metrics (observe_time_to_first_token,
    observe_one_finished_request)."""
    for name, value in (("num_running_reqs", 0), ("cache_hit_rate", 0.0), ("token_usage", round(used / POOL_TOKENS, 2)),
                        ("num_used_tokens", used)):
        metrics[name].labels(**SCHEDULER).set(value)
    stream = {**TOKENIZER, "is_streaming": "false"}
    metrics["ttft"].labels(**stream).observe(ttft_s)
    metrics["prompt_tokens"].labels(**stream).inc(prompt)
    metrics["generation_tokens"].labels(**stream).inc(generated)
    metrics["num_requests"].labels(**stream).inc(1)


def scrape() -> str:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry)   # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
    return generate_latest(registry).decode()


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
        metrics = define()
        metrics["max_total_num_tokens"].labels(**SCHEDULER).set(POOL_TOKENS)   # emit_constants, at start
        request(metrics, prompt=len(WARMUP_IDS), generated=WARMUP_NEW_TOKENS, ttft_s=0.0512, used=0)
        ready = scrape()
        request(metrics, prompt=4000, generated=1, ttft_s=0.0731, used=0)
        sys.stdout.write(HEADER + ready + BETWEEN + scrape())


if __name__ == "__main__":
    main()
