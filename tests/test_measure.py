"""Tests of cache_qualify.trials.measure against real HTTP servers on loopback addresses.

Bodies come from prometheus_client's own exposition (``generate_latest`` of a
registry filled here, in Prometheus text and OpenMetrics), plus hand-written
variants that real exporters emit.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import prometheus_client
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from cache_qualify.errors import CounterReset, MeasureError, MetricMissing, MetricsUnreadable
from cache_qualify.lab.server import MetricsEndpoint
from cache_qualify.config.profiles import resolve
from cache_qualify.trials.figures import Figures, combine, delta
from cache_qualify.trials.measure import MetricScraper, Snapshot, parse_metrics, read_gauge
from tests.support.httpfixtures import OPENMETRICS_TEXT, Reply, StubServer, together

MODEL = resolve("flare")


def _sample(quantity: str) -> str:
    spec = MODEL.quantities[quantity].spec
    name = spec.counter or spec.gauge
    assert name is not None
    return name


class NAMES:
    """The flare profile's sample names, as a flare server exports them."""

    hits, misses, evictions, inserts = (_sample(q) for q in ("hits", "misses", "evictions", "inserts"))
    refused_inserts, resident_rows, capacity_rows = (_sample(q) for q in ("refused_exported", "resident_rows",
                                                                          "capacity_rows"))
    readiness_wait_ns, kv_pages = _sample("readiness_wait_ns"), _sample("kv_pages")
HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")


@dataclass(frozen=True)
class TableState:
    """One table's counters and gauges as a server would export them."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    inserts: int = 0
    refused: int = 0
    resident: int = 0
    capacity: int = 1_806_918


@dataclass(frozen=True)
class HostState:
    tables: Mapping[str, TableState] = field(
        default_factory=lambda: {"0": TableState(), "1": TableState()})
    readiness_ns: int = 0
    kv_pages: int = 12_528
    export_refused: bool = False
    omit: frozenset[str] = frozenset()  # sample names left out


def _family(sample_name: str) -> str:
    return sample_name.removesuffix("_total")


def registry_for(state: HostState) -> CollectorRegistry:
    """A registry as a flare server would fill it, with the usual process collectors."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    per_table = {NAMES.hits: "hits", NAMES.misses: "misses", NAMES.evictions: "evictions",
                 NAMES.inserts: "inserts", NAMES.resident_rows: "resident",
                 NAMES.capacity_rows: "capacity"}
    if state.export_refused:
        per_table[NAMES.refused_inserts] = "refused"
    for name, attribute in per_table.items():
        if name in state.omit:
            continue
        if name.endswith("_total"):
            counter = Counter(_family(name), f"row cache {attribute}", ["table"], registry=registry)
            for table, values in state.tables.items():
                counter.labels(table).inc(getattr(values, attribute))
        else:
            gauge = Gauge(name, f"row cache {attribute}", ["table"], registry=registry)
            for table, values in state.tables.items():
                gauge.labels(table).set(getattr(values, attribute))
    if NAMES.readiness_wait_ns not in state.omit:
        Counter(_family(NAMES.readiness_wait_ns), "exposed readiness wait",
                registry=registry).inc(state.readiness_ns)
    Gauge(NAMES.kv_pages, "KV cache pages", registry=registry).set(state.kv_pages)
    return registry


def prometheus_reply(state: HostState) -> Reply:
    return Reply(body=generate_latest(registry_for(state)))


def openmetrics_reply(state: HostState) -> Reply:
    body = generate_openmetrics(registry_for(state))  # type: ignore[no-untyped-call]
    return Reply(body=body, content_type=OPENMETRICS_TEXT)


BEFORE = HostState(tables={
    "0": TableState(hits=500, misses=1_000, evictions=0, inserts=1_000, resident=1_000),
    "1": TableState(hits=400, misses=900, evictions=0, inserts=900, resident=900)},
    readiness_ns=7_000_000)
# table 0: 100 misses = 60 rows added + 25 evictions + 15 refused; table 1: 50 = 50 + 0 + 0
AFTER = HostState(tables={
    "0": TableState(hits=800, misses=1_100, evictions=25, inserts=1_060, resident=1_060),
    "1": TableState(hits=550, misses=950, evictions=0, inserts=950, resident=950)},
    readiness_ns=7_640_000)


def snapshot_of(state: HostState, *, host: str = HOSTS[0], rank: int = 0,
                reply: Callable[[HostState], Reply] = prometheus_reply) -> Snapshot:
    """A snapshot parsed from the body a server would serve for `state`."""
    served = reply(state)
    values = parse_metrics(served.payload().decode(), content_type=served.content_type,
                           host=host, rank=rank)
    return Snapshot(host=host, rank=rank, taken_at=time.time(), values=values)


@pytest.fixture
def three_hosts(stub_servers: Callable[[str], StubServer]) -> list[StubServer]:
    servers = [stub_servers(address) for address in HOSTS]
    for server in servers:
        server.serve("/metrics", prometheus_reply(BEFORE))
    return servers


def endpoints_of(servers: list[StubServer]) -> list[MetricsEndpoint]:
    return [MetricsEndpoint(host=s.host, rank=rank, url=f"{s.url}/metrics")
            for rank, s in enumerate(servers)]


@pytest.fixture
def created_samples() -> Iterator[None]:
    """prometheus_client's `_created` samples on for one test (the switch is process-wide)."""
    was_on = prometheus_client.metrics._use_created
    prometheus_client.enable_created_metrics()  # type: ignore[no-untyped-call]
    yield
    if not was_on:
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


# --- parsing ---------------------------------------------------------------


@pytest.mark.usefixtures("created_samples")
def test_parses_prometheus_text_from_generate_latest() -> None:
    snapshot = snapshot_of(BEFORE)
    assert snapshot.get(NAMES.hits, "0") == 500
    assert snapshot.get(NAMES.misses, "1") == 900
    assert snapshot.get(NAMES.resident_rows, "1") == 900
    assert snapshot.get(NAMES.readiness_wait_ns) == 7_000_000
    assert snapshot.get(NAMES.kv_pages) == 12_528
    assert snapshot.get(NAMES.hits) is None  # every hits sample carries a table label
    assert snapshot.total(NAMES.hits) == 900
    assert snapshot.tables(NAMES.capacity_rows) == {"0": 1_806_918, "1": 1_806_918}
    # counters come with their _created samples, kept under their own name
    created = snapshot.get("flare_engram_row_cache_hits_created", "0")
    assert created is not None and created > 1.6e9


def test_openmetrics_gives_the_same_values_by_content_type_or_by_eof() -> None:
    plain = snapshot_of(AFTER).values
    by_type = snapshot_of(AFTER, reply=openmetrics_reply).values
    body = openmetrics_reply(AFTER).payload().decode()
    assert body.rstrip().endswith("# EOF")
    by_eof = parse_metrics(body, content_type="text/plain", host="h")
    for name in MODEL.required_metrics():
        for table in ("0", "1") if name != NAMES.readiness_wait_ns else ("",):
            assert by_type[(name, table)] == by_eof[(name, table)] == plain[(name, table)]


OPENMETRICS_VARIANT = r"""# TYPE flare_engram_row_cache_hits counter
# HELP flare_engram_row_cache_hits Row cache hits, "quoted" and \\ escaped \n help.
flare_engram_row_cache_hits_total{table="a\"b\\c"} 17 1700000000.250
flare_engram_row_cache_hits_created{table="a\"b\\c"} 1.7e9 1700000000.250
flare_engram_row_cache_hits_total{table="plain",shard="1"} 3
flare_engram_row_cache_hits_total{table="plain",shard="2"} 4
# TYPE flare_replay_readiness_wait_seconds counter
# UNIT flare_replay_readiness_wait_seconds seconds
flare_replay_readiness_wait_seconds_total 1.5
# TYPE flare_kv_cache_pages gauge
flare_kv_cache_pages NaN
# EOF
"""


def test_openmetrics_variant_escapes_timestamps_nan_unit_and_other_labels() -> None:
    values = parse_metrics(OPENMETRICS_VARIANT, content_type=OPENMETRICS_TEXT, host="h", rank=0)
    assert values[(NAMES.hits, 'a"b\\c')] == 17
    assert values[("flare_engram_row_cache_hits_created", 'a"b\\c')] == 1.7e9
    assert values[(NAMES.hits, "plain")] == 7  # labels other than `table` are summed
    assert values[("flare_replay_readiness_wait_seconds_total", "")] == 1.5
    assert math.isnan(values[(NAMES.kv_pages, "")])


PROMETHEUS_VARIANT = r"""# a free comment line
# HELP flare_engram_row_cache_misses_total misses with "quotes" and \\ backslashes
# TYPE flare_engram_row_cache_misses_total counter
flare_engram_row_cache_misses_total{table="0"} 12 1700000000000
flare_engram_row_cache_misses_total{table="x\"y\\z\nw"} 5
flare_engram_row_cache_misses_created{table="0"} 1.7e+09
flare_kv_cache_pages +Inf
flare_untyped_thing NaN
"""


def test_prometheus_variant_with_timestamps_escapes_and_specials() -> None:
    values = parse_metrics(PROMETHEUS_VARIANT, host="h")
    assert values[(NAMES.misses, "0")] == 12
    assert values[(NAMES.misses, 'x"y\\z\nw')] == 5
    assert values[("flare_engram_row_cache_misses_created", "0")] == 1.7e9
    assert values[(NAMES.kv_pages, "")] == math.inf
    assert math.isnan(values[("flare_untyped_thing", "")])


@pytest.mark.parametrize("body", [
    "<html><body><h1>502 Bad Gateway</h1></body></html>",
    "hello world\n",
    "flare_engram_row_cache_hits_total{table=\"0\"} twelve\n",
    "\x00\x01\x02binary",
])
def test_garbage_is_unreadable_naming_host_and_rank(body: str) -> None:
    with pytest.raises(MetricsUnreadable,
                       match=r"^host 10\.0\.0\.7 rank 2: /metrics is not valid Prometheus text"):
        parse_metrics(body, host="10.0.0.7", rank=2)


def test_openmetrics_without_eof_is_unreadable() -> None:
    truncated = OPENMETRICS_VARIANT.replace("# EOF\n", "")
    with pytest.raises(MetricsUnreadable, match=r"host h rank 1: .*not valid OpenMetrics.*EOF"):
        parse_metrics(truncated, content_type=OPENMETRICS_TEXT, host="h", rank=1)


@settings(max_examples=300, deadline=None)
@given(base=st.sampled_from([OPENMETRICS_VARIANT, PROMETHEUS_VARIANT]),
       start=st.integers(0, 600), cut=st.integers(0, 40),
       insert=st.text(st.sampled_from(sorted(set(OPENMETRICS_VARIANT + PROMETHEUS_VARIANT))
                                      + ["\x00", "\r", "é"]), max_size=12),
       openmetrics=st.booleans())
def test_damaged_text_parses_or_is_unreadable_never_anything_else(
        base: str, start: int, cut: int, insert: str, openmetrics: bool) -> None:
    text = base[:start] + insert + base[start + cut:]
    content_type = OPENMETRICS_TEXT if openmetrics else "text/plain"
    try:
        values = parse_metrics(text, content_type=content_type, host="h", rank=0)
    except MetricsUnreadable as exc:
        assert str(exc).startswith("host h rank 0: /metrics is not valid ")
    else:
        assert all(isinstance(value, float) for value in values.values())


# --- scraping real servers -------------------------------------------------


def test_snapshot_all_reads_every_host_in_order(three_hosts: list[StubServer]) -> None:
    three_hosts[2].serve("/metrics", openmetrics_reply(AFTER))
    with MetricScraper(endpoints_of(three_hosts), MODEL) as scraper:
        first = scraper.snapshot_all()
        second = scraper.snapshot_all()
    assert [(s.host, s.rank) for s in first] == [(h, r) for r, h in enumerate(HOSTS)]
    assert first[0].get(NAMES.hits, "0") == 500
    assert first[2].get(NAMES.hits, "0") == 800
    assert all(abs(s.taken_at - time.time()) < 60 for s in first + second)
    for server in three_hosts:  # both snapshots went over one kept-alive connection per host
        assert [r.path for r in server.requests] == ["/metrics", "/metrics"]
        assert len({r.client for r in server.requests}) == 1
        assert "text/plain" in server.requests[0].headers["accept"]


@pytest.mark.parametrize(("reply", "cause"), [
    (Reply(status=500, body="Internal Server Error: cache poisoned"),
     r"answered HTTP 500 Internal Server Error, expected 200 .* starts 'Internal Server Error"),
    (Reply(body="<html>not metrics</html>"), r"not valid Prometheus text .*<html>"),
    (Reply(body="  \n"), r"HTTP 200 with an empty body"),
])
def test_a_bad_answer_names_host_rank_and_cause(three_hosts: list[StubServer], reply: Reply,
                                                 cause: str) -> None:
    three_hosts[1].serve("/metrics", reply)
    with MetricScraper(endpoints_of(three_hosts), MODEL) as scraper:
        with pytest.raises(MetricsUnreadable, match=r"^host 127\.0\.0\.12 rank 1: .*" + cause) as raised:
            scraper.snapshot_all()
    assert raised.value.answered   # the rank was serving: nothing to wait for before saying so


def test_connection_refused_names_host_and_rank(three_hosts: list[StubServer]) -> None:
    three_hosts[2].stop()
    with MetricScraper(endpoints_of(three_hosts), MODEL) as scraper:
        with pytest.raises(MetricsUnreadable,
                           match=r"^host 127\.0\.0\.13 rank 2: cannot connect to http://127\.0\.0"
                                 r"\.13:\d+/metrics .*is the process running") as raised:
            scraper.snapshot_all()
    assert not raised.value.answered   # no answer: the runner then watches for a rank that died


def test_timeout_names_host_rank_and_timeout(three_hosts: list[StubServer]) -> None:
    three_hosts[0].serve("/metrics", Reply(body="x 1\n", delay_s=5))
    started = time.perf_counter()
    with MetricScraper(endpoints_of(three_hosts), MODEL, timeout_s=0.3) as scraper:
        with pytest.raises(MetricsUnreadable,
                           match=r"^host 127\.0\.0\.11 rank 0: no complete answer .* within 0\.3 s"):
            scraper.snapshot_all()
    assert time.perf_counter() - started < 3


def test_missing_required_metric_names_metric_and_host(three_hosts: list[StubServer]) -> None:
    three_hosts[2].serve("/metrics", prometheus_reply(HostState(omit=frozenset({NAMES.misses}))))
    with MetricScraper(endpoints_of(three_hosts), MODEL) as scraper:
        with pytest.raises(MetricMissing, match=r"^host 127\.0\.0\.13 rank 2: required metric "
                                                r"'flare_engram_row_cache_misses_total' is missing"):
            scraper.snapshot_all()


def test_missing_readiness_wait_is_reported(three_hosts: list[StubServer]) -> None:
    omit = frozenset({NAMES.readiness_wait_ns})
    three_hosts[0].serve("/metrics", openmetrics_reply(HostState(omit=omit)))
    with MetricScraper(endpoints_of(three_hosts), MODEL) as scraper:
        with pytest.raises(MetricMissing, match=r"rank 0: .*'flare_replay_readiness_wait_nano"):
            scraper.snapshot_all()


def test_nan_in_a_required_metric_is_unreadable(three_hosts: list[StubServer]) -> None:
    body = generate_latest(registry_for(BEFORE)).decode().replace(
        'flare_engram_row_cache_resident_rows{table="1"} 900.0',
        'flare_engram_row_cache_resident_rows{table="1"} NaN')
    three_hosts[1].serve("/metrics", Reply(body=body))
    with MetricScraper(endpoints_of(three_hosts), MODEL) as scraper:
        with pytest.raises(MetricsUnreadable, match=r"^host 127\.0\.0\.12 rank 1: required metric "
                                                    r"'flare_engram_row_cache_resident_rows'"
                                                    r"\{table=\"1\"\} is nan"):
            scraper.snapshot_all()


def test_snapshots_are_taken_concurrently(three_hosts: list[StubServer]) -> None:
    # each host answers only while all three are asked at once: one after another never gets an answer
    answer = together(Reply(body=generate_latest(registry_for(BEFORE))), parties=3)
    for server in three_hosts:
        server.serve("/metrics", answer)
    with MetricScraper(endpoints_of(three_hosts), MODEL, timeout_s=60) as scraper:
        snapshots = scraper.snapshot_all()
    assert [(s.host, s.rank) for s in snapshots] == [(h, r) for r, h in enumerate(HOSTS)]


def test_median_snapshot_of_three_hosts_is_under_50_ms(three_hosts: list[StubServer]) -> None:
    with MetricScraper(endpoints_of(three_hosts), MODEL) as scraper:
        scraper.snapshot_all()  # connect once, as a trial does before its first request
        times = []
        for _ in range(40):
            started = time.perf_counter()
            scraper.snapshot_all()
            times.append(time.perf_counter() - started)
    assert statistics.median(times) < 0.050, f"median {statistics.median(times) * 1e3:.1f} ms"


# --- deltas ----------------------------------------------------------------


def test_delta_derives_every_figure_per_table_and_host() -> None:
    result = delta(snapshot_of(BEFORE), snapshot_of(AFTER), MODEL)
    assert (result.host, result.rank) == (HOSTS[0], 0)
    t0, t1 = result.table("0"), result.table("1")
    assert [t0[q] for q in ("hits", "misses", "evictions", "inserts", "rows_added")] == [300, 100, 25, 60, 60]
    assert t0["refused_inserts"] == 15 and "refused_exported" not in t0
    assert [t1[q] for q in ("hits", "misses", "rows_added", "refused_inserts")] == [150, 50, 50, 0]
    assert [result[q] for q in ("hits", "misses", "evictions", "rows_added", "refused_inserts")] == [
        450, 150, 25, 110, 15]
    assert result["readiness_wait_ns"] == result["readiness_wait_sum_ns"] == 640_000
    assert (result["resident_rows"], result["capacity_rows"]) == (2_010, 2 * 1_806_918)
    assert result["hit_rate"] == pytest.approx(450 / 600)
    assert t0["hit_rate"] == pytest.approx(300 / 400)
    assert math.isnan(result["refused_exported"])   # declared by the runtime, not exported by this build
    assert result.tables == ["", "0", "1"]


def test_a_request_without_lookups_has_no_hit_rate() -> None:
    result = delta(snapshot_of(BEFORE), snapshot_of(BEFORE), MODEL)
    assert result["hits"] + result["misses"] == 0 and math.isnan(result["hit_rate"])


def test_fractional_increases_are_kept_where_the_unit_has_fractions() -> None:
    seconds = resolve("flare", {"readiness_wait_ns": {"unit": "s"}})
    before, after = HostState(tables=BEFORE.tables, readiness_ns=7), HostState(tables=AFTER.tables, readiness_ns=8)
    snap = {"before": snapshot_of(before), "after": snapshot_of(after)}
    changed = dict(snap["after"].values)
    changed[(NAMES.readiness_wait_ns, "")] = 8.25
    fractional = Snapshot(snap["after"].host, snap["after"].rank, snap["after"].taken_at, changed)
    assert delta(snap["before"], fractional, seconds)["readiness_wait_ns"] == 1.25
    assert delta(snap["before"], fractional, MODEL)["readiness_wait_ns"] == 1   # whole nanoseconds


def test_counter_reset_between_snapshots_of_a_real_server(three_hosts: list[StubServer]) -> None:
    restarted = HostState(tables={"0": TableState(hits=3, misses=40, inserts=40, resident=40),
                                  "1": TableState()})
    with MetricScraper(endpoints_of(three_hosts), MODEL) as scraper:
        before = scraper.snapshot_all()
        three_hosts[1].serve("/metrics", prometheus_reply(restarted))
        after = scraper.snapshot_all()
    assert delta(before[0], after[0], MODEL)["hits"] == 0
    with pytest.raises(CounterReset, match=r"^host 127\.0\.0\.12 rank 1: counter "
                                           r"flare_engram_row_cache_hits_total\{table=\"0\"\} went "
                                           r"down from 500 to 3 .*restarted or reset"):
        delta(before[1], after[1], MODEL)


def test_reset_of_the_readiness_wait_is_detected() -> None:
    after = HostState(tables=AFTER.tables, readiness_ns=10)
    with pytest.raises(CounterReset, match=r"flare_replay_readiness_wait_nanoseconds_total went "
                                           r"down from 7000000 to 10"):
        delta(snapshot_of(BEFORE), snapshot_of(after), MODEL)


def test_exported_refused_inserts_agree_with_the_derived_ones() -> None:
    before = HostState(tables=BEFORE.tables, export_refused=True)
    after_tables = dict(AFTER.tables)
    after_tables["0"] = TableState(**{**vars(AFTER.tables["0"]), "refused": 15})
    after = HostState(tables=after_tables, export_refused=True)
    result = delta(snapshot_of(before), snapshot_of(after, reply=openmetrics_reply), MODEL)
    assert result["refused_exported"] == result["refused_inserts"] == 15
    assert result.table("0")["refused_exported"] == 15


def test_exported_refused_inserts_that_disagree_are_an_error() -> None:
    before = HostState(tables=BEFORE.tables, export_refused=True)
    after_tables = dict(AFTER.tables)
    after_tables["0"] = TableState(**{**vars(AFTER.tables["0"]), "refused": 7})
    after = HostState(tables=after_tables, export_refused=True)
    with pytest.raises(MeasureError, match=r"^host 127\.0\.0\.11 rank 0: table 0: refused inserts "
                                           r"derived as .* = 100 - 60 - 25 = 15, but "
                                           r"flare_engram_row_cache_refused_inserts_total rose by 7"):
        delta(snapshot_of(before), snapshot_of(after), MODEL)


def test_refused_inserts_exported_by_only_one_snapshot_is_missing() -> None:
    before = HostState(tables=BEFORE.tables, export_refused=True)
    with pytest.raises(MetricMissing, match=r"rank 0: required metric "
                                            r"'flare_engram_row_cache_refused_inserts_total'"):
        delta(snapshot_of(before), snapshot_of(AFTER), MODEL)


def test_a_table_label_that_appears_counts_from_zero() -> None:
    after = HostState(tables={**AFTER.tables, "2": TableState(hits=0, misses=8, inserts=8,
                                                              resident=8)},
                      readiness_ns=AFTER.readiness_ns)
    result = delta(snapshot_of(BEFORE), snapshot_of(after), MODEL)
    assert result.table("2")["misses"] == 8 and result.table("2")["rows_added"] == 8
    assert result["misses"] == 158


def test_a_table_that_vanishes_is_missing() -> None:
    after = HostState(tables={"0": AFTER.tables["0"]}, readiness_ns=AFTER.readiness_ns)
    with pytest.raises(MetricMissing, match=r"'flare_engram_row_cache_\w+_total\{table=\"1\"\}'"):
        delta(snapshot_of(BEFORE), snapshot_of(after), MODEL)


def test_delta_of_two_different_ranks_is_refused() -> None:
    with pytest.raises(ValueError, match=r"snapshots of different ranks: host 127\.0\.0\.11 rank "
                                         r"0 and host 127\.0\.0\.12 rank 1"):
        delta(snapshot_of(BEFORE), snapshot_of(AFTER, host=HOSTS[1], rank=1), MODEL)


def test_combine_sums_three_hosts_and_takes_the_hit_rate_over_all() -> None:
    # the hosts look up very different numbers of rows, so the mean of rates is wrong
    small = HostState(tables={"0": TableState(hits=910, misses=1_010, inserts=1_010,
                                              resident=1_010), "1": BEFORE.tables["1"]},
                      readiness_ns=7_000_100)
    afters = [AFTER, AFTER, small]
    ranks = [delta(snapshot_of(BEFORE, host=h, rank=r), snapshot_of(a, host=h, rank=r), MODEL)
             for r, (h, a) in enumerate(zip(HOSTS, afters, strict=True))]
    assert ranks[2]["hits"] == 410 and ranks[2]["misses"] == 10
    combined = combine(ranks, MODEL)
    assert isinstance(combined, Figures)
    assert (combined.host, combined.rank) == ("all", -1)
    assert combined["hits"] == 450 + 450 + 410
    assert combined["misses"] == 150 + 150 + 10
    assert combined["evictions"] == 50 and combined["refused_inserts"] == 30
    assert combined["readiness_wait_sum_ns"] == 640_000 * 2 + 100
    assert combined["readiness_wait_ns"] == 640_000    # rank 0's: the exposed wait across ranks
    assert combined["capacity_rows"] == 3 * 2 * 1_806_918
    assert combined["hit_rate"] == pytest.approx(1310 / 1620)
    assert combined["hit_rate"] != pytest.approx(statistics.mean(r["hit_rate"] for r in ranks))
    assert combined.table("0")["misses"] == 100 + 100 + 10
    assert math.isnan(combined["refused_exported"])


def test_combine_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="`ranks` is empty"):
        combine([], MODEL)


def test_read_gauge_reads_kv_pages_or_names_what_is_missing() -> None:
    snapshot = snapshot_of(BEFORE, rank=2)
    assert read_gauge(snapshot, NAMES.kv_pages) == 12_528
    assert read_gauge(snapshot, NAMES.resident_rows, table="1") == 900
    assert read_gauge(snapshot, NAMES.resident_rows) == 1_900
    with pytest.raises(MetricMissing, match=r"rank 2: required metric 'flare_kv_pages_total'"):
        read_gauge(snapshot, "flare_kv_pages_total")
    with pytest.raises(MetricMissing, match=r"'flare_engram_row_cache_resident_rows\{table=\"9\"\}'"):
        read_gauge(snapshot, NAMES.resident_rows, table="9")
