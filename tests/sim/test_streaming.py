"""The simulated rank streams as vLLM does: server-sent events over chunked HTTP/1.1, a chunk per
token, the usage in a last chunk of no choices when `stream_options.include_usage` asks, then
``data: [DONE]``; the chunks say what the non-streaming body says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.simrank import SimRank, sim_rank

PROMPT = list(range(300, 340))


@pytest.fixture(scope="module")
def rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimRank]:
    with sim_rank(tmp_path_factory.mktemp("stream")) as started:
        yield started


def streamed(client: httpx.Client, url: str, **body: Any) -> tuple[httpx.Response, list[str]]:
    """The response and its data lines' payloads, in order."""
    with client.stream("POST", url + "/v1/completions", json={"prompt": PROMPT, "stream": True, **body}) as reply:
        lines = [line[len("data: "):] for line in reply.iter_lines() if line.startswith("data: ")]
    return reply, lines


def test_a_stream_is_a_chunk_per_token_then_the_usage_then_done(rank: SimRank) -> None:
    with httpx.Client(timeout=30) as client:
        plain = client.post(rank.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 5,
                                                                "logprobs": 2}).json()
        reply, lines = streamed(client, rank.url, max_tokens=5, logprobs=2,
                                stream_options={"include_usage": True})
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert reply.headers["transfer-encoding"] == "chunked"
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    tokens, usage = chunks[:-1], chunks[-1]
    assert len(tokens) == 5
    for i, chunk in enumerate(tokens):
        assert set(chunk) == {"id", "object", "created", "model", "choices", "usage"}
        assert chunk["object"] == "text_completion" and chunk["usage"] is None
        (choice,) = chunk["choices"]
        assert choice["finish_reason"] == ("length" if i == 4 else None) and choice["stop_reason"] is None
    whole = plain["choices"][0]
    assert "".join(c["choices"][0]["text"] for c in tokens) == whole["text"]
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [v for c in tokens for v in c["choices"][0]["logprobs"][key]] == whole["logprobs"][key]
    assert usage["choices"] == [] and usage["usage"] == plain["usage"]
    assert usage["id"] == tokens[0]["id"] != plain["id"]


def test_without_include_usage_no_chunk_carries_usage(rank: SimRank) -> None:
    with httpx.Client(timeout=30) as client:
        _, lines = streamed(client, rank.url, max_tokens=3)
        # chunked framing ends cleanly: the same connection serves the next request
        _, again = streamed(client, rank.url, max_tokens=2, stream_options={"include_usage": False})
    assert lines[-1] == "[DONE]" and again[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert len(chunks) == 3 and all(c["usage"] is None and len(c["choices"]) == 1 for c in chunks)
    assert len(again) == 3


def test_stream_options_without_stream_is_refused_naming_the_field(rank: SimRank) -> None:
    reply = httpx.post(rank.url + "/v1/completions", json={"prompt": PROMPT, "stream_options": {"include_usage": True}},
                       timeout=30)
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == ("`stream_options`: stream options can only be defined when "
                                                "`stream` is true")


def test_a_refused_streamed_request_is_a_plain_400(rank: SimRank) -> None:
    reply = httpx.post(rank.url + "/v1/completions", json={"prompt": PROMPT, "stream": True, "max_tokens": 10**7},
                       timeout=30)
    assert reply.status_code == 400 and reply.headers["content-type"] == "application/json"
    assert "exceeds the server's limit" in reply.json()["error"]["message"]
