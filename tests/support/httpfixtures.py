"""A tiny real HTTP server for tests: per-path replies, switchable while it runs.

A :class:`StubServer` is a ``ThreadingHTTPServer`` on a loopback address
(127.0.0.x, any port) speaking HTTP/1.1 with keep-alive, so clients under test
reuse connections as they would against a real server. Each path answers with a
:class:`Reply` or with a function of the :class:`Request` (for answers that
depend on what was posted). Every request is recorded.

The `stub_servers` fixture (tests/conftest.py) starts servers that are stopped
after the test.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TEXT = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@dataclass(frozen=True)
class Request:
    """What a client sent."""

    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes
    client: tuple[str, int]  # the client's address and port: one port per connection

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    """What a path answers: status, body, content type, and a delay before answering."""

    status: int = 200
    body: bytes | str = b""
    content_type: str = PROMETHEUS_TEXT
    delay_s: float = 0.0

    def payload(self) -> bytes:
        return self.body.encode() if isinstance(self.body, str) else self.body


def json_reply(document: Any, *, status: int = 200, delay_s: float = 0.0) -> Reply:
    """A JSON reply."""
    return Reply(status=status, body=json.dumps(document), content_type="application/json",
                 delay_s=delay_s)


Responder = Reply | Callable[[Request], Reply]


def together(reply: Reply, parties: int, timeout_s: float = 20.0) -> Callable[[Request], Reply]:
    """A responder (for one or several servers) that answers only once `parties` requests are
    waiting for it at the same time: the behaviour "they were sent at once", checked without a
    clock. A client that sends them one after the other gets, after `timeout_s`, a 500 saying so."""
    barrier = threading.Barrier(parties, timeout=timeout_s)

    def respond(request: Request) -> Reply:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return Reply(status=500, body=f"fewer than {parties} requests were waiting at once\n")
        return reply

    return respond


@dataclass
class _Routes:
    replies: dict[str, Responder] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms ACK stall
    server: _Server

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        request = Request(method=self.command, path=self.path.split("?", 1)[0],
                          headers={k.lower(): v for k, v in self.headers.items()}, body=self.rfile.read(length),
                          client=(self.client_address[0], self.client_address[1]))
        routes = self.server.routes
        with routes.lock:
            routes.requests.append(request)
            responder = routes.replies.get(request.path)
        if responder is None:
            reply = Reply(status=404, body=f"no route for {request.path}\n")
        else:
            reply = responder(request) if callable(responder) else responder
        if reply.delay_s and routes.stopping.wait(reply.delay_s):
            self.close_connection = True  # the server is stopping: drop the request unanswered
            return
        body = reply.payload()
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output quiet


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], routes: _Routes) -> None:
        self.routes = routes
        super().__init__(address, _Handler)


class StubServer:
    """A real HTTP server on `address` (port chosen by the OS), in a background thread."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self._routes = _Routes()
        self._server = _Server((address, 0), self._routes)
        self.host, self.port = address, self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name=f"stub-{address}:{self.port}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """Base URL, no trailing slash."""
        return f"http://{self.host}:{self.port}"

    def serve(self, path: str, responder: Responder) -> None:
        """Answer `path` with `responder` from now on (replacing any earlier one)."""
        with self._routes.lock:
            self._routes.replies[path] = responder

    @property
    def requests(self) -> list[Request]:
        """Every request received so far, oldest first."""
        with self._routes.lock:
            return list(self._routes.requests)

    def stop(self) -> None:
        """Stop serving (again: no-op); delayed replies still waiting are dropped."""
        if self._routes.stopping.is_set():
            return
        self._routes.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> StubServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
