"""The emulated server as real processes: one per rank on 127.0.0.11, .12, .13.

Every group of ranks is stopped (SIGTERM, then SIGKILL) in a finally, and each
test that ends a group checks that none of its processes is left.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cache_qualify.workload.corpus import default_corpus
from cache_qualify.sim.server import parse_args
from cache_qualify.workload.requests import Request, study_sequence
from tests.support.waiting import wait_for

HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
LOWERED_RESERVE = ["--host-system-share", "40"]
READY_TIMEOUT_S = 60.0
Key = tuple[str, str]   # (sample name, table label or "")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Group:
    """A tensor-parallel group of emulated ranks, each logging to its own file."""

    def __init__(self, tmp: Path, *, tp: int = 3, flags: Sequence[str] = (), seed: int | None = 7) -> None:
        self.hosts = HOSTS[:tp]
        self.ports = [_free_port(h) for h in self.hosts]
        self.logs = [tmp / f"rank{r}.log" for r in range(tp)]
        rank0 = f"{self.hosts[0]}:{self.ports[0]}"
        self.procs: list[subprocess.Popen[bytes]] = []
        for r, (host, port) in enumerate(zip(self.hosts, self.ports)):
            argv = [sys.executable, "-m", "cache_qualify.sim.server", "--rank", str(r),
                    "--tensor-parallel-size", str(tp), "--rank0-address", rank0, "--host", host,
                    "--port", str(port), *flags]
            if seed is not None:
                argv += ["--sim-seed", str(seed)]
            with self.logs[r].open("wb") as log:
                self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        self.client = httpx.Client(timeout=60.0)

    def url(self, rank: int, path: str) -> str:
        return f"http://{self.hosts[rank]}:{self.ports[rank]}{path}"

    def log(self, rank: int) -> str:
        return self.logs[rank].read_text()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        """Seconds until rank 0's /health says 200; fails with the logs if a rank exits first."""
        def ready() -> bool:
            for r, proc in enumerate(self.procs):
                assert proc.poll() is None, (f"rank {r} exited with {proc.returncode} before the group was ready:\n"
                                             + self.log(r))
            return self.client.get(self.url(0, "/health")).status_code == 200

        started = time.monotonic()
        wait_for(ready, timeout, "the group ready (rank 0's /health 200)", ignoring=(httpx.TransportError,),
                 detail=lambda: "\n".join(self.log(r) for r in range(len(self.procs))))
        return time.monotonic() - started

    def wait_exit(self, rank: int, timeout: float = 20.0) -> int:
        return self.procs[rank].wait(timeout)

    def complete(self, tokens: np.ndarray | list[int], **extra: Any) -> httpx.Response:
        body = {"prompt": [int(t) for t in tokens], "max_tokens": 1, "logprobs": 20, **extra}
        return self.client.post(self.url(0, "/v1/completions"), json=body)

    def scrape(self, rank: int) -> dict[Key, float]:
        reply = self.client.get(self.url(rank, "/metrics"))
        assert reply.status_code == 200, reply.text
        return parse_metrics(reply.text)

    def stop(self) -> list[int]:
        """SIGTERM every rank, SIGKILL what is left after 5 s; the exit statuses."""
        self.client.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        statuses = []
        for proc in self.procs:
            try:
                statuses.append(proc.wait(5))
            except subprocess.TimeoutExpired:
                proc.kill()
                statuses.append(proc.wait(5))
        assert all(proc.poll() is not None for proc in self.procs)
        return statuses


def parse_metrics(text: str) -> dict[Key, float]:
    """Samples by (name, table) through prometheus_client's parser."""
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, sample.labels.get("table", ""))] = sample.value
    return out


def delta(after: dict[Key, float], before: dict[Key, float], name: str, table: str = "") -> float:
    return after[(name, table)] - before.get((name, table), 0.0)


def total(snapshot: dict[Key, float], name: str) -> float:
    return sum(v for (n, _), v in snapshot.items() if n == name)


@pytest.fixture(scope="module", autouse=True)
def kernels_loaded() -> None:
    """Compile the jitted kernel once (on a fresh install) before ranks start side by side."""
    subprocess.run([sys.executable, "-m", "cache_qualify.sim.server", "--sim-warm-only"], check=True, timeout=300)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Any]:
    """A factory of groups, every one stopped at the end of the test."""
    made: list[Group] = []

    def make(**kw: Any) -> Group:
        folder = tmp_path / f"group{len(made)}"
        folder.mkdir()
        made.append(Group(folder, **kw))
        return made[-1]

    yield make
    for g in made:
        g.stop()


@pytest.fixture(scope="module")
def report_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    """The RowCache study's servers: three ranks, 1 GiB cache, the lowered reserve."""
    g = Group(tmp_path_factory.mktemp("report"), flags=["--embedding-table-cache-size", "1G",
                                                         *LOWERED_RESERVE])
    try:
        startup_s = g.wait_ready()
        print(f"\nthree ranks ready after {startup_s:.2f} s")
        yield g
    finally:
        g.stop()


@pytest.fixture(scope="module")
def sequence() -> list[Request]:
    return study_sequence(default_corpus())


READINESS = "flare_replay_readiness_wait_nanoseconds_total"
HITS, MISSES = "flare_engram_row_cache_hits_total", "flare_engram_row_cache_misses_total"
INSERTS, EVICTIONS = "flare_engram_row_cache_inserts_total", "flare_engram_row_cache_evictions_total"
REFUSED = "flare_engram_row_cache_refused_inserts_total"
CAPACITY, RESIDENT = "flare_engram_row_cache_capacity_rows", "flare_engram_row_cache_resident_rows"


# -- the RowCache study's sequence -------------------------------------------------------------------------

@pytest.mark.slow
def test_three_ranks_answer_the_five_requests_and_every_rank_counts(
        report_group: Group, sequence: list[Request]) -> None:
    g = report_group
    before = [g.scrape(r) for r in range(3)]
    hit_rates: dict[str, float] = {}
    for request in sequence:
        rank0_before = g.scrape(0)
        started = time.perf_counter()
        reply = g.complete(request.tokens)
        elapsed = time.perf_counter() - started
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["usage"]["prompt_tokens"] == request.tokens.size
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert [len(top) for top in body["choices"][0]["logprobs"]["top_logprobs"]] == [20]
        rank0_after = g.scrape(0)
        hits = sum(delta(rank0_after, rank0_before, HITS, t) for t in "01")
        misses = sum(delta(rank0_after, rank0_before, MISSES, t) for t in "01")
        hit_rates[request.name] = hits / (hits + misses)
        print(f"{request.name}: {request.tokens.size} tokens in {elapsed:.3f} s, "
              f"rank 0 hit rate {hit_rates[request.name]:.2%}")
    after = [g.scrape(r) for r in range(3)]

    for r in range(3):
        for table in "01":
            for name in (HITS, MISSES, INSERTS, EVICTIONS):
                assert delta(after[r], before[r], name, table) > 0, (r, name, table)
        assert total(after[r], CAPACITY) == 3_613_836
        assert total(after[r], RESIDENT) == total(after[r], INSERTS)
        assert not any(name == REFUSED for name, _ in after[r])
    # rank 0 exports the exposed wait: per gather the slowest rank's, so at least any one rank's own
    waits = [delta(after[r], before[r], READINESS) for r in range(3)]
    assert max(waits[1:]) <= waits[0] <= sum(waits)
    # the RowCache study's regime: first reads mostly miss, the re-read of A mostly hits
    assert hit_rates["A"] < 0.3 and hit_rates["B"] < 0.4
    assert hit_rates["A-new-start"] > 0.95
    assert 0.7 < hit_rates["B-new-start"] < 0.97


@pytest.mark.slow
def test_a_second_start_of_a_seed_reads_its_replays_back_and_exports_the_same_counters(
        group: Any, sequence: list[Request], tmp_path: Path) -> None:
    """The replay memo (cache_qualify.sim.memo) end to end: same seed, same requests, same counters
    on every rank, the second time without replaying."""
    flags = ["--embedding-table-cache-size", "1G", *LOWERED_RESERVE, "--sim-replay-memo", str(tmp_path / "memo")]
    counted = (HITS, MISSES, INSERTS, EVICTIONS, RESIDENT)
    exported = []
    for attempt in range(2):
        g = group(flags=flags)
        g.wait_ready()
        for request in sequence[:2]:
            assert g.complete(request.tokens).status_code == 200
        exported.append([{k: v for k, v in g.scrape(r).items() if k[0] in counted} for r in range(3)])
        g.stop()
        for r in range(3):
            assert f"replay memo {tmp_path / 'memo'}" in g.log(r)
            assert f"replay memo: {2 * attempt} request result(s) read back, {2 - 2 * attempt} written" in g.log(r)
    assert exported[0] == exported[1] and all(exported[0][r] for r in range(3))


def test_every_rank_logs_and_exports_its_kv_pages_and_seed(report_group: Group) -> None:
    for r in range(3):
        log = report_group.log(r)
        match = re.search(r"kv_cache: (\d+) pages of 128 tokens", log)
        assert match, log
        pages = int(match.group(1))
        assert 41_000 < pages < 41_700                    # the RowCache study: 41,358 and 41,301
        metrics = report_group.scrape(r)
        assert metrics[("flare_kv_cache_pages", "")] == pages
        assert metrics[("flare_engram_row_cache_seed", "")] == 7
        assert "set-hash seed 7" in log


def test_bad_requests_get_400_with_the_field_named(report_group: Group) -> None:
    g = report_group
    cases: list[tuple[dict[str, Any], str]] = [
        ({"prompt": [5, 6], "stream_options": {"include_usage": True}},
         "`stream_options`: stream options can only be defined when `stream` is true"),
        ({"prompt": "hello"}, "`prompt`: .*token-ID prompts only"),
        ({"prompt": [5, 200_000]}, r"`prompt.1`: token IDs must lie in 0..129279, found 200000"),
        ({"prompt": [5], "max_tokens": 0}, "`max_tokens`: Input should be greater than or equal to 1"),
        ({"prompt": [5], "logprobs": 21}, "`logprobs`: Input should be less than or equal to 20"),
        ({"prompt": []}, "`prompt`: List should have at least 1 item"),
    ]
    for body, message in cases:
        reply = g.client.post(g.url(0, "/v1/completions"), json=body)
        assert reply.status_code == 400, body
        assert re.search(message, reply.json()["error"]["message"]), reply.text
    assert g.client.post(g.url(0, "/v1/completions"), content=b"{not json").status_code == 400
    reply = g.client.post(g.url(1, "/v1/completions"), json={"prompt": [5]})
    assert reply.status_code == 404 and "send them to rank 0" in reply.json()["error"]["message"]
    assert g.client.get(g.url(0, "/nowhere")).status_code == 404


@pytest.mark.slow
def test_no_prefix_cache_without_prefix_cache_memory(report_group: Group) -> None:
    """The RowCache study ran with --prefix-cache-memory 0: even an exact repeat reads its rows again."""
    prompt = np.arange(2000, 2300)
    report_group.complete(prompt)
    assert report_group.complete(prompt).json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


@pytest.mark.slow
def test_decode_tokens_logprobs_and_a_real_prefix_cache(group: Any) -> None:
    g = group(flags=["--embedding-table-cache-size", "1G", "--prefix-cache-memory", "1G", *LOWERED_RESERVE])
    g.wait_ready()
    prompt = np.arange(1000, 1300)
    reply = g.complete(prompt, max_tokens=3, logprobs=5).json()
    assert reply["usage"]["completion_tokens"] == 3
    assert [len(top) for top in reply["choices"][0]["logprobs"]["top_logprobs"]] == [5, 5, 5]
    # an exact repeat reuses its whole pages (not the last token); a new start reuses nothing
    assert g.complete(prompt).json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 256
    changed = prompt.copy()
    changed[:16] = 7
    assert g.complete(changed).json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


# -- capacity and memory ---------------------------------------------------------------------------

@pytest.mark.slow
def test_4g_reads_its_capacity_on_every_rank_and_exports_refused_inserts(group: Any) -> None:
    g = group(flags=["--embedding-table-cache-size", "4G", *LOWERED_RESERVE, "--sim-export-refused"])
    g.wait_ready()
    for r in range(3):
        metrics = g.scrape(r)
        assert total(metrics, CAPACITY) == 15_118_212
        assert metrics[(REFUSED, "0")] == 0 and metrics[(REFUSED, "1")] == 0
        assert 10_000 < metrics[("flare_kv_cache_pages", "")] < 20_000
    assert set(g.stop()) == {0}
    assert all("stopping (signal)" in g.log(r) for r in range(3))


@pytest.mark.slow
def test_4g_under_the_default_reserve_fails_on_every_rank_with_its_error(group: Any) -> None:
    g = group(flags=["--embedding-table-cache-size", "4G", "--host-system-share", "20"])
    for r in range(3):
        assert g.wait_exit(r) == 1
        log = g.log(r)
        assert f"rank {r}: error: not enough memory for the KV cache" in log
        assert "4.0 GiB row cache (--embedding-table-cache-size 4G)" in log
        assert "--host-system-share 40" in log
        assert "kv_cache:" not in log


def test_refused_inserts_are_misses_minus_inserts_minus_evictions(group: Any,
                                                                  sequence: list[Request]) -> None:
    g = group(tp=1, flags=["--embedding-table-cache-size", "64M", "--sim-export-refused"])
    g.wait_ready()
    g.complete(sequence[0].tokens)
    m = g.scrape(0)
    for t in "01":
        assert m[(REFUSED, t)] > 0
        assert m[(REFUSED, t)] == m[(MISSES, t)] - m[(INSERTS, t)] - m[(EVICTIONS, t)]


# -- faults ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_exit_at_start_ends_that_rank_and_rank_0_never_gets_ready(group: Any) -> None:
    g = group(flags=["--sim-fault", "exit-at-start", "--sim-fault-rank", "2"])
    assert g.wait_exit(2) == 1
    assert "rank 2: error: simulated startup failure (--sim-fault exit-at-start)" in g.log(2)
    wait_for(lambda: "joined rank 0" in g.log(1), 60, "rank 1 joined rank 0", detail=lambda: g.log(1))
    reply = g.client.get(g.url(0, "/health"))
    assert reply.status_code == 503 and reply.json()["waiting_for"] == [2]
    assert g.client.get(g.url(1, "/health")).status_code == 200
    assert g.complete([5, 6, 7]).status_code == 503


def test_crash_on_request_loses_the_rank_and_rank_0_stops(group: Any) -> None:
    g = group(tp=2, flags=["--sim-fault", "crash-on-request:2", "--sim-fault-rank", "1"])
    g.wait_ready()
    assert g.complete(np.arange(10, 500)).status_code == 200
    reply = g.complete(np.arange(10, 600))
    assert reply.status_code == 502
    assert re.search(r"rank 1 at 127\.0\.0\.12:\d+ was lost during request 2", reply.json()["error"]["message"])
    assert g.wait_exit(1) == 1 and "simulated crash on request 2" in g.log(1)
    assert g.wait_exit(0) == 1 and "the server stops" in g.log(0)


def test_hang_on_request_never_answers_but_keeps_serving_metrics(group: Any) -> None:
    g = group(tp=2, flags=["--sim-fault", "hang-on-request:1", "--sim-fault-rank", "1"])
    g.wait_ready()
    with pytest.raises(httpx.ReadTimeout, match="timed out"):
        g.client.post(g.url(0, "/v1/completions"), json={"prompt": [5, 6, 7]}, timeout=1.0)
    assert "simulated hang on request 1" in g.log(1)
    assert g.client.get(g.url(1, "/metrics")).status_code == 200
    assert g.client.get(g.url(0, "/health")).status_code == 200
    assert all(proc.poll() is None for proc in g.procs)
    assert set(g.stop()) == {0}   # SIGTERM ends both, the hung request notwithstanding


def test_metrics_missing_drops_the_readiness_wait_on_that_rank_only(group: Any) -> None:
    g = group(tp=2, flags=["--sim-fault", "metrics-missing", "--sim-fault-rank", "1"])
    g.wait_ready()
    assert (READINESS, "") in g.scrape(0)
    assert (READINESS, "") not in g.scrape(1)
    assert (HITS, "0") in g.scrape(1)


def test_metrics_500_from_the_first_scrape(group: Any) -> None:
    g = group(tp=1, flags=["--sim-fault", "metrics-500"])
    g.wait_ready()
    assert g.client.get(g.url(0, "/metrics")).status_code == 500


def test_metrics_garbage_from_the_second_scrape_does_not_parse(group: Any) -> None:
    g = group(tp=1, flags=["--sim-fault", "metrics-garbage:2"])
    g.wait_ready()
    assert (HITS, "0") in g.scrape(0)
    reply = g.client.get(g.url(0, "/metrics"))
    assert reply.status_code == 200
    with pytest.raises(ValueError, match="could not convert string to float"):
        parse_metrics(reply.text)


def test_prefix_reuse_reports_cached_tokens_that_skip_the_cache(group: Any, sequence: list[Request]) -> None:
    g = group(tp=2, flags=["--sim-fault", "prefix-reuse"])
    g.wait_ready()
    a, a_new = sequence[0].tokens, sequence[1].tokens
    first = g.scrape(1)
    assert g.complete(a).json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    second = g.scrape(1)
    usage = g.complete(a_new).json()["usage"]
    third = g.scrape(1)
    # every page but the first (its 16 tokens changed) is reused: 155 pages of 128 tokens
    assert usage["prompt_tokens_details"]["cached_tokens"] == 155 * 128
    lookups = [sum(delta(y, x, n, "0") for n in (HITS, MISSES)) for x, y in ((first, second), (second, third))]
    assert lookups[1] < 0.02 * lookups[0]


def test_sleep_scale_makes_a_request_take_its_modelled_time(group: Any) -> None:
    # 1,000 tokens at 2 ms each is 2 s of modelled compute; a quarter of it is slept (and none of
    # the weights' loading, which would sleep a quarter of two minutes before the rank listens)
    g = group(tp=1, flags=["--sim-compute-ns-per-token", "2000000", "--sim-sleep-scale", "0.25",
                           "--sim-miss-cost-ns", "0", "--sim-load-s", "0"])
    g.wait_ready()
    started = time.perf_counter()
    assert g.complete(np.arange(100, 1100)).status_code == 200
    assert 0.5 <= time.perf_counter() - started < 5.0


# -- startup and flags -----------------------------------------------------------------------------

def test_a_rank_gives_up_when_rank_0_never_answers(group: Any) -> None:
    # rank 0 exits at start, so nothing listens at its address
    g = group(tp=2, flags=["--sim-join-timeout", "1", "--sim-fault", "exit-at-start"])
    assert g.wait_exit(0) == 1
    assert g.wait_exit(1) == 1
    assert re.search(r"rank 1: error: could not join rank 0 at 127\.0\.0\.11:\d+ within 1 s "
                     r"\(--rank0-address; last attempt: ConnectionRefusedError", g.log(1))


def test_bad_flags_exit_2_with_the_reason() -> None:
    proc = subprocess.run([sys.executable, "-m", "cache_qualify.sim.server", "--rank", "0", "--port", "0",
                           "--sim-fault", "bogus"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown fault 'bogus'; expected one of exit-at-start, crash-on-request:N" in proc.stderr


@pytest.mark.parametrize(("argv", "message"), [
    (["--rank", "3", "--tensor-parallel-size", "3", "--port", "1", "--rank0-address", "h:1"],
     "--rank 3 must be below --tensor-parallel-size 3"),
    (["--rank", "1", "--tensor-parallel-size", "2", "--port", "1"], "--rank0-address is required for rank 1"),
    (["--rank", "0", "--port", "1", "--embedding-table-cache-size", "1X"], "size must be a number"),
    (["--rank", "0", "--port", "1", "--sim-fault", "crash-on-request"], "needs a request number"),
    (["--rank", "0", "--port", "1", "--sim-policy", "set5"], "invalid choice: 'set5'"),
    (["--rank", "0", "--port", "1", "--rank0-address", "nohost"], "address must be HOST:PORT"),
    (["--rank", "0", "--port", "0", "--tensor-parallel-size", "2"], "rank 0 needs a fixed --port"),
])
def test_flag_errors_name_the_flag(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match=r"^2$") as exc:   # argparse's usage error
        parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
