"""What a real llama-server (llama.cpp 0.5.0-dev, from the llama-cpp-python 0.3.36 sdist) does.

Each test asserts one fact of `tests/support/LLAMA_SERVER.md` against the real server with
the tiny model: readiness, the completions answer's shape, the Prometheus counters (names,
types, value format, when they move), what each cache flag reuses on which sequence, the
KV-size log lines, how a failed start ends, the usable token IDs. They are the runtime
contract a `llama-cpp` profile relies on, so a new pin that changes one fails here first.
The server is built when missing; a build that fails fails these tests (never a skip).
"""

from __future__ import annotations

import json
import math
import re
import socket
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np
import pytest

from tests.support import llama_build
from tests.support.llama_server import (
    LlamaServer, ServerExited, llama_server_binary, running_llama_server, start_llama_server,
)
from tests.support.tiny_model import TinyModel, make_tiny_model

PROMPT = 5_000
# one compute thread: on a shared two-core machine two threads spin against each other's load
# (a 5,000-token prefill took 4.1 s with -t 2 beside a build, 0.7 s with -t 1)
THREADS = ("-t", "1")
ONE_SLOT = ("-np", "1")
KV_LINE = re.compile(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(true|false)'")
KV_CELLS_LINE = re.compile(
    r"llama_kv_cache: size = +[\d.]+ MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\)")
COUNTERS = ("prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total",
            "tokens_predicted_total", "tokens_predicted_seconds_total", "n_decode_total", "n_tokens_max",
            "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
            "spec_decode_num_drafts_total")
GAUGES = ("prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing", "requests_deferred",
          "n_busy_slots_per_decode")


class ServeFn(Protocol):
    """The `serve` fixture: start a server with these flags."""

    def __call__(self, *flags: str) -> LlamaServer: ...


@pytest.fixture(scope="module")
def binary() -> Path:
    return llama_server_binary()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def serve(binary: Path, model: TinyModel, tmp_path: Path) -> Iterator[ServeFn]:
    """Start llama-server with the test's flags (plus one thread); stopped after the test."""
    servers: list[LlamaServer] = []

    def start(*flags: str) -> LlamaServer:
        server = start_llama_server(binary, model.path, tmp_path / f"server-{len(servers)}.log",
                                    [*THREADS, *flags])
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def prompts(model: TinyModel, seed: int, count: int, length: int = PROMPT) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(model.first_id, model.last_id + 1, length)] for _ in range(count)]


def metrics(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    return {m[1]: float(m[2]) for m in re.finditer(r"^llamacpp:(\w+) (\S+)$", text, re.M)}


def complete(client: httpx.Client, prompt: Sequence[int] | str, **extra: object) -> dict[str, Any]:
    """POST a one-token completion as the suite sends it; the answer's JSON body."""
    answer = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, "temperature": 0,
                                                    "stream": False, **extra})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


@dataclass(frozen=True)
class Served:
    """One request of a sequence as the server reported it, and what its counters moved by."""

    sent: int
    prompt_tokens: int
    cached_tokens: int
    cache_n: int
    prompt_n: int
    prompt_ms: float
    counted: int     # delta of llamacpp:prompt_tokens_total
    counted_cached: int   # delta of llamacpp:prompt_tokens_cached_total


def run_sequence(server: LlamaServer, sequence: Sequence[Sequence[int]]) -> list[Served]:
    served = []
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        for prompt in sequence:
            before = metrics(client)
            body = complete(client, prompt)
            after = metrics(client)
            usage, timings = body["usage"], body["timings"]
            served.append(Served(
                sent=len(prompt), prompt_tokens=usage["prompt_tokens"],
                cached_tokens=usage["prompt_tokens_details"]["cached_tokens"], cache_n=timings["cache_n"],
                prompt_n=timings["prompt_n"], prompt_ms=timings["prompt_ms"],
                counted=int(after["prompt_tokens_total"] - before["prompt_tokens_total"]),
                counted_cached=int(after["prompt_tokens_cached_total"] - before["prompt_tokens_cached_total"])))
    return served


# --- readiness and start -----------------------------------------------------------------------

def test_health_answers_503_while_loading_then_200_ok(serve: ServeFn) -> None:
    server = serve()
    loading = (503, '{"error":{"message":"Loading model","type":"unavailable_error","code":503}}')
    assert server.health[-1] == (200, '{"status":"ok"}')
    assert all(seen == loading for seen in server.health[:-1]), server.health
    assert server.start_s < 10.0, f"a start with the tiny model took {server.start_s:.2f} s"


def test_the_tiny_model_is_seeded_and_small(tmp_path: Path) -> None:
    for name in "abc":
        (tmp_path / name).mkdir()
    first, again = make_tiny_model(tmp_path / "a"), make_tiny_model(tmp_path / "b")
    other = make_tiny_model(tmp_path / "c", seed=1)
    assert first.path.read_bytes() == again.path.read_bytes()
    assert first.path.read_bytes() != other.path.read_bytes()
    assert first.path.stat().st_size < 8 * 2**20


def test_sigterm_stops_the_server_with_status_0(serve: ServeFn) -> None:
    assert serve().stop() == 0


# --- the completions answer ----------------------------------------------------------------------

def test_completion_of_token_ids_has_usage_timings_and_chat_shaped_logprobs(serve: ServeFn,
                                                                             model: TinyModel) -> None:
    server = serve(*ONE_SLOT)
    prompt = prompts(model, seed=1, count=1, length=10)[0]
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        body = complete(client, prompt, logprobs=20)
    assert set(body) == {"choices", "created", "model", "system_fingerprint", "object", "usage", "id", "timings"}
    assert body["object"] == "text_completion"
    assert body["usage"] == {"completion_tokens": 1, "prompt_tokens": 10, "total_tokens": 11,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    timings = body["timings"]
    assert set(timings) == {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
                            "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
    assert (timings["cache_n"], timings["prompt_n"], timings["predicted_n"]) == (0, 10, 1)
    (choice,) = body["choices"]
    assert set(choice) == {"text", "index", "logprobs", "finish_reason"} and choice["finish_reason"] == "length"
    # chat-shaped logprobs: one entry per generated token, each with its 20 top alternatives;
    # no legacy `tokens` / `token_logprobs` / `top_logprobs` lists beside `content`
    assert set(choice["logprobs"]) == {"content"}
    (token,) = choice["logprobs"]["content"]
    assert set(token) == {"id", "token", "bytes", "logprob", "top_logprobs"}
    assert len(token["top_logprobs"]) == 20
    assert all(set(top) == {"id", "token", "bytes", "logprob"} for top in token["top_logprobs"])
    assert token["top_logprobs"][0]["id"] == token["id"]   # temperature 0: the best one is sampled


def test_token_id_prompts_get_no_bos_but_text_prompts_do(serve: ServeFn, model: TinyModel) -> None:
    server = serve(*ONE_SLOT)
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        ids = prompts(model, seed=2, count=1, length=7)[0]
        assert complete(client, ids)["usage"]["prompt_tokens"] == 7
        pieces = client.post("/tokenize", json={"content": "hello world"}).json()["tokens"]
        assert complete(client, "hello world")["usage"]["prompt_tokens"] == len(pieces) + 1


def test_prompt_ids_outside_the_vocabulary_are_refused_and_v1_models_tells_its_size(
        serve: ServeFn, model: TinyModel) -> None:
    server = serve(*ONE_SLOT)
    invalid = {"error": {"code": 400, "message": "Prompt contains invalid tokens",
                         "type": "invalid_request_error"}}
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        for usable in ([0], [1, 2], [model.n_vocab - 1]):
            assert client.post("/v1/completions", json={"prompt": usable, "max_tokens": 1}).status_code == 200
        for unusable in ([model.n_vocab], [-1], [5, model.n_vocab + 1000]):
            answer = client.post("/v1/completions", json={"prompt": unusable, "max_tokens": 1})
            assert (answer.status_code, answer.json()) == (400, invalid)
        meta = client.get("/v1/models").json()["data"][0]["meta"]
        assert (meta["n_vocab"], meta["n_ctx_train"], meta["vocab_type"]) == (model.n_vocab, model.context, 1)
        props = client.get("/props").json()
        assert "n_vocab" not in props and "n_vocab" not in props["default_generation_settings"]


# --- /metrics --------------------------------------------------------------------------------------

def test_metrics_needs_the_flag(serve: ServeFn) -> None:
    server = serve()
    answer = httpx.get(server.base_url + "/metrics")
    assert answer.status_code == 501
    assert answer.json()["error"] == {
        "code": 501, "message": "This server does not support metrics endpoint. Start it with `--metrics`",
        "type": "not_supported_error"}


def test_metrics_names_and_types(serve: ServeFn) -> None:
    server = serve("--metrics")
    text = httpx.get(server.base_url + "/metrics").text
    declared = re.findall(r"^# TYPE llamacpp:(\w+) (\w+)$", text, re.M)
    assert declared == [(name, "counter") for name in COUNTERS] + [(name, "gauge") for name in GAUGES]
    # no labels, and a fresh server's values print as a bare 0
    assert re.findall(r"^llamacpp:\w+ (\S+)$", text, re.M) == ["0"] * (len(COUNTERS) + len(GAUGES))


@pytest.mark.slow
def test_counter_values_print_with_six_significant_digits(serve: ServeFn, model: TinyModel) -> None:
    """C++'s default stream format (%g, 6 digits): exact below 1,000,000, rounded above it."""
    server = serve("--metrics", *ONE_SLOT)
    (prompt,) = prompts(model, seed=3, count=1)
    cached = 0
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        while cached <= 1_000_000:
            cached += complete(client, prompt)["timings"]["cache_n"]
        text = client.get("/metrics").text
    printed = re.search(r"^llamacpp:prompt_tokens_cached_total (\S+)$", text, re.M)
    assert printed is not None
    assert printed[1] == f"{cached:.6g}" and "e+06" in printed[1], (printed[1], cached)
    seconds = re.search(r"^llamacpp:prompt_seconds_total (\S+)$", text, re.M)
    assert seconds is not None and len(seconds[1].replace(".", "").lstrip("0")) <= 6


def printed_step_s(value: float) -> float:
    """The step of a counter printed with six significant digits (`%g`) at `value`: 1e-5 s from 1 s."""
    return 10.0 ** (math.floor(math.log10(value)) - 5) if value > 0 else 0.0


@pytest.mark.slow
def test_counters_have_settled_when_the_response_arrives(serve: ServeFn, model: TinyModel) -> None:
    """No race: a scrape right after the answer (on another connection) already counts it. The prompt
    time counter times the decode calls, the response the whole prompt step from the slot's start: never
    less, and for most requests a little more. By how much is the machine's doing: a thread of a loaded
    machine that runs between the slot's start and its first decode widens that request's gap by its
    time slice, so the gap is bounded for the median request, not for each."""
    server = serve("--metrics", *ONE_SLOT)
    short = prompts(model, seed=4, count=60, length=10)
    long_ = prompts(model, seed=5, count=3)
    sequence = short + [long_[0], long_[0], long_[1], long_[2], long_[1]]
    gaps_ms = []
    with httpx.Client(base_url=server.base_url, timeout=60) as client, \
            httpx.Client(base_url=server.base_url, timeout=60) as scraper:
        for prompt in sequence:
            before = metrics(scraper)
            timings = complete(client, prompt)["timings"]
            after = metrics(scraper)
            assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == timings["prompt_n"]
            assert after["prompt_tokens_cached_total"] - before["prompt_tokens_cached_total"] == timings["cache_n"]
            assert after["tokens_predicted_total"] - before["tokens_predicted_total"] == 1
            seconds_ms = (after["prompt_seconds_total"] - before["prompt_seconds_total"]) * 1000
            rounding_ms = 1000 * (printed_step_s(before["prompt_seconds_total"]) +
                                  printed_step_s(after["prompt_seconds_total"]))
            assert seconds_ms > 0 and timings["prompt_ms"] - seconds_ms >= -rounding_ms, \
                (timings["prompt_ms"], seconds_ms, rounding_ms)
            gaps_ms.append(timings["prompt_ms"] - seconds_ms)
    assert statistics.median(gaps_ms) <= 5, sorted(gaps_ms)


# --- what each cache flag reuses on which sequence ---------------------------------------------------

def _sequence(kind: str, model: TinyModel, seed: int) -> list[list[int]]:
    a, b = prompts(model, seed=seed, count=2)
    new_start = prompts(model, seed=seed + 1, count=1, length=16)[0]
    return {
        "exact re-sends": [a, b, a, b],
        "exact re-send at once": [a, a],
        "re-read dropping 16 at once": [a, a[16:], b, b[16:]],
        "re-read dropping 16 later": [a, b, a[16:], b[16:]],
        "new start (first 16 replaced)": [a, new_start + a[16:]],
    }[kind]


CACHE_CASES = [
    # flags, sequence, cached tokens per request
    (ONE_SLOT, "exact re-sends", [0, 0, 4999, 4999]),                          # --cache-ram (8192 MiB default)
    ((*ONE_SLOT, "--cache-ram", "0"), "exact re-sends", [0, 0, 0, 0]),
    ((*ONE_SLOT, "--no-cache-prompt"), "exact re-sends", [0, 0, 0, 0]),
    ((), "exact re-sends", [0, 0, 0, 0]),          # 4 slots share 8,192 unified cells: restores fail
    ((*ONE_SLOT, "--cache-ram", "0"), "exact re-send at once", [0, 4999]),    # the slot's own KV
    ((*ONE_SLOT, "--no-cache-prompt"), "exact re-send at once", [0, 0]),
    (ONE_SLOT, "re-read dropping 16 at once", [0, 0, 0, 0]),
    ((*ONE_SLOT, "--cache-reuse", "256"), "re-read dropping 16 at once", [0, 4983, 0, 4983]),
    ((*ONE_SLOT, "--cache-reuse", "256", "--cache-ram", "0"), "re-read dropping 16 at once", [0, 4983, 0, 4983]),
    (("--cache-reuse", "256"), "re-read dropping 16 at once", [0, 0, 0, 0]),  # LRU gives another slot
    ((*ONE_SLOT, "--cache-reuse", "256"), "re-read dropping 16 later", [0, 0, 0, 0]),
    ((*ONE_SLOT, "--cache-reuse", "256"), "new start (first 16 replaced)", [0, 0]),
    (ONE_SLOT, "new start (first 16 replaced)", [0, 0]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "kind", "cached"), CACHE_CASES,
                         ids=[f"{' '.join(f) or 'defaults'}: {k}" for f, k, _ in CACHE_CASES])
def test_what_each_cache_flag_reuses(serve: ServeFn, model: TinyModel, flags: tuple[str, ...], kind: str,
                                     cached: list[int]) -> None:
    served = run_sequence(serve("--metrics", *flags), _sequence(kind, model, seed=10))
    assert [s.cached_tokens for s in served] == cached
    for s in served:   # the response and the counters agree, and nothing is counted twice
        assert s.prompt_tokens == s.sent == s.cache_n + s.prompt_n
        assert (s.cache_n, s.prompt_n) == (s.cached_tokens, s.sent - s.cached_tokens)
        assert (s.counted_cached, s.counted) == (s.cache_n, s.prompt_n)


@pytest.mark.slow
@pytest.mark.parametrize(("baseline", "candidate", "kind", "rereads"), [
    ((*ONE_SLOT, "--cache-ram", "0"), ONE_SLOT, "exact re-sends", (2, 3)),
    (ONE_SLOT, (*ONE_SLOT, "--cache-reuse", "256"), "re-read dropping 16 at once", (1, 3)),
])
def test_a_candidate_beats_its_baseline_in_hit_rate_and_prompt_time(
        serve: ServeFn, model: TinyModel, baseline: tuple[str, ...], candidate: tuple[str, ...], kind: str,
        rereads: tuple[int, ...]) -> None:
    """The pairs the report recommends: hits / (hits + misses) from the counters' deltas over the
    sequence, and the re-reads' server-side prompt time."""
    def hit_rate_and_reread_ms(flags: tuple[str, ...]) -> tuple[float, float]:
        served = run_sequence(serve("--metrics", *flags), _sequence(kind, model, seed=20))
        hits, misses = sum(s.counted_cached for s in served), sum(s.counted for s in served)
        return hits / (hits + misses), sum(served[i].prompt_ms for i in rereads)

    base_rate, base_ms = hit_rate_and_reread_ms(baseline)
    cand_rate, cand_ms = hit_rate_and_reread_ms(candidate)
    assert base_rate == 0.0 and 0.49 < cand_rate < 0.5, (base_rate, cand_rate)
    assert cand_ms * 3 < base_ms, (base_ms, cand_ms)


# --- KV capacity in the log --------------------------------------------------------------------------

@pytest.mark.parametrize(("flags", "slots", "ctx_slot", "unified"), [
    ((), 4, 8192, "true"),                     # -c 0: the model's n_ctx_train, shared by 4 slots
    (("-c", "4096"), 4, 4096, "true"),
    (ONE_SLOT, 1, 8192, "false"),
    ((*ONE_SLOT, "-c", "4096"), 1, 4096, "false"),
    ((*ONE_SLOT, "-c", "5000"), 1, 5120, "false"),   # rounded up to a multiple of 256
    (("-np", "2", "-c", "4096"), 2, 2048, "false"),  # split between the slots
    (("-c", "20000"), 4, 8192, "true"),        # a slot never gets more than n_ctx_train
])
def test_kv_size_at_the_default_verbosity(serve: ServeFn, flags: tuple[str, ...], slots: int, ctx_slot: int,
                                          unified: str) -> None:
    log = serve(*flags).wait_for_log(KV_LINE)
    assert KV_LINE.findall(log) == [(str(slots), str(ctx_slot), unified)]
    assert KV_CELLS_LINE.search(log) is None, "the cells line needs -lv 4"


def test_kv_cells_at_verbosity_4(serve: ServeFn) -> None:
    log = serve("-c", "4096", "-lv", "4").wait_for_log(KV_LINE)
    assert KV_CELLS_LINE.findall(log) == [("4096", "1", "4", "1")]
    assert KV_LINE.findall(log) == [("4", "4096", "true")]


# --- a start that fails ---------------------------------------------------------------------------------

@contextmanager
def _listening() -> Iterator[tuple[str, int]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield "127.0.0.1", int(sock.getsockname()[1])


def test_a_missing_model_exits_1_and_names_the_file(binary: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing.gguf"
    with pytest.raises(ServerExited, match="exited with status 1 before it was ready") as failed:
        start_llama_server(binary, missing, tmp_path / "server.log")
    assert failed.value.status == 1
    lines = failed.value.log.splitlines()
    assert lines[-1].endswith("E srv  llama_server: exiting due to model loading error")
    assert any(line.endswith(f"E gguf_init_from_file: failed to open GGUF file '{missing}' "
                             f"(No such file or directory)") for line in lines)


def test_an_unknown_flag_exits_1_and_names_it(binary: Path, model: TinyModel, tmp_path: Path) -> None:
    with pytest.raises(ServerExited, match="status 1") as failed:
        start_llama_server(binary, model.path, tmp_path / "server.log", ["--no-such-flag"])
    assert failed.value.log.splitlines()[-1] == "error: invalid argument: --no-such-flag"


def test_a_taken_port_exits_1(binary: Path, model: TinyModel, tmp_path: Path) -> None:
    with _listening() as (address, port), pytest.raises(ServerExited, match="status 1") as failed:
        with running_llama_server(binary, model.path, tmp_path / "server.log", ["--port", str(port)],
                                  address=address):
            pass
    lines = failed.value.log.splitlines()
    assert lines[-1].endswith("E srv  llama_server: exiting due to HTTP server error")
    assert any(line.endswith(f"couldn't bind HTTP server socket, hostname: {address}, port: {port}")
               for line in lines)


# --- the build ----------------------------------------------------------------------------------------------

def test_a_build_that_fails_raises_with_the_log_tail_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(llama_build.BUILD_DIR_ENV, str(tmp_path))
    # pip with no index and no configuration: the download fails at once, offline
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(llama_build.BuildFailed, match=r"(?s)exited with status 1.*No matching distribution"):
        llama_build.ensure_built("0.3.36")
    folder = tmp_path / "llama-server"
    assert sorted(p.name for p in folder.iterdir()) == ["0.3.36.lock", "0.3.36.log"]


def test_a_build_of_other_options_is_not_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(llama_build.BUILD_DIR_ENV, str(tmp_path))
    folder = llama_build.install_dir("9.9.9")
    folder.mkdir(parents=True)
    (folder / llama_build.TARGET).write_bytes(b"")
    record = {"llama-cpp-python": "9.9.9", "cmake_options": ["-DGGML_NATIVE=ON"], "target": llama_build.TARGET}
    (folder / "build.json").write_text(json.dumps(record))
    assert llama_build.built_binary("9.9.9") is None
    record["cmake_options"] = list(llama_build.CMAKE_OPTIONS)
    (folder / "build.json").write_text(json.dumps(record))
    assert llama_build.built_binary("9.9.9") == folder / llama_build.TARGET
