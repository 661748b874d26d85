"""Tests of cache_qualify.trials.client against a real HTTP server on a loopback address.

The server answers like the emulated rank 0: an OpenAI-style completion whose
usage counts the prompt actually posted; each test bends one part of it.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from cache_qualify.trials.client import CompletionResult, CompletionsClient
from cache_qualify.trials.exchange import Exchange, RequestShape, exchange
from cache_qualify.errors import InvalidResponse, PrefixReuse, RequestFailed, RequestTimeout
from tests.support.httpfixtures import Reply, Request, StubServer, json_reply

HOST = "127.0.0.21"
PATH = "/v1/completions"
PROMPT = list(range(1_000, 1_010))
CACHED = "usage.prompt_tokens_details.cached_tokens"   # the flare profile's `prefix_cached`


def completion(prompt_tokens: int, *, cached: int = 0, top: int = 20,
               logprobs: bool = True) -> dict[str, Any]:
    """A completion document shaped like the emulated server's."""
    choice: dict[str, Any] = {"index": 0, "text": " the", "finish_reason": "length"}
    if logprobs:
        choice["logprobs"] = {
            "tokens": [" the"], "token_logprobs": [-0.5], "text_offset": [0],
            "top_logprobs": [{f" t{i}": -0.5 - i for i in range(top)}]}
    else:
        choice["logprobs"] = None
    return {"id": "cmpl-1", "object": "text_completion", "model": "flare", "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1,
                      "total_tokens": prompt_tokens + 1,
                      "prompt_tokens_details": {"cached_tokens": cached}}}


def echo_server(request: Request) -> Reply:
    """Counts the posted prompt and honours `logprobs`, as a correct server does."""
    posted = request.json()
    asked = posted.get("logprobs")
    document = completion(len(posted["prompt"]), top=asked or 0, logprobs=asked is not None)
    return json_reply(document, delay_s=0.05)


@pytest.fixture
def rank0(stub_servers: Callable[[str], StubServer]) -> StubServer:
    server = stub_servers(HOST)
    server.serve(PATH, echo_server)
    return server


def client_for(server: StubServer, **options: Any) -> CompletionsClient:
    return CompletionsClient(server.url, host=server.host, **options)


def test_a_good_response_gives_its_usage_and_duration(rank0: StubServer) -> None:
    with client_for(rank0) as client:
        result = client.complete("A", PROMPT, fields=("usage.total_tokens",), forbid_cached=CACHED)
    assert result == CompletionResult(request="A", prompt_tokens=10, completion_tokens=1,
                                      duration_s=result.duration_s, finish_reason="length",
                                      fields={"usage.total_tokens": 11.0, CACHED: 0.0})
    assert 0.05 <= result.duration_s < 5  # client-side, includes the server's 50 ms
    [request] = rank0.requests
    assert request.method == "POST" and request.path == PATH
    assert request.json() == {"prompt": PROMPT, "max_tokens": 1, "logprobs": 20,
                              "stream": False, "temperature": 0}


def test_options_reach_the_server(rank0: StubServer) -> None:
    with client_for(rank0, model="deepseek-v4.1-flash") as client:
        result = client.complete("B", PROMPT[:3], max_tokens=2, logprobs=None)
    assert result.prompt_tokens == 3
    posted = rank0.requests[0].json()
    assert posted["model"] == "deepseek-v4.1-flash" and posted["max_tokens"] == 2
    assert "logprobs" not in posted


def test_one_extra_top_logprob_for_the_sampled_token_is_accepted(rank0: StubServer) -> None:
    rank0.serve(PATH, json_reply(completion(len(PROMPT), top=21)))
    with client_for(rank0) as client:
        assert client.complete("A", PROMPT).prompt_tokens == len(PROMPT)


def _without(document: dict[str, Any], *path: str | int) -> dict[str, Any]:
    node: Any = document
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return document


@pytest.mark.parametrize(("document", "problem"), [
    (_without(completion(10), "usage", "prompt_tokens_details", "cached_tokens"),
     r"usage\.prompt_tokens_details\.cached_tokens is missing, and the suite reads it"),
    (_without(completion(10), "usage", "prompt_tokens_details"),
     r"usage\.prompt_tokens_details\.cached_tokens is missing, and the suite reads it"),
    ({**completion(10), "usage": {**completion(10)["usage"], "prompt_tokens_details": {"cached_tokens": "0"}}},
     r"usage\.prompt_tokens_details\.cached_tokens is '0', expected a finite number"),
    (_without(completion(10), "usage"), r"usage: Field required"),
    ({**completion(10), "choices": []}, r"choices: List should have at least 1 item"),
    (completion(10, logprobs=False), r"choices\.0\.logprobs is missing, expected logprobs with "
                                     r"top_logprobs of 20 entries"),
    (completion(10, top=5), r"choices\.0\.logprobs: token 0 has 5 alternatives, expected 20"),
    (completion(9), r"usage\.prompt_tokens is 9, expected 10 \(the number of prompt tokens sent\)"),
    ({**completion(10), "usage": {**completion(10)["usage"], "prompt_tokens": "10"}},
     r"usage\.prompt_tokens: Input should be a valid integer"),
])
def test_a_malformed_response_names_host_and_what_is_wrong(
        rank0: StubServer, document: dict[str, Any], problem: str) -> None:
    rank0.serve(PATH, json_reply(document))
    with client_for(rank0) as client:
        with pytest.raises(InvalidResponse, match=r"^host 127\.0\.0\.21 rank 0: request 'A': "
                                                  r"malformed completions response: .*" + problem):
            client.complete("A", PROMPT, forbid_cached=CACHED)


def answering(document: dict[str, Any]) -> Callable[[Request], Reply]:
    """A server that answers `document` whole, or streamed where the request asks (one token's chunk,
    the usage's chunk, then [DONE], as vLLM streams)."""
    def respond(request: Request) -> Reply:
        if not request.json().get("stream"):
            return json_reply(document)
        chunks = ({**document, "usage": None}, {**document, "choices": []})
        body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
        return Reply(body=body, content_type="text/event-stream")
    return respond


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_prompt_length_the_server_miscounts_is_refused_alike_by_both_clients(rank0: StubServer,
                                                                               stream: bool) -> None:
    # the one-at-a-time client and the replay's client read a response in one place, with one strictness
    rank0.serve(PATH, answering(completion(len(PROMPT) + 1)))
    refusal = r"usage\.prompt_tokens is 11, expected 10 \(the number of prompt tokens sent\)"
    with client_for(rank0) as client:
        with pytest.raises(InvalidResponse, match=r"^host 127\.0\.0\.21 rank 0: request 'A': malformed "
                                                  r"completions response: " + refusal + "$"):
            client.complete("A", PROMPT)

    async def replayed() -> Exchange:
        async with httpx.AsyncClient(base_url=rank0.url) as pool:
            return await exchange(pool, RequestShape(stream=stream), PROMPT, 1, timeout_s=10.0)

    done = asyncio.run(replayed())
    assert (done.status, done.prompt_tokens) == (200, 0)
    assert re.fullmatch(refusal, done.error), done.error
    # the prompt counted right, both take the answer
    rank0.serve(PATH, answering(completion(len(PROMPT))))
    with client_for(rank0) as client:
        assert client.complete("A", PROMPT).prompt_tokens == len(PROMPT)
    assert asyncio.run(replayed()).prompt_tokens == len(PROMPT)


def test_a_body_that_is_not_json_is_malformed(rank0: StubServer) -> None:
    rank0.serve(PATH, Reply(body="<html>upstream error</html>", content_type="text/html"))
    with client_for(rank0) as client:
        with pytest.raises(InvalidResponse, match=r"Invalid JSON.*starts '<html>upstream error"):
            client.complete("A", PROMPT)


def test_cached_tokens_mean_prefix_reuse_and_an_invalid_trial(rank0: StubServer) -> None:
    rank0.serve(PATH, json_reply(completion(len(PROMPT), cached=8)))
    with client_for(rank0) as client:
        with pytest.raises(PrefixReuse, match=r"^host 127\.0\.0\.21 rank 0: request 'A, new start': "
                                              r"the server reports 8 of 10 prompt tokens as cached"
                                              r".*Prefix-cache reuse means the request did not "
                                              r"read its rows .* so the trial is invalid"):
            client.complete("A, new start", PROMPT, forbid_cached=CACHED)


def test_where_prefix_reuse_is_measured_cached_tokens_are_a_figure(rank0: StubServer) -> None:
    rank0.serve(PATH, json_reply(completion(len(PROMPT), cached=8)))
    with client_for(rank0) as client:
        result = client.complete("A, again", PROMPT, fields=(CACHED, "timings.prompt_ms"))
    assert result.fields[CACHED] == 8
    assert math.isnan(result.fields["timings.prompt_ms"])   # not given by this server: recorded as NaN
    with client_for(rank0) as client:
        with pytest.raises(InvalidResponse, match=r"timings\.prompt_ms is missing, and the suite reads it"):
            client.complete("A", PROMPT, fields=("timings.prompt_ms",), required=("timings.prompt_ms",))


def llama_server_completion(prompt_tokens: int, *, top: int = 20) -> dict[str, Any]:
    """A completion shaped as llama.cpp's server answers: chat-shaped logprobs, timings."""
    tops = [{"id": 100 + i, "token": f" t{i}", "bytes": [32, 116], "logprob": -0.5 - i} for i in range(top)]
    choice = {"text": " t0", "index": 0, "finish_reason": "length",
              "logprobs": {"content": [{"id": 100, "token": " t0", "bytes": [32], "logprob": -0.5,
                                        "top_logprobs": tops}]}}
    return {"choices": [choice], "object": "text_completion", "model": "tiny",
            "usage": {"completion_tokens": 1, "prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + 1,
                      "prompt_tokens_details": {"cached_tokens": 4}},
            "timings": {"cache_n": 4, "prompt_n": prompt_tokens - 4, "prompt_ms": 12.5}}


def test_chat_shaped_logprobs_and_response_timings_are_read(rank0: StubServer) -> None:
    rank0.serve(PATH, json_reply(llama_server_completion(len(PROMPT))))
    with client_for(rank0) as client:
        result = client.complete("A", PROMPT, fields=("timings.prompt_ms", "timings.cache_n"))
    assert result.fields == {"timings.prompt_ms": 12.5, "timings.cache_n": 4.0}
    rank0.serve(PATH, json_reply(llama_server_completion(len(PROMPT), top=3)))
    with client_for(rank0) as client:
        with pytest.raises(InvalidResponse, match=r"choices\.0\.logprobs: token 0 has 3 alternatives, "
                                                  r"expected 20 \(asked for logprobs=20\)"):
            client.complete("A", PROMPT)
        assert client.complete("A", PROMPT, logprobs=None).prompt_tokens == len(PROMPT)   # logprobs optional


def test_a_hung_rank_0_times_out_naming_host_and_timeout(rank0: StubServer) -> None:
    rank0.serve(PATH, json_reply(completion(10), delay_s=10))
    started = time.perf_counter()
    with client_for(rank0, timeout_s=0.3) as client:
        with pytest.raises(RequestTimeout, match=r"^host 127\.0\.0\.21 rank 0: request 'B': no "
                                                 r"complete answer .* within 0\.3 s.*rank 0 did "
                                                 r"not answer within the 0\.3 s request timeout"):
            client.complete("B", PROMPT)
    assert time.perf_counter() - started < 3


def test_connection_refused_is_a_clear_failure(rank0: StubServer) -> None:
    rank0.stop()
    with client_for(rank0) as client:
        with pytest.raises(RequestFailed, match=r"^host 127\.0\.0\.21 rank 0: request 'A': cannot "
                                                r"connect to http://127\.0\.0\.21:\d+/v1/completions"
                                                r" .*is the process running"):
            client.complete("A", PROMPT)


def test_an_http_error_status_is_a_failure_with_the_body(rank0: StubServer) -> None:
    rank0.serve(PATH, Reply(status=503, body="rank 2 left the group", content_type="text/plain"))
    with client_for(rank0) as client:
        with pytest.raises(RequestFailed, match=r"rank 0: request 'A': POST .* answered HTTP 503 "
                                                r"Service Unavailable, expected 200; the body "
                                                r"starts 'rank 2 left the group'"):
            client.complete("A", PROMPT)


# vLLM 0.x started with --skip-tokenizer-init, asked for logprobs; the emulated server on a long prompt
VLLM_NO_TOKENIZER = {"object": "error", "message": "Unable to get tokenizer because skip_tokenizer_init is True",
                     "type": "BadRequestError", "param": None, "code": 400}
SIM_TOO_LONG = {"error": {"message": "`max_tokens`: prompt (10 tokens) + max_tokens (200000) = 200010 exceeds the "
                          "server's limit of 163840 tokens", "type": "invalid_request_error"}}


@pytest.mark.parametrize(("body", "options", "named"), [
    (VLLM_NO_TOKENIZER, {}, r"refused the request's `logprobs: 20`: set `request: \{logprobs: null\}` in the "
                            r"scenario \(or the runtime profile's `request:`"),
    (SIM_TOO_LONG, {"max_tokens": 200_000}, r"refused the request's `max_tokens: 200000`: set `request: "
                                            r"\{max_tokens: 1\}` in the scenario"),
])
def test_a_4xx_naming_a_request_parameter_names_the_field_to_change(
        rank0: StubServer, body: dict[str, Any], options: dict[str, Any], named: str) -> None:
    rank0.serve(PATH, json_reply(body, status=400))
    with client_for(rank0) as client:
        with pytest.raises(RequestFailed, match=r"answered HTTP 400 Bad Request, expected 200; .*" + named):
            client.complete("A", PROMPT, **options)


def test_a_4xx_naming_no_parameter_the_request_sent_says_only_the_servers_words(rank0: StubServer) -> None:
    rank0.serve(PATH, json_reply({"error": "no such model"}, status=404))
    with client_for(rank0) as client:
        with pytest.raises(RequestFailed, match=r"HTTP 404 Not Found, expected 200; the body starts "
                                                r"'\{\"error\": \"no such model\"\}'$"):
            client.complete("A", PROMPT, logprobs=None)


@pytest.mark.parametrize(("tokens", "options", "message"), [
    ([], {}, r"`tokens` is empty"),
    (PROMPT, {"max_tokens": 0}, r"`max_tokens` must be at least 1, got 0"),
    (PROMPT, {"logprobs": 0}, r"`logprobs` must be None or at least 1, got 0"),
])
def test_bad_arguments_are_refused_before_sending(rank0: StubServer, tokens: list[int],
                                                  options: dict[str, Any], message: str) -> None:
    with client_for(rank0) as client:
        with pytest.raises(ValueError, match=message):
            client.complete("A", tokens, **options)
    assert rank0.requests == []
