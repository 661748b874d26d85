"""Trials on the simulated lab: real emulated ranks, real HTTP, samples read back from disk."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from cache_qualify.cli import main as cli_main
from cache_qualify.errors import MetricMissing, MetricsUnreadable, PrefixReuse, RankExited
from cache_qualify.config.inventory import load_inventory
from cache_qualify.lab.control import Lab
from cache_qualify.samples.store import FAILED, INVALID, OK, SampleStore
from cache_qualify.config.scenario import Scenario, find_scenario, load_scenario
from cache_qualify.samples.runfolder import read_start_facts
from cache_qualify.samples.store import ALL, STARTUP
from cache_qualify.trials.runner import Detail, TrialResult, TrialRunner, TrialSlot, interleave, scenario_requests
from tests.support.labfixtures import inventory_port, wait_no_sim_processes, write_inventory

SIM_SEED = 20240611
HOSTS = ("gb10-a", "gb10-b", "gb10-c")
REQUESTS = ("A", "A-new-start", "B", "B-new-start", "A-third-read")
COUNTS = ("hits", "misses", "rows_added", "evictions", "refused_inserts")


@dataclass
class SimLab:
    """One opened lab of the simulated inventory, a run folder and a runner of `reread-1g`."""

    lab: Lab
    store: SampleStore
    runner: TrialRunner
    port: int
    phases: list[str]

    def trial(self, build: str, number: int) -> TrialResult:
        return self.runner.run(TrialSlot(build=build, trial=number, block=number, position=0))

    def samples(self, build: str, trial: int) -> pd.DataFrame:
        frame = self.store.samples(only_ok=False)
        return frame[(frame["build"] == build) & (frame["trial"] == trial)]


def seeded_scenario() -> Scenario:
    """`reread-1g` with a fixed set-hash seed for every start (each rank derives its own from it)."""
    scenario = load_scenario(find_scenario("reread-1g"))
    return scenario.model_copy(update={"server_flags": [*scenario.server_flags, "--sim-seed", str(SIM_SEED)]})


# the tests on the opened lab share it (and its trials): one xdist worker runs them, so it opens once
ON_THE_LAB = pytest.mark.xdist_group("trials-lab")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimLab]:
    tmp = tmp_path_factory.mktemp("trials")
    path = write_inventory(tmp)
    inventory = load_inventory(path)
    scenario = seeded_scenario()
    store = SampleStore(tmp / "reports" / "run-1")
    store.create()
    phases: list[str] = []
    with Lab(inventory, inventory.groups_resolved()[0], run_id="run-1").open() as lab:
        runner = TrialRunner(lab, scenario, store, run_id="run-1", requests=scenario_requests(scenario),
                             progress=phases.append)
        yield SimLab(lab, store, runner, inventory_port(path), phases)
    assert wait_no_sim_processes(inventory_port(path)) == [], "an emulated rank was left running"


@pytest.fixture(scope="module")
def pair(sim: SimLab) -> dict[str, TrialResult]:
    """One trial of each build under test, on the same seed."""
    return {build: sim.trial(build, n) for n, build in enumerate(("set4", "two_choice"))}


def per_request(samples: pd.DataFrame) -> pd.DataFrame:
    """(request, host) x metric, the startup rows left out."""
    rows = samples[samples["request"] != STARTUP]
    return rows.pivot_table(index=["request", "host"], columns="metric", values="value", aggfunc="first")


def emulated(policies: tuple[str, ...], seed: int) -> dict[str, dict[str, dict[str, float]]]:
    """`cache-qualify emulate --json` run in this process: policy -> request -> counters."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli_main(["emulate", "--json", "--policy", ",".join(policies), "--seed", str(seed)])
    assert status == 0
    runs = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    return {run["policy"]: run["requests"] for run in runs}


# --- one trial of each build -------------------------------------------------------------------------


@pytest.mark.slow
@ON_THE_LAB
def test_both_builds_finish_ok_with_samples_for_every_request_and_host(sim: SimLab,
                                                                       pair: dict[str, TrialResult]) -> None:
    for build, result in pair.items():
        assert result.error is None and result.row.outcome == OK, result.row.reason
        table = per_request(sim.samples(build, result.row.trial))
        assert set(table.index) == {(r, h) for r in REQUESTS for h in (*HOSTS, ALL)}
        assert not table[list(COUNTS) + ["hit_rate", "readiness_wait_ns"]].isna().any().any()
        assert not sim.samples(build, result.row.trial)["value"].isna().any()   # what is not measured: no row
        startup = sim.samples(build, result.row.trial).query("request == @STARTUP")
        assert set(startup[startup["metric"] == "kv_pages"]["host"]) == {*HOSTS, ALL}
        assert set(startup[startup["metric"] == "page_cache_dropped"]["host"]) == set(HOSTS)
    trials = sim.store.trials()
    assert sorted(zip(trials["build"], trials["outcome"])) == [("set4", OK), ("two_choice", OK)]


@pytest.mark.slow
@ON_THE_LAB
def test_a_trial_s_result_carries_what_it_ran(sim: SimLab, pair: dict[str, TrialResult]) -> None:
    """What the prediction beside a measurement is made from travels with the trial's result: the build,
    the command line as its ranks ran it (the build's flags, then the scenario's, every placeholder filled),
    rank 0's log and kept /metrics and the requests sent, so the recorder reads neither the runner nor the
    run folder (whose copies stay the truth for `report` and `decide`: the same text)."""
    scenario, inventory = seeded_scenario(), sim.lab.inventory
    for build, result in pair.items():
        facts = result.facts
        assert facts is not None and result.build == build and result.trace is None
        flags = [*inventory.build(build).flags, *scenario.server_flags]
        assert any(list(facts.argv[k:k + len(flags)]) == flags for k in range(len(facts.argv))), facts.argv
        assert not [w for w in facts.argv if re.fullmatch(r".*\{[a-z0-9_]+\}.*", w)], facts.argv
        assert (facts.log, facts.metrics) == read_start_facts(sim.store.run_dir, result.row.attempt)
        assert facts.log.strip(), "rank 0's log is carried"
        # the workload the runner was handed, as sent: the same objects, in send order
        assert [r.name for r in result.requests] == list(REQUESTS)
        assert all(sent is given for sent, given in zip(result.requests, sim.runner.requests, strict=True))


@pytest.mark.slow
@ON_THE_LAB
def test_misses_are_rows_added_plus_evictions_plus_refused_on_every_host(sim: SimLab,
                                                                          pair: dict[str, TrialResult]) -> None:
    for build, result in pair.items():
        table = per_request(sim.samples(build, result.row.trial)).astype({c: "int64" for c in COUNTS})
        assert (table["misses"] == table["rows_added"] + table["evictions"] + table["refused_inserts"]).all()
        # refused is derived as that difference: a negative one would mean counters that disagree
        assert (table["refused_inserts"] >= 0).all(), table["refused_inserts"]
        hosts = table.drop(index=ALL, level="host")
        for metric in COUNTS:  # the combined row is the sum of the hosts
            assert (hosts[metric].groupby(level="request").sum() == table.xs(ALL, level="host")[metric]).all()


@pytest.mark.slow
@ON_THE_LAB
def test_combined_hit_rates_match_the_emulator_within_half_a_point(sim: SimLab,
                                                                   pair: dict[str, TrialResult]) -> None:
    reference = emulated(("set4", "two_choice"), SIM_SEED)
    for build, result in pair.items():
        table = per_request(sim.samples(build, result.row.trial))
        for request in REQUESTS:
            expected = reference[build][request]
            # every rank looks up the same gathers as the emulator's replay
            for host in HOSTS:
                lookups = table.loc[(request, host), "hits"] + table.loc[(request, host), "misses"]
                assert lookups == expected["lookups"], (build, request, host)
            measured = table.loc[(request, ALL), "hit_rate"]
            assert measured == pytest.approx(expected["hit_rate"], abs=0.005), (build, request)
    # the candidate's re-reads are what the change is for
    set4, two = (per_request(sim.samples(b, pair[b].row.trial)) for b in ("set4", "two_choice"))
    assert two.loc[("B-new-start", ALL), "hit_rate"] > set4.loc[("B-new-start", ALL), "hit_rate"] + 0.05


@pytest.mark.slow
@ON_THE_LAB
def test_exposed_readiness_wait_is_rank0s_and_the_sum_is_kept(sim: SimLab, pair: dict[str, TrialResult]) -> None:
    table = per_request(sim.samples("set4", pair["set4"].row.trial))
    for request in REQUESTS:
        assert table.loc[(request, ALL), "readiness_wait_ns"] == table.loc[(request, "gb10-a"), "readiness_wait_ns"]
        per_host = sum(table.loc[(request, h), "readiness_wait_ns"] for h in HOSTS)
        assert table.loc[(request, ALL), "readiness_wait_sum_ns"] == pytest.approx(per_host)
        assert table.loc[(request, ALL), "client_time_s"] > 0


@pytest.mark.slow
@ON_THE_LAB
def test_progress_names_each_phase_and_request(sim: SimLab, pair: dict[str, TrialResult]) -> None:
    set4 = [p for p in sim.phases if "trial 1, build set4:" in p]
    steps = [p for p in set4 if isinstance(p, Detail)]   # shown with -v; the trial's end at the default verbosity
    assert steps[0].endswith("dropping page caches") and steps[-1].endswith("stopping ranks")
    assert [p.rsplit(": ", 1)[1] for p in steps if "request" in p] == [f"request {r}" for r in REQUESTS]
    assert [p for p in set4 if not isinstance(p, Detail)] == [set4[-1]]
    assert re.search(r"trial 1, build set4: ok in \d+ s$", set4[-1]), set4


@pytest.mark.slow
@ON_THE_LAB
def test_exported_refused_inserts_equal_the_derived_ones(sim: SimLab) -> None:
    result = sim.trial("refused-metric", 10)
    assert result.row.outcome == OK, result.row.reason
    table = per_request(sim.samples("refused-metric", 10))
    assert not table["refused_exported"].isna().any()
    assert (table["refused_exported"] == table["refused_inserts"]).all()
    assert table["refused_exported"].sum() > 0  # the cross-check compared something


# --- faults ------------------------------------------------------------------------------------------


@pytest.mark.slow
@ON_THE_LAB
def test_prefix_reuse_makes_the_trial_invalid_and_says_why(sim: SimLab) -> None:
    result = sim.trial("prefix-reuse", 20)
    assert result.row.outcome == INVALID
    assert isinstance(result.error, PrefixReuse)
    with pytest.raises(PrefixReuse, match=r"host gb10-a rank 0: request 'A-new-start': the server reports \d+ "
                                          r"of 20000 prompt tokens as cached"):
        raise result.error
    assert result.row.reason.startswith("trial invalid: ")
    assert "Prefix-cache reuse" in result.row.reason and "the trial is invalid" in result.row.reason
    # the invalid trial's samples stay on disk but feed no verdict
    assert "A" in set(sim.samples("prefix-reuse", 20)["request"])
    assert sim.store.samples().query("build == 'prefix-reuse'").empty
    assert wait_no_sim_processes(sim.port) == []


def looks_after_the_failure(caplog: pytest.LogCaptureFixture) -> int:
    """Status checks of the ranks between the trial's last /metrics answer and its stop: a look at
    every rank is one check per host; waiting for a rank to be seen gone repeats them."""
    lines = [record.getMessage() for record in caplog.records]
    last_scrape = max(i for i, line in enumerate(lines) if "HTTP Request: GET" in line and "/metrics" in line)
    stop = next(i for i, line in enumerate(lines) if i > last_scrape and "kill -TERM" in line)
    return sum("echo gone" in line for line in lines[last_scrape:stop])


@pytest.mark.slow
@ON_THE_LAB
def test_missing_metric_names_the_metric_and_the_host(sim: SimLab, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    result = sim.trial("broken-metrics", 21)
    assert result.row.outcome == FAILED
    assert isinstance(result.error, MetricMissing)
    with pytest.raises(MetricMissing, match=r"^host gb10-c rank 2: required metric "
                                            r"'flare_replay_readiness_wait_nanoseconds_total' is missing"):
        raise result.error
    assert "gb10-c" in result.row.reason and "flare_replay_readiness_wait_nanoseconds_total" in result.row.reason
    # the rank answered, so it was serving: every rank is looked at once, not watched for seconds
    assert looks_after_the_failure(caplog) == len(HOSTS)
    assert wait_no_sim_processes(sim.port) == []


@pytest.mark.slow
@ON_THE_LAB
def test_metrics_answering_500_fail_the_trial_naming_the_host(sim: SimLab, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    result = sim.trial("metrics-500", 22)
    assert result.row.outcome == FAILED
    with pytest.raises(MetricsUnreadable, match=r"^host gb10-a rank 0: GET http://127\.0\.0\.11:\d+/metrics "
                                                r"answered HTTP 500"):
        assert result.error is not None
        raise result.error
    assert looks_after_the_failure(caplog) == len(HOSTS)
    assert wait_no_sim_processes(sim.port) == []


@pytest.mark.slow
@ON_THE_LAB
def test_crash_on_the_third_request_keeps_two_requests_and_stops_every_rank(sim: SimLab) -> None:
    result = sim.trial("crash-request3", 23)
    assert result.row.outcome == FAILED
    with pytest.raises(RankExited, match=r"host gb10-b rank 1: rank 1 of build 'crash-request3' exited during "
                                         r"the request sequence \(exit status 1\)"):
        assert result.error is not None
        raise result.error
    assert "simulated crash on request 3" in result.row.reason  # the rank's own log line
    assert wait_no_sim_processes(sim.port) == [], "a rank outlived the crashed trial"
    written = sim.samples("crash-request3", 23)
    assert set(written["request"]) == {STARTUP, "A", "A-new-start"}
    for request in ("A", "A-new-start"):
        rows = written[(written["request"] == request) & (written["metric"] == "hit_rate")]
        assert set(rows["host"]) == {*HOSTS, ALL}
    # the ranks' logs were fetched into the run folder
    logs = sorted(p.name for p in (sim.store.run_dir / "logs").rglob("*crash-request3*"))
    assert logs, list((sim.store.run_dir / "logs").rglob("*"))


# --- the trial order -----------------------------------------------------------------------------------


def test_interleave_balances_blocks_and_replays_from_the_seed() -> None:
    slots = interleave(("set4", "two_choice"), trials=6, block_size=2, seed=11)
    assert len(slots) == 12
    for block in range(3):
        inside = [s for s in slots if s.block == block]
        assert sorted((s.build, s.trial) for s in inside) == sorted(
            (b, t) for b in ("set4", "two_choice") for t in (2 * block, 2 * block + 1))
        assert [s.position for s in inside] == [0, 1, 2, 3]
    assert interleave(("set4", "two_choice"), trials=6, block_size=2, seed=11) == slots
    orders = {tuple(s.build for s in interleave(("x", "y"), trials=8, block_size=1, seed=k)) for k in range(8)}
    assert len(orders) > 1, "the order inside blocks does not depend on the seed"


def test_interleave_continues_after_earlier_trials() -> None:
    later = interleave(("a", "b"), trials=3, block_size=1, seed=5, first_trial=4)
    assert sorted({s.trial for s in later}) == [4, 5, 6]
    assert [s.block for s in later] == [4, 4, 5, 5, 6, 6]


def test_concurrent_copies_of_each_request_are_counted_together(tmp_path: Path) -> None:
    """`concurrency: 2` sends each request twice at once: twice the lookups of one copy, on every host."""
    path = write_inventory(tmp_path)
    inventory = load_inventory(path)
    base = seeded_scenario()
    # short A then A with a new start: the first request after a start is split differently
    specs = tuple(r.model_copy(update={"stop": 3000}) for r in base.requests[:2])
    store = SampleStore(tmp_path / "run")
    store.create()
    lookups = {}
    with Lab(inventory, inventory.groups_resolved()[0], run_id="run-c").open() as lab:
        for copies in (1, 2):
            scenario = base.model_copy(update={"requests": specs, "concurrency": copies})
            runner = TrialRunner(lab, scenario, store, run_id="run-c", requests=scenario_requests(scenario))
            result = runner.run(TrialSlot(build="set4", trial=copies, block=0, position=0))
            assert result.row.outcome == OK, result.row.reason
            frame = store.samples()
            mine = frame[(frame["trial"] == copies) & (frame["request"] == "A-new-start")]
            table = mine.pivot_table(index="host", columns="metric", values="value")
            lookups[copies] = table["hits"] + table["misses"]
    assert (lookups[2] == 2 * lookups[1]).all(), lookups
    assert wait_no_sim_processes(inventory_port(path)) == []
