"""What a real vLLM 0.32.0 (its CPU build) does, pinned: the facts the `vllm` profile rests on.

Two servers, each started once for this module: prefix caching on (with the prompt's cached tokens
in usage) and off (without them); a third, with a pool of five blocks, for the decode steps' blocks. A 4,000-token prompt P, another Q, then P again; the metric
deltas, the usage, the start-up log and /metrics are read from each. The last test stops both with
SIGTERM. vLLM is installed when missing (`tests.support.vllm_build`); these tests FAIL when it
cannot be.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cache_qualify.config.profiles import resolve
from cache_qualify.emulation.model import Prompts
from cache_qualify.emulation.registry import predict
from cache_qualify.emulation.sources import VERSION, BuildCache, StartFacts, read_build
from cache_qualify.trials.exchange import Exchange, RequestShape, exchange
from cache_qualify.trials.measure import parse_metrics
from tests.support.llama_server import LlamaServer
from tests.support.recorded_vllm import two_prompts as prompts   # P and Q, as the recorded bodies have them
from tests.support.vllm_server import (MODEL_NAME, group_alive, running_vllm_server, start_vllm_server,  # noqa: F401
                                       stop_group, vllm)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]

DATA = Path(__file__).resolve().parent / "data"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "vllm.yaml"
PROMPT = 4000
BLOCK = 128


@dataclass
class Served:
    """One server and what the three requests gave: the metrics before P and after each request."""

    server: LlamaServer
    bodies: list[str] = field(default_factory=list)
    answers: list[dict[str, Any]] = field(default_factory=list)

    def values(self, index: int) -> dict[str, float]:
        parsed = parse_metrics(self.bodies[index], host="vllm", rank=0)
        return {name: value for (name, _table), value in parsed.items()}

    def delta(self, name: str, before: int, after: int) -> float:
        return self.values(after)[name] - self.values(before)[name]


def serve(server: LlamaServer) -> Served:
    served = Served(server)
    p, q = prompts()
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        served.bodies.append(client.get("/metrics").text)
        for tokens in (p, q, p):
            answer = client.post("/v1/completions", json={"model": MODEL_NAME, "prompt": tokens, "max_tokens": 1,
                                                           "temperature": 0})
            assert answer.status_code == 200, answer.text
            served.answers.append(answer.json())
            served.bodies.append(client.get("/metrics").text)
    return served


@pytest.fixture(scope="module")
def caching_on(vllm: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("vllm-on") / "server.log"
    server = start_vllm_server(*vllm, log, ["--enable-prefix-caching", "--enable-prompt-tokens-details"])
    try:
        yield serve(server)
    finally:
        stop_group(server)


@pytest.fixture(scope="module")
def caching_off(vllm: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("vllm-off") / "server.log"
    server = start_vllm_server(*vllm, log, ["--no-enable-prefix-caching"])
    try:
        yield serve(server)
    finally:
        stop_group(server)


def test_a_re_read_with_caching_on_hits_its_whole_blocks(caching_on: Served) -> None:
    whole = PROMPT // BLOCK * BLOCK   # 3,968: the last partial block is always computed
    for name, grew in (("vllm:prefix_cache_queries_total", PROMPT), ("vllm:prefix_cache_hits_total", whole),
                       ("vllm:prompt_tokens_total", PROMPT), ("vllm:prompt_tokens_cached_total", whole),
                       ("vllm:request_prefill_kv_computed_tokens_sum", PROMPT - whole)):
        assert caching_on.delta(name, 2, 3) == grew, name
    assert caching_on.delta("vllm:prefix_cache_hits_total", 0, 1) == 0
    # each request's prefill is timed by the server (a sum and a count of its histogram); whether the
    # cache saves prefill time is the gate's question, asked over several starts: one request of the
    # tiny model prefills in tens of ms, which a loaded machine's stalls reach either way
    assert caching_on.delta("vllm:request_prefill_time_seconds_sum", 0, 1) > 0
    assert caching_on.delta("vllm:request_prefill_time_seconds_sum", 2, 3) > 0
    assert caching_on.delta("vllm:request_prefill_time_seconds_count", 2, 3) == 1
    assert caching_on.delta("vllm:time_to_first_token_seconds_count", 2, 3) == 1


def test_usage_has_the_cached_tokens_with_details_on(caching_on: Served) -> None:
    details = [answer["usage"]["prompt_tokens_details"] for answer in caching_on.answers]
    assert [d["cached_tokens"] for d in details] == [0, 0, PROMPT // BLOCK * BLOCK]
    assert caching_on.answers[2]["usage"]["prompt_tokens"] == PROMPT
    assert caching_on.answers[2]["choices"][0]["text"] == ""   # the tokenizer is skipped


def test_with_caching_off_the_lookup_is_skipped_and_usage_has_no_details(caching_off: Served) -> None:
    assert caching_off.delta("vllm:prefix_cache_queries_total", 0, 3) == 0
    assert caching_off.delta("vllm:prefix_cache_hits_total", 0, 3) == 0
    assert caching_off.delta("vllm:prompt_tokens_total", 2, 3) == PROMPT
    assert caching_off.delta("vllm:request_prefill_kv_computed_tokens_sum", 2, 3) == PROMPT
    assert [answer["usage"]["prompt_tokens_details"] for answer in caching_off.answers] == [None] * 3


def cache_config(served: Served) -> dict[str, str]:
    line = next(line for line in served.bodies[0].splitlines() if line.startswith("vllm:cache_config_info{"))
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def test_the_kv_line_and_cache_config_info(caching_on: Served, caching_off: Served) -> None:
    for served in (caching_on, caching_off):
        assert "CPU KV cache size: 2,097,152 tokens" in served.server.log()
    on, off = cache_config(caching_on), cache_config(caching_off)
    assert (on["block_size"], on["num_gpu_blocks"], on["kv_cache_size_tokens"]) == ("128", "16384", "2097152")
    assert (on["enable_prefix_caching"], off["enable_prefix_caching"]) == ("True", "False")


def names(body: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in body.splitlines() if line.startswith("vllm:")}


def test_the_recorded_bodies_are_this_server_s(caching_on: Served, caching_off: Served) -> None:
    for served, recorded in ((caching_on, "vllm-metrics.txt"), (caching_off, "vllm-metrics-no-caching.txt")):
        bodies = (DATA / recorded).read_text(encoding="utf-8").split("\n# --- next scrape ---\n")
        assert len(bodies) == 4
        assert names(bodies[3]) == names(served.bodies[3]), recorded


def stream_lines(server: LlamaServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of one streamed completion, as sent (``data:`` lines, ``[DONE]`` left out)."""
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        with client.stream("POST", "/v1/completions", json=body) as answer:
            assert answer.status_code == 200, answer.read()
            data = [line[len("data: "):] for line in answer.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]", data
    return [json.loads(chunk) for chunk in data[:-1]]


def test_without_a_tokenizer_a_stream_s_text_is_empty_and_its_token_ids_time_each_chunk(caching_on: Served) -> None:
    """--skip-tokenizer-init: every token chunk's text is empty, so a client that times text sees no token;
    asked `return_token_ids`, each chunk carries its tokens' IDs. A chunk is one token while the server
    keeps up, but a loaded server merges tokens (a CI run saw 4 tokens in 3 chunks), so only the IDs'
    total is pinned. The replay's client, shaped by the vllm profile, stamps every chunk that brings
    tokens (one inter-token gap per chunk, as `vllm bench serve` counts) and reads the usage chunk."""
    p, _ = prompts()
    body = {"model": MODEL_NAME, "prompt": p[:64], "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    for ids in (False, True):
        chunks = stream_lines(caching_on.server, {**body, "return_token_ids": ids})
        tokens = [c["choices"][0] for c in chunks if c["choices"]]
        assert 1 <= len(tokens) <= 4 and all(t["text"] == "" for t in tokens), chunks
        counts = [len(t.get("token_ids") or ()) for t in tokens]
        if ids:
            assert sum(counts) == 4 and min(counts) >= 1, tokens
        else:
            assert counts == [0] * len(tokens), tokens
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    shape = RequestShape.of_profile(resolve("vllm"), stream=True, model_name=MODEL_NAME)

    async def send() -> Exchange:
        async with httpx.AsyncClient(base_url=caching_on.server.base_url) as client:
            return await exchange(client, shape, p[:64], 4, timeout_s=120)

    got = asyncio.run(send())
    assert got.error == "" and got.output_tokens == 4 and got.prompt_tokens == 64, got
    times = got.token_times_s
    assert 1 <= len(times) <= 4 and 0 < times[0] and list(times) == sorted(times) and times[-1] <= got.e2e_s, got


def test_sigterm_stops_each_server_and_its_processes(caching_on: Served, caching_off: Served) -> None:
    """Within the grace the example gives a stop before SIGKILL: a bound a lab's stop keeps whatever the
    machine's load (a loaded machine stretches a Python process's shutdown as it does its start)."""
    grace_s = float(yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))["server"]["stop_grace_s"])
    for served in (caching_on, caching_off):
        assert served.server.stop(grace_s) == 0, served.server.log_tail()   # not SIGKILLed after the grace
        # the engine's processes go with it (vLLM force-kills what is left of them)
        wait_for(lambda: not group_alive(served.server), grace_s, "no process left in the server's group")


def test_decode_steps_take_blocks_and_evict_as_the_emulator_predicts(vllm: tuple[Path, Path], tmp_path: Path) -> None:
    """The decode counterexample on the real vLLM (a start of its own: the pool must be tiny): blocks of 32, a
    pool of 5 (the null block and 4), prompts of 64 and 96 tokens then the first 64 again, each generating 1,
    then 2, then 16 tokens (`ignore_eos`: exactly that many). With one output token the third request is
    served its first block (32); with 2 and with 16 the second request's decode steps take the pool's last
    free blocks and evict it: 0. The emulator, under the parameters read from this start's flags, /metrics
    and log, predicts every request's cached tokens exactly."""
    kv_bytes = 5 * 32 * 512   # the tiny model's KV is 512 bytes a token (2 x 1 layer x 64 x float32)
    flags = ["--enable-prefix-caching", "--enable-prompt-tokens-details", "--block-size", "32",
             "--kv-cache-memory-bytes", str(kv_bytes), "--max-model-len", "128"]
    sent: list[list[int]] = []
    generated: list[int] = []
    served: list[int] = []
    with running_vllm_server(*vllm, tmp_path / "vllm.log", flags) as server:
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            for outputs, base in ((1, 100), (2, 300), (16, 500)):
                first, second = list(range(base, base + 64)), list(range(base + 100, base + 196))
                for tokens in (first, second, first):
                    answer = client.post("/v1/completions", json={
                        "model": MODEL_NAME, "prompt": tokens, "max_tokens": outputs, "ignore_eos": True,
                        "temperature": 0})
                    assert answer.status_code == 200, answer.text
                    usage = answer.json()["usage"]
                    assert usage["completion_tokens"] == outputs, usage
                    served.append(int((usage["prompt_tokens_details"] or {}).get("cached_tokens") or 0))
                    sent.append(tokens)
                    generated.append(outputs)
            metrics = client.get("/metrics").text
        facts = StartFacts(tuple(str(a) for a in server.process.args), metrics, server.log())  # type: ignore[union-attr]
    spec = resolve("vllm").emulator
    assert spec is not None
    cache = read_build("decode", spec, facts)
    assert isinstance(cache, BuildCache) and cache.params["block_size"] == 32, cache
    assert cache.params["num_gpu_blocks"] == 5, cache
    # the start logs its version (api_utils.py's log_version_and_model), the one the emulator follows
    assert cache.origins[VERSION].startswith("vLLM 0.32.0 (the log's "), cache.origins
    prediction = predict(cache.emulator, cache.params, Prompts.of(sent, generated))
    assert served == prediction.cached_tokens.tolist() == [0, 0, 32, 0, 0, 0, 0, 0, 0], (served, prediction)
