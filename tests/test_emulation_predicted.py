"""A run's predicted hit rates (cache_qualify.emulation.predicted) from a real vLLM 0.32.0's recorded starts
(tests/data): each start's prediction from its build's flags and what the start kept, held against what the
same start measured, and summary.md and verdicts.json showing both per build and request."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cache_qualify.config.command import command_words
from cache_qualify.config.inventory import load_inventory
from cache_qualify.config.scenario import load_scenario
from cache_qualify.emulation.predicted import predict_start, request_checks, unreadable
from cache_qualify.emulation.sources import StartFacts, read_build
from cache_qualify.report.render import render_run
from cache_qualify.samples import runfolder
from cache_qualify.samples.store import ALL
from cache_qualify.trials.measure import emulator_metrics, metric_lines
from cache_qualify.trials.runner import scenario_requests
from tests.support.labfixtures import REPO, collected
from tests.support.recorded_vllm import (BLOCK, EXAMPLE, PROMPT_TOKENS, SCENARIO, body, recorded_requests,
                                         vllm_bodies, write_recorded_run)

RESEND = REPO / "examples" / "vllm-resend.yaml"
WHOLE = PROMPT_TOKENS // BLOCK * BLOCK   # 3,968: the last partial block is always computed
LACKING = ("build prefix-caching measured 0.0 % on P-again where prefix caching with blocks of 128 and 2,097,152 "
           "tokens gives 99.2 %: is --enable-prefix-caching in effect (read from --enable-prefix-caching)?")


def start_facts(build: str, *, metrics: str | None = None, log: str | None = None) -> StartFacts:
    """examples/vllm.yaml's command line of `build` with the recorded caching start's /metrics and log."""
    inventory = load_inventory(EXAMPLE)
    argv = command_words(inventory.server.command, list(inventory.build(build).flags))
    return StartFacts(tuple(argv), vllm_bodies("vllm-metrics.txt")[0] if metrics is None else metrics,
                      body("vllm-start.log") if log is None else log)


def test_a_start_of_the_resend_example_is_predicted_from_its_builds_flags_and_the_start() -> None:
    spec = load_inventory(EXAMPLE).measurement.emulator
    assert spec is not None
    requests = scenario_requests(load_scenario(RESEND))
    got = {build: predict_start(spec, start_facts(build), requests, build=build, trial=0, attempt="a")
           for build in ("no-prefix-caching", "prefix-caching", "prefix-caching-32")}
    assert got["prefix-caching"].requests == ("A", "B", "A-again", "B-again")
    assert got["prefix-caching"].prompt_tokens == (4090,) * 4
    # the example's pinned figures: 31 whole blocks of 128 of a 4,090-token re-send, 127 of 32, none uncached
    assert got["prefix-caching"].cached_tokens == (0, 0, 3968, 3968)
    assert got["prefix-caching-32"].cached_tokens == (0, 0, 4064, 4064)
    assert got["no-prefix-caching"].cached_tokens == (0, 0, 0, 0)
    assert got["prefix-caching"].hit_rate("A-again") == 3968 / 4090 and got["prefix-caching"].exact
    assert got["prefix-caching-32"].origins["block_size"] == "--block-size 32"
    assert got["prefix-caching"].origins["block_size"] == "vllm:cache_config_info{block_size=128}"


def test_the_metric_lines_a_start_keeps_give_what_its_whole_body_gives() -> None:
    model = load_inventory(EXAMPLE).measurement
    whole = vllm_bodies("vllm-metrics.txt")[0]
    kept = metric_lines(whole, emulator_metrics(model))
    assert emulator_metrics(model) == {"vllm:cache_config_info"}
    assert len(kept.splitlines()) == 3 and len(kept) < len(whole) / 40   # HELP, TYPE, the sample
    assert model.emulator is not None
    assert read_build("b", model.emulator, start_facts("prefix-caching", metrics=kept)) == \
        read_build("b", model.emulator, start_facts("prefix-caching", metrics=whole))


@pytest.fixture(scope="module")
def equal_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = write_recorded_run(tmp_path_factory.mktemp("equal"), {"no-prefix-caching": "off", "prefix-caching": "on"})
    render_run(run, plots=False)
    return run


def table_rows(summary: str) -> list[list[str]]:
    section = summary.split("### Predicted beside measured", 1)[1].split("\n### ", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| `")]


def test_a_run_shows_each_builds_predicted_beside_measured_hit_rate_equal_where_exact(equal_run: Path) -> None:
    summary = (equal_run / "summary.md").read_text(encoding="utf-8")
    rows = table_rows(summary)
    assert ["`prefix-caching`", "P-again", "99.20 %", "99.20 %", "2 of 2", "equal (exact)"] in rows
    assert ["`no-prefix-caching`", "P-again", "0.00 %", "0.00 %", "2 of 2", "equal (exact)"] in rows
    assert len(rows) == 6 and "Outside:" not in summary
    assert ("- `prefix-caching`: prefix caching with blocks of 128 and 2,097,152 tokens (`prefix_caching` from "
            "--enable-prefix-caching; `block_size` from vllm:cache_config_info{block_size=128};") in summary
    page = (equal_run / "summary.html").read_text(encoding="utf-8")   # the same renderer
    assert "<h3>Predicted beside measured</h3>" in page and ">equal (exact)</td>" in page
    listed = json.loads((equal_run / "verdicts.json").read_text(encoding="utf-8"))["predictions"][SCENARIO]
    again = next(c for c in listed if c["build"] == "prefix-caching" and c["request"] == "P-again")
    assert again["predicted"] == again["measured"] == WHOLE / PROMPT_TOKENS and again["tolerance"] == 0
    assert {c["outcome"] for c in listed} == {"passed"}
    # each start's record: the build's parameters and where each was read
    records = runfolder.read_predictions(equal_run)[SCENARIO]
    assert len(records) == 4 and {r.cached_tokens for r in records} == {(0, 0, 0), (0, 0, WHOLE)}


def test_a_candidate_lacking_the_cache_it_claims_is_caught_naming_build_quantity_values_and_cause(
        tmp_path: Path) -> None:
    # both builds measured the start without prefix caching; one claims --enable-prefix-caching
    run = write_recorded_run(tmp_path, {"no-prefix-caching": "off", "prefix-caching": "off"})
    records = runfolder.read_predictions(run)[SCENARIO]
    checks = request_checks(records, pd.read_csv(run / "samples.csv"))
    again = next(c for c in checks["prefix-caching"] if c.request == "P-again")
    assert (again.check.outcome, again.within, again.starts) == ("failed", 0, 2)
    assert again.check.line() == LACKING
    assert again.check.properties() == {"predicted_hit_rate": "0.992", "measured_hit_rate": "0",
                                        "prediction_tolerance": "0", "prediction_exact": "true",
                                        "prediction_outcome": "failed"}
    assert all(c.check.within for c in checks["no-prefix-caching"])
    render_run(run, plots=False)
    summary = (run / "summary.md").read_text(encoding="utf-8")
    assert ["`prefix-caching`", "P-again", "99.20 %", "0.00 %", "0 of 2", "**OUTSIDE** (exact)"] in table_rows(summary)
    assert f"Outside:\n\n- {LACKING}" in summary


def test_prediction_warn_makes_the_difference_a_warning(tmp_path: Path) -> None:
    run = write_recorded_run(tmp_path, {"no-prefix-caching": "off", "prefix-caching": "off"}, trials=1,
                             prediction="warn")
    checks = request_checks(runfolder.read_predictions(run)[SCENARIO], pd.read_csv(run / "samples.csv"))
    again = next(c for c in checks["prefix-caching"] if c.request == "P-again")
    assert again.check.outcome == "warning" and again.check.line() == LACKING


def test_starts_that_differ_name_the_trial_furthest_from_its_prediction() -> None:
    spec = load_inventory(EXAMPLE).measurement.emulator
    assert spec is not None
    records = [predict_start(spec, start_facts("prefix-caching"), recorded_requests(), build="prefix-caching",
                             trial=t, attempt=f"a{t}") for t in range(2)]
    measured = pd.DataFrame({"attempt": ["a0", "a1"], "request": ["P-again"] * 2, "metric": ["hit_rate"] * 2,
                             "host": [ALL] * 2, "value": [WHOLE / PROMPT_TOKENS, 0.0]})
    (again,) = request_checks(records, measured)["prefix-caching"]
    assert (again.starts, again.within, again.check.on, again.check.measured) == (2, 1, "P-again (trial 2)", 0.0)


def test_a_parameter_no_place_gives_leaves_the_build_without_figures_naming_it(tmp_path: Path) -> None:
    spec = load_inventory(EXAMPLE).measurement.emulator
    assert spec is not None
    # no --block-size, no /metrics kept, no KV line in the log: the block size is read nowhere
    record = predict_start(spec, start_facts("prefix-caching", metrics="", log="no KV line"), recorded_requests(),
                           build="prefix-caching", trial=0, attempt="a")
    assert record.cached_tokens == () and record.hit_rate("P-again") is None
    assert record.unreadable.startswith("build prefix-caching: not predicted: the vllm-block emulator's `block_size` "
                                        "is stated by none of its places (the flag --block-size; "
                                        "vllm:cache_config_info{block_size})")
    assert unreadable([record]) == {"prefix-caching": record.unreadable}
    assert request_checks([record], pd.DataFrame(columns=["attempt", "request", "metric", "host", "value"])) == {}


def test_a_runtime_with_an_emulator_has_a_prediction_test_per_scenario_and_build() -> None:
    names = collected("--hosts", str(EXAMPLE), "--scenario", str(RESEND),
                      "--candidate", "prefix-caching,prefix-caching-32")
    assert [n for n in names if n.startswith("test_prediction")] == [
        "test_prediction[vllm-resend:no-prefix-caching]", "test_prediction[vllm-resend:prefix-caching]",
        "test_prediction[vllm-resend:prefix-caching-32]"]
    # the simulated lab's row cache has one too (flare-rowcache, tests/test_emulation_rowcache.py)
    assert [n for n in collected("--hosts", str(REPO / "hosts.yaml")) if n.startswith("test_prediction")] == [
        "test_prediction[reread-1g:set4]", "test_prediction[reread-1g:two_choice]"]



@pytest.mark.parametrize("established", [False, True])
def test_a_band_not_established_for_the_lab_warns_saying_how_to_establish_it(established: bool) -> None:
    """A band taken from elsewhere (the flare profile's: the study's emulation gap, `established: false`) is
    not the lab's: outside it the check warns, never fails a correct build, and says how the lab states its
    own; a band the lab states (the inventory's `emulator: {band: ...}`, as the simulated lab's) fails."""
    shipped = load_inventory(EXAMPLE).measurement.emulator
    assert shipped is not None
    spec = shipped.model_copy(update={"established": established})
    # two copies at once: the one-at-a-time replay is a band's centre
    record = predict_start(spec, start_facts("prefix-caching"), recorded_requests(), build="prefix-caching",
                           trial=0, attempt="a", concurrency=2)
    assert not record.exact and record.established is established and record.tolerance == spec.band
    samples = pd.DataFrame({"attempt": ["a"] * 3, "request": list(record.requests), "metric": ["hit_rate"] * 3,
                            "host": [ALL] * 3, "value": [0.0] * 3})
    again = {c.request: c.check for c in request_checks([record], samples)["prefix-caching"]}["P-again"]
    assert not again.within
    if established:
        assert again.outcome == "failed" and "not established" not in again.line(), again.line()
    else:
        assert again.outcome == "warning", again
        # in a run the record names the command that calibrates (tests/test_calibration.py)
        assert again.line().endswith("not established for this lab, so a warning; docs/emulation.md)"), again.line()
