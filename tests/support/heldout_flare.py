"""A held-out row-cache runtime for the suite's tests: a server the simulated lab's code has no part in.

It stands in for a real flare lab's runtime (the RowCache study's, `runtime: flare`): its own code, written
from the rules the study's issue states for cache.rs, not from cache_qualify.sim, with its own hashes (row
IDs, set choice, usage counters) so its hit rates differ from the emulator's by what a real runtime's would:
placement and counter collisions, not rules. Its policy is compiled in: each build is an entry script
(tests/support/heldout_flare_<policy>.py) that passes its policy to `serve` (no flag, metric or log line
states it), so a lab declares it in the inventory.

Serves `/v1/completions` (token-ID prompts, `usage`), `/health` and Prometheus `/metrics` with the flare
profile's names; one rank (tensor parallelism 1). Standard library only, so the hosts need nothing else.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MASK = (1 << 64) - 1
VOCABULARY = 99_092                    # the model's compressed Engram vocabulary: token IDs fold onto it
ORDERS = (2, 3, 4)                     # n-gram orders of each Engram table, 8 heads each
HEADS = 8
HEAD_ROWS = 16_000_003                 # rows of each head's range (a prime)
TABLES = 2
ROW_BYTES, FIXED_BYTES = 280, 61_867_744   # the study's capacity: 280 bytes a slot after a fixed overhead
SKETCH_COUNTERS = 1 << 20              # 1 MiB of 8-bit usage counters per table
PREFILL_CHUNK = 1024                   # compiled in: the tests' inventories declare it
FIRST_REQUEST_LAUNCHES = 12            # the first request after a start runs as 12 equal prefill launches
WAIT_PER_MISS_NS = 6_400               # the study's readiness wait per extra miss
SHAPES = {"set4": (4, False), "two_choice": (4, True)}   # policy -> (ways, two candidate sets)


def _mix(x: int) -> int:
    """A 64-bit finaliser (murmur3's fmix64), unlike the emulator's splitmix."""
    x &= MASK
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK
    return x ^ (x >> 33)


def row_ids(tokens: list[int], table: int) -> list[int]:
    """Per position, 24 row IDs: each order's n-gram ending there (0 before the start), hashed by a
    polynomial of the table's own base, in 8 disjoint head ranges."""
    folded = [t % VOCABULARY for t in tokens]
    base = _mix(0x5EED + table) | 1
    out: list[int] = []
    for p in range(len(folded)):
        for order in ORDERS:
            h = 0
            for k in range(order):
                h = (h * base + (folded[p - k] if p >= k else 0) + 1) & MASK
            h = _mix(h)
            out.extend(head * HEAD_ROWS + h % HEAD_ROWS for head in range(HEADS))
    return out


@dataclass
class Table:
    """One table's row cache: sets of `ways`, a count-min usage estimate, the admission rule."""

    capacity: int
    ways: int
    two_sets: bool
    salt: int
    sets: list[list[list[int]]] = field(default_factory=list)    # per set: [row, last access] per way
    where: dict[int, list[int]] = field(default_factory=dict)    # row -> its way
    tick: int = 0                                                # lookups so far: the recency order
    increments: int = 0                                          # counter increments since the last halving
    sketch: bytearray = field(default_factory=lambda: bytearray(SKETCH_COUNTERS))
    hits: int = 0
    misses: int = 0
    inserts: int = 0
    evictions: int = 0

    def __post_init__(self) -> None:
        self.sets = [[] for _ in range(self.capacity // self.ways)]

    def _cells(self, row: int) -> list[int]:
        # cache.rs keeps a row's four counters in one 64-byte block, one in each quarter of it
        g = _mix(row ^ self.salt ^ 0xA5A5A5A5)
        start = (g & 0xFFFF_FFFF) * (SKETCH_COUNTERS // 64) >> 32 << 6
        return [start + 16 * i + ((g >> (32 + 8 * i)) & 15) for i in range(4)]

    def _estimate(self, row: int) -> int:
        return min(self.sketch[c] for c in self._cells(row))

    def _count(self, row: int) -> int:
        cells = self._cells(row)
        for c in cells:
            if self.sketch[c] < 255:
                self.sketch[c] += 1
        self.increments += 1
        if self.increments >= 10 * self.capacity:   # counters age: halved every ten capacities of lookups
            self.sketch = bytearray(c >> 1 for c in self.sketch)
            self.increments = 0
        return min(self.sketch[c] for c in cells)

    def _candidates(self, row: int) -> list[int]:
        h = _mix(row + self.salt)
        n = len(self.sets)
        first = h % n
        if not self.two_sets or n == 1:
            return [first]
        return [first, (first + 1 + (h >> 40) % (n - 1)) % n]

    def gather(self, rows: list[int]) -> None:
        """Each distinct row looked up once (its counters incremented, misses too), then the misses inserted."""
        pending: list[tuple[int, int, int]] = []
        for row in dict.fromkeys(rows):
            self.tick += 1
            estimate = self._count(row)
            way = self.where.get(row)
            if way is not None:
                self.hits += 1
                way[1] = self.tick
            else:
                self.misses += 1
                pending.append((row, estimate, self.tick))
        for row, estimate, tick in pending:
            self._insert(row, estimate, tick)

    def _insert(self, row: int, estimate: int, tick: int) -> None:
        candidates = [self.sets[i] for i in self._candidates(row)]
        roomiest = max(candidates, key=lambda s: self.ways - len(s))   # the first on a tie
        if len(roomiest) < self.ways:
            way = [row, tick]
            roomiest.append(way)
            self.where[row] = way
            self.inserts += 1
            return
        victim = min((w for s in candidates for w in s), key=lambda w: (self._estimate(w[0]), w[1]))
        if estimate < self._estimate(victim[0]):
            return                                   # refused: the incoming row is used less
        del self.where[victim[0]]
        victim[0], victim[1] = row, tick
        self.where[row] = victim
        self.evictions += 1


class Runtime:
    """The rank's tables and the counters /metrics shows."""

    def __init__(self, policy: str, cache_bytes: int, uncached_percent: float = 0.0) -> None:
        ways, two_sets = SHAPES[policy]
        self.uncached = uncached_percent / 100
        sets = max(0, cache_bytes - FIXED_BYTES) // ROW_BYTES // ways
        salt = random.getrandbits(64)             # each start draws its own placement
        self.tables = [Table((sets // TABLES + (1 if t < sets % TABLES else 0)) * ways, ways, two_sets,
                             _mix(salt + t)) for t in range(TABLES)]
        self.kv_pages = 12_000 + random.randrange(64)
        self.wait_ns = 0
        self.requests = 0
        self.lock = threading.Lock()

    def prefill(self, tokens: list[int]) -> None:
        n = len(tokens)
        if self.requests == 0:
            count = min(FIRST_REQUEST_LAUNCHES, n)
            bounds = [n * i // count for i in range(count + 1)]
        else:
            bounds = [*range(0, n, PREFILL_CHUNK), n]
        self.requests += 1
        per_table = [row_ids(tokens, t) for t in range(TABLES)]
        per_token = len(ORDERS) * HEADS
        for a, b in zip(bounds, bounds[1:]):
            for table, rows in zip(self.tables, per_table):
                before = table.misses
                chunk = rows[a * per_token:b * per_token]
                table.gather(chunk)
                # a lab-wide bias the emulator does not know: lookups of rows the cache never holds
                table.misses += round(self.uncached * len(set(chunk)))
                self.wait_ns += (table.misses - before) * WAIT_PER_MISS_NS

    def metrics(self) -> str:
        lines: list[str] = []
        def family(name: str, kind: str, values: list[tuple[str, int]]) -> None:
            lines.append(f"# TYPE {name.removesuffix('_total')} {kind}")
            lines.extend(f"{name}{labels} {value}" for labels, value in values)
        per = {"hits": "hits", "misses": "misses", "evictions": "evictions", "inserts": "inserts"}
        for metric, attr in per.items():
            family(f"flare_engram_row_cache_{metric}_total", "counter",
                   [(f'{{table="{t}"}}', getattr(tb, attr)) for t, tb in enumerate(self.tables)])
        family("flare_engram_row_cache_resident_rows", "gauge",
               [(f'{{table="{t}"}}', tb.inserts) for t, tb in enumerate(self.tables)])
        family("flare_engram_row_cache_capacity_rows", "gauge",
               [(f'{{table="{t}"}}', tb.capacity) for t, tb in enumerate(self.tables)])
        family("flare_replay_readiness_wait_nanoseconds_total", "counter", [("", self.wait_ns)])
        family("flare_kv_cache_pages", "gauge", [("", self.kv_pages)])
        return "\n".join(lines) + "\n"


def _completion(runtime: Runtime, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) and t >= 0 for t in prompt):
        return 400, {"error": {"message": "`prompt`: a non-empty list of token IDs is expected"}}
    max_tokens = body.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        return 400, {"error": {"message": "`max_tokens`: an integer >= 1 is expected"}}
    with runtime.lock:
        runtime.prefill(prompt)
    generated = [(sum(prompt) * 31 + i) % 100_000 + 3 for i in range(max_tokens)]
    top = body.get("logprobs")
    logprobs = None if top is None else {
        "tokens": [f" <{t}>" for t in generated], "token_logprobs": [-0.5] * max_tokens,
        "top_logprobs": [{f" <{t + k}>": -0.5 - k for k in range(int(top))} for t in generated],
        "text_offset": [0] * max_tokens}
    return 200, {"id": f"cmpl-{time.monotonic_ns()}", "object": "text_completion", "created": int(time.time()),
                 "model": "heldout-flare",
                 "choices": [{"index": 0, "text": "".join(f" <{t}>" for t in generated), "logprobs": logprobs,
                              "finish_reason": "length", "stop_reason": None}],
                 "usage": {"prompt_tokens": len(prompt), "completion_tokens": max_tokens,
                           "total_tokens": len(prompt) + max_tokens, "prompt_tokens_details": {"cached_tokens": 0}}}


def _handler(runtime: Runtime) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, b"{}", "application/json")
            elif self.path == "/metrics":
                self._send(200, runtime.metrics().encode(), "text/plain; version=0.0.4")
            else:
                self._send(404, b'{"error": "not found"}', "application/json")

        def do_POST(self) -> None:
            if self.path != "/v1/completions":
                self._send(404, b'{"error": "not found"}', "application/json")
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            except ValueError:
                self._send(400, b'{"error": {"message": "the body is not JSON"}}', "application/json")
                return
            status, reply = _completion(runtime, body if isinstance(body, dict) else {})
            self._send(status, json.dumps(reply).encode(), "application/json")

        def log_message(self, format: str, *args: Any) -> None:   # noqa: A002 - the base class's name
            pass

    return Handler


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1:].upper() in units else int(text)


def serve(policy: str) -> None:
    """Run the server of a build whose row cache runs `policy` (the build's entry script passes it)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--embedding-table-cache-size", type=_size, default=_size("1G"))
    parser.add_argument("--tensor-parallel-size", type=int, default=1, choices=[1])
    parser.add_argument("--uncached-lookups-percent", type=float, default=0.0,
                        help="a lab's side table: this share of each chunk's distinct rows more looked up, "
                             "always missing (the emulator is not told: its prediction sits off by it)")
    args, _unknown = parser.parse_known_args()   # the study's other serving flags change nothing here
    runtime = Runtime(policy, args.embedding_table_cache_size, args.uncached_lookups_percent)
    server = ThreadingHTTPServer((args.host, args.port), _handler(runtime))
    print(f"heldout-flare listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()
