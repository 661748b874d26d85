"""`trials.replay` against a real simulated rank: open and closed loop, streamed and not, every
per-request figure consistent, failures recorded without ending the replay, the deadline and a
cancel returning what was done; `trials.aggregates` against figures worked out by hand."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import statistics
import threading
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from cache_qualify.errors import CounterReset
from cache_qualify.trials.aggregates import (QUANTITIES, WARM, CounterValues, Window, aggregates,
                                             counter_hit_rate)
from cache_qualify.trials.exchange import RequestShape
from cache_qualify.trials.replay import (STOPPED_CANCELLED, STOPPED_DEADLINE, Arrival, ReplayResult,
                                         RequestRecord, replay)
from tests.support.simrank import HOST, SimRank, free_port, short_requests, sim_rank

MAX_TOKENS = 4
STREAM = RequestShape(stream=True)
PLAIN = RequestShape(stream=False)


@pytest.fixture(scope="module")
def rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimRank]:
    """One rank with a prefix cache, so that shared prompt pages come back as cached tokens."""
    with sim_rank(tmp_path_factory.mktemp("replay"), ["--prefix-cache-memory", "1G"]) as started:
        yield started


def check_streamed(record: RequestRecord) -> None:
    assert record.ok, record
    assert record.status == 200
    assert 0 < record.ttft_s <= record.e2e_s
    assert record.output_tokens == MAX_TOKENS
    assert len(record.itl_s) == record.output_tokens - 1
    assert all(gap >= 0 for gap in record.itl_s)
    assert record.ttft_s + sum(record.itl_s) <= record.e2e_s


def test_open_loop_streamed_sends_on_schedule_and_times_every_token(rank: SimRank) -> None:
    requests = short_requests(30, spacing_s=0.01)
    result = replay(rank.url, STREAM, requests)
    assert (result.planned, len(result.records), result.stopped) == (30, 30, "")
    for record, request in zip(result.records, requests):
        check_streamed(record)
        assert record.index == request.index and record.prompt_tokens == len(request.prompt)
        assert record.scheduled_s == pytest.approx(request.at_s)
        # asyncio may wake a clock tick early; never a request before its time by more
        assert record.lateness_s == pytest.approx(record.sent_s - record.scheduled_s)
        assert record.lateness_s > -0.002
    assert result.wall_s >= requests[-1].at_s


def test_closed_loop_keeps_at_most_n_in_flight_and_takes_the_requests_in_order(rank: SimRank) -> None:
    result = replay(rank.url, PLAIN, short_requests(24), arrival=Arrival(clients=3))
    frame = result.frame()
    assert len(frame) == 24 and (frame["error"] == "").all()
    assert frame["sent_s"].is_monotonic_increasing   # the workers share one queue, in order
    assert frame["lateness_s"].isna().all() and frame["ttft_s"].isna().all()
    assert (frame["itl_s"].map(len) == 0).all() and (frame["output_tokens"] == MAX_TOKENS).all()
    starts, ends = frame["sent_s"].tolist(), (frame["sent_s"] + frame["e2e_s"]).tolist()
    in_flight = max(sum(1 for s, e in zip(starts, ends) if s <= at < e) for at in starts)
    assert 1 <= in_flight <= 3


def test_closed_loop_streamed(rank: SimRank) -> None:
    result = replay(rank.url, STREAM, short_requests(12), arrival=Arrival(clients=4))
    assert len(result.records) == 12
    for record in result.records:
        check_streamed(record)


def test_time_scale_stretches_the_schedule(rank: SimRank) -> None:
    result = replay(rank.url, PLAIN, short_requests(5, spacing_s=0.01), arrival=Arrival(time_scale=3.0))
    assert [r.scheduled_s for r in result.records] == pytest.approx([0.0, 0.03, 0.06, 0.09, 0.12])


def test_cached_tokens_come_from_the_responses(rank: SimRank) -> None:
    # a 256-token common start is two whole pages of 128: every request after the first reuses them
    requests = short_requests(6, prompt_tokens=300, shared=256)
    result = replay(rank.url, STREAM, requests, arrival=Arrival(clients=1))
    assert [r.cached_tokens for r in result.records] == [0.0] + [256.0] * 5
    figures = aggregates(result.frame())
    assert figures["cached_share"] == pytest.approx(5 * 256 / (6 * 300))


def hand_percentile(values: list[float], q: int) -> float:
    """The q-th percentile by linear interpolation between order statistics, worked out by hand."""
    data = sorted(values)
    at = (len(data) - 1) * q / 100
    low = math.floor(at)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (at - low)


def hand_figures(records: list[RequestRecord]) -> dict[str, float]:
    ok = [r for r in records if r.ok]
    gaps = [g for r in ok for g in r.itl_s]
    wall = max(r.sent_s + r.e2e_s for r in records) - min(r.sent_s for r in records)
    errors = len(records) - len(ok)
    return {
        "requests": len(records), "errors": errors, "error_rate": errors / len(records),
        "cached_share": sum(r.cached_tokens for r in ok) / sum(r.prompt_tokens for r in ok),
        **{f"ttft_p{q}_s": hand_percentile([r.ttft_s for r in ok], q) for q in (50, 90, 99)},
        **{f"e2e_p{q}_s": hand_percentile([r.e2e_s for r in ok], q) for q in (50, 90, 99)},
        "itl_p50_s": hand_percentile(gaps, 50), "itl_p99_s": hand_percentile(gaps, 99),
        "prompt_throughput_tps": sum(r.prompt_tokens for r in ok) / wall,
        "output_throughput_tps": sum(r.output_tokens for r in ok) / wall,
        "lateness_p99_s": hand_percentile([r.lateness_s for r in records], 99), "wall_s": wall,
    }


def test_aggregates_are_the_recorded_figures_worked_out_by_hand(rank: SimRank) -> None:
    requests = short_requests(40, spacing_s=0.005, prompt_tokens=200, shared=128)
    result = replay(rank.url, STREAM, requests)
    frame = result.frame()
    whole = aggregates(frame)
    assert set(whole) == set(QUANTITIES)
    assert whole == pytest.approx(hand_figures(list(result.records)))
    warm = aggregates(frame, Window(WARM))
    assert warm == pytest.approx(hand_figures(list(result.records[20:])))
    assert warm["requests"] == 20
    ranged = aggregates(frame, Window.indices(5, 15))
    assert ranged == pytest.approx(hand_figures(list(result.records[5:15])))
    # the median of a statistics module's own percentiles agrees on the centre
    assert whole["e2e_p50_s"] == pytest.approx(statistics.median(frame["e2e_s"]))


def test_a_refused_request_is_an_error_and_the_replay_goes_on(rank: SimRank) -> None:
    requests = short_requests(10)
    requests[3] = dataclasses.replace(requests[3], max_tokens=10_000_000)
    result = replay(rank.url, STREAM, requests)
    bad = result.records[3]
    assert bad.status == 400 and "exceeds the server's limit" in bad.error and not bad.ok
    assert all(r.ok for i, r in enumerate(result.records) if i != 3)
    figures = aggregates(result.frame())
    assert figures["errors"] == 1 and figures["error_rate"] == pytest.approx(0.1)


def test_a_stopped_server_gives_an_error_per_request_not_an_exception() -> None:
    url = f"http://{HOST}:{free_port()}"   # nothing listens there
    result = replay(url, PLAIN, short_requests(5), timeout_s=5.0)
    assert len(result.records) == 5 and result.stopped == ""
    for record in result.records:
        assert record.status == 0 and "cannot connect to" in record.error
    assert aggregates(result.frame())["error_rate"] == 1.0


def test_the_request_timeout_is_an_error(rank: SimRank) -> None:
    result = replay(rank.url, STREAM, short_requests(3, prompt_tokens=2000), timeout_s=0.0005)
    assert [r.error for r in result.records] == ["no complete answer within the 0.0005 s request timeout"] * 3


def test_the_deadline_stops_the_sending_and_returns_what_was_done(rank: SimRank) -> None:
    requests = short_requests(40, spacing_s=0.05)   # two seconds of schedule
    result = replay(rank.url, PLAIN, requests, deadline_s=0.5)
    assert result.stopped == STOPPED_DEADLINE and result.planned == 40
    assert 3 <= len(result.records) < 40
    assert all(r.scheduled_s <= 0.5 for r in result.records)
    assert all(r.ok or "cut short: the replay stopped" in r.error for r in result.records)


def test_ctrl_c_stops_the_replay_and_returns_what_was_done(rank: SimRank) -> None:
    requests = short_requests(60, spacing_s=0.05)   # three seconds of schedule
    timer = threading.Timer(0.6, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        result = replay(rank.url, PLAIN, requests)
    finally:
        timer.cancel()
    assert result.stopped == STOPPED_CANCELLED
    assert 3 <= len(result.records) < 60
    assert [r.position for r in result.records] == sorted(r.position for r in result.records)


def test_the_frame_has_a_row_per_record_and_a_column_per_field() -> None:
    record = RequestRecord(index=7, position=0, scheduled_s=0.0, sent_s=0.001, lateness_s=0.001, ttft_s=0.01,
                           e2e_s=0.02, itl_s=(0.005, 0.005), prompt_tokens=10, output_tokens=3, cached_tokens=0.0,
                           status=200, error="")
    frame = ReplayResult(records=(record,), planned=1, wall_s=0.02).frame()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == list(RequestRecord.__dataclass_fields__)
    assert frame.loc[0, "itl_s"] == (0.005, 0.005) and frame.loc[0, "index"] == 7


def test_the_counter_hit_rate_is_the_deltas_ratio() -> None:
    before, after = CounterValues(hits=1_000, prompt_tokens=4_000), CounterValues(hits=1_600, prompt_tokens=6_000)
    assert counter_hit_rate(before, after) == pytest.approx(600 / 2_000)
    assert math.isnan(counter_hit_rate(before, before))
    assert aggregates(pd.DataFrame(columns=list(RequestRecord.__dataclass_fields__)),
                      counters=(before, after))["hit_rate"] == pytest.approx(0.3)
    with pytest.raises(CounterReset, match=r"went back during the replay \(hits 1000 -> 10, .*restarted"):
        counter_hit_rate(before, CounterValues(hits=10, prompt_tokens=6_500))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match=r"`clients` must be at least 1, got 0"):
        Arrival(clients=0)
    with pytest.raises(ValueError, match=r"`time_scale` must be a positive number, got -1"):
        Arrival(time_scale=-1)
    with pytest.raises(ValueError, match=r"0 <= first < stop, got \[5, 5\)"):
        Window.indices(5, 5)


def test_a_request_waits_for_a_free_connection_and_the_wait_is_lateness(rank: SimRank) -> None:
    result = replay(rank.url, STREAM, short_requests(6, spacing_s=0.001), connections=1)
    records = result.records
    assert all(r.ok for r in records)
    for before, after in zip(records, records[1:]):
        assert after.sent_s >= before.sent_s + before.e2e_s   # one connection: one request at a time
    assert records[-1].lateness_s >= sum(r.e2e_s for r in records[:-1]) - records[-1].scheduled_s
