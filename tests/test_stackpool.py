"""`trials.stackpool` against a real keep-alive HTTP server: connections are reused (the one freed
last first), one is opened per concurrent request, an expired one is replaced, a failure leaves none
behind, and closing the client closes them all. The server records each request's client port: one
port per connection."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from cache_qualify.lab.http import tls_context
from cache_qualify.trials.stackpool import StackTransport
from tests.support.httpfixtures import Reply, StubServer, together
from tests.support.simrank import free_port

HOST = "127.0.0.23"
OK = Reply(body=b"ok\n", content_type="text/plain")


def ports(server: StubServer) -> list[int]:
    return [request.client[1] for request in server.requests]


async def get_all(client: httpx.AsyncClient, count: int) -> None:
    for response in await asyncio.gather(*(client.get("/") for _ in range(count))):
        assert response.text == "ok\n"


def test_one_after_another_share_one_connection(stub_servers: Callable[..., StubServer]) -> None:
    server = stub_servers(HOST)
    server.serve("/", OK)
    transport = StackTransport(verify=tls_context())

    async def run() -> int:
        async with httpx.AsyncClient(base_url=server.url, transport=transport) as client:
            for _ in range(3):
                await get_all(client, 1)
            return len(transport.pool.connections)

    assert asyncio.run(run()) == 1
    assert len(set(ports(server))) == 1
    assert transport.pool.connections == []   # closed with the client


def test_concurrent_requests_get_a_connection_each_then_reuse_them(stub_servers: Callable[..., StubServer]) -> None:
    server = stub_servers(HOST)
    server.serve("/", together(OK, 4))   # answered only once all four wait: four connections at once
    transport = StackTransport(verify=tls_context())

    async def run() -> int:
        async with httpx.AsyncClient(base_url=server.url, transport=transport) as client:
            await get_all(client, 4)
            server.serve("/", OK)
            for _ in range(3):
                await get_all(client, 1)
            return len(transport.pool.connections)

    assert asyncio.run(run()) == 4
    first, then = ports(server)[:4], ports(server)[4:]
    assert len(set(first)) == 4
    assert len(set(then)) == 1 and then[0] in first   # the one freed last, again and again


def test_an_expired_connection_is_replaced(stub_servers: Callable[..., StubServer]) -> None:
    server = stub_servers(HOST)
    server.serve("/", OK)
    transport = StackTransport(verify=tls_context(), keepalive_expiry_s=0.0)   # idle, it has expired

    async def run() -> int:
        async with httpx.AsyncClient(base_url=server.url, transport=transport) as client:
            for _ in range(3):
                await get_all(client, 1)
            return len(transport.pool.connections)

    assert asyncio.run(run()) == 1   # the expired ones were closed, not kept
    assert len(set(ports(server))) == 3


def test_a_refused_connection_raises_httpx_error_and_keeps_nothing() -> None:
    transport = StackTransport(verify=tls_context())

    async def run() -> None:
        async with httpx.AsyncClient(base_url=f"http://{HOST}:{free_port(HOST)}", transport=transport) as client:
            with pytest.raises(httpx.ConnectError, match="refused|failed"):
                await client.get("/")
            assert transport.pool.connections == []

    asyncio.run(run())
