"""The measurement model: runtime profiles shipped as data, overridden entry by entry in an inventory."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache_qualify.config.inventory import load_inventory
from cache_qualify.config.measurement import Measurement, build_model
from cache_qualify.config.scenario import Asserted, check_expectations
from cache_qualify.config.profiles import available_runtimes, load_profile, resolve
from cache_qualify.config.yamlsource import FieldProblem
from cache_qualify.errors import InventoryError, ProfileError
from cache_qualify.trials.figures import combine, delta
from cache_qualify.trials.measure import Snapshot
from cache_qualify.samples import runfolder
from tests.support.labfixtures import REPO, edited, run_qualify, small_scenario_option, write_file, write_inventory

HOSTS_YAML = (REPO / "hosts.yaml").read_text(encoding="utf-8")


def test_every_shipped_profile_is_consistent() -> None:
    assert {"flare", "llama-cpp"} <= set(available_runtimes())
    for name in available_runtimes():
        model = resolve(name)
        assert model.runtime == name and model.readiness_path.startswith("/")
        for q in model.quantities.values():
            assert all(i in model.quantities for i in q.inputs), q.name
            assert list(model.quantities).index(q.name) > max((list(model.quantities).index(i) for i in q.inputs),
                                                              default=-1)
        assert set(model.columns) <= set(model.quantities)
        assert load_profile(name).description and load_profile(name).tested


def test_the_study_runtime_declares_the_study_s_figures() -> None:
    flare = resolve("flare")
    assert flare.quantities["hit_rate"].describe() == "fraction hits / (hits + misses) (fraction, higher is better)"
    assert flare.quantities["refused_inserts"].inputs == ("misses", "rows_added", "evictions")
    assert flare.quantities["readiness_wait_ns"].combine == "rank0"
    assert (flare.quantities["kv_pages"].per, flare.quantities["kv_pages"].combine) == ("start", "min")
    assert flare.quantities["startup_s"].unit == "s" and flare.quantities["client_time_s"].direction == "lower"
    assert flare.required_metrics() == (
        "flare_engram_row_cache_hits_total", "flare_engram_row_cache_misses_total",
        "flare_engram_row_cache_evictions_total", "flare_engram_row_cache_inserts_total",
        "flare_engram_row_cache_resident_rows", "flare_engram_row_cache_capacity_rows",
        "flare_replay_readiness_wait_nanoseconds_total")


def test_llama_server_exports_no_row_cache_figures() -> None:
    llama = resolve("llama-cpp")
    for missing in ("evictions", "refused_inserts", "readiness_wait_ns", "resident_rows"):
        assert not llama.exports(missing)
    assert llama.quantities["prompt_time_s"].unit == "s" and llama.quantities["kv_pages"].source == "log"
    assert llama.columns == ("hit_rate", "prompt_time_s", "client_time_s")


def test_an_override_replaces_the_source_and_keeps_the_rest() -> None:
    model = resolve("flare", {"hits": {"counter": "rc_hits_total"}, "kv_pages": {"log": r"KV: (\d+) pages"}})
    hits = model.quantities["hits"]
    assert (hits.spec.counter, hits.unit, hits.spec.required) == ("rc_hits_total", "rows", True)
    assert (model.quantities["kv_pages"].source, model.quantities["kv_pages"].direction) == ("log", "higher")
    direction = resolve("flare", {"evictions": {"direction": "higher"}}).quantities["evictions"]
    assert direction.spec.counter == "flare_engram_row_cache_evictions_total" and direction.direction == "higher"


def test_a_quantity_removed_takes_what_is_derived_from_it() -> None:
    model = resolve("flare", {"evictions": None})
    assert not model.exports("evictions") and not model.exports("refused_inserts")
    assert model.exports("hit_rate") and "evictions" not in model.columns
    assert "refused_inserts" not in model.columns


@pytest.mark.parametrize(("overrides", "where", "message"), [
    ({"hits": {"counter": "x_total", "gauge": "y"}}, ("hits",),
     r"expected exactly one source \(counter, gauge, .*\), found counter, gauge"),
    ({"prompt_ms": {"response": "timings.prompt_ms"}}, ("quantities", "prompt_ms", "unit"),
     r"a response needs its unit: one of ns, us, ms, s"),
    ({"prompt_ms": {"response": "timings.prompt_ms", "unit": "fortnights"}}, ("prompt_ms", "unit"),
     r"unknown unit 'fortnights'"),
    ({"evictions": None, "refused_inserts": {"difference": ["misses", "rows_added", "evictions"]}},
     ("quantities", "refused_inserts", "difference"), r"derived from evictions, which the runtime does not declare"),
    ({"waits": {"difference": ["readiness_wait_ns", "hits"]}}, ("quantities", "waits", "difference"),
     r"its inputs have different units: readiness_wait_ns in ns, hits in rows"),
    ({"load": {"log": r"loaded in (\d+) ms", "unit": "ms", "per": "request"}}, ("load", "per"),
     r"a log source is read once per start: expected `per: start`"),
    ({"pages": {"log": r"pages"}}, ("pages", "log"), r"expected a regex with exactly one group"),
    ({"rate": {"fraction": {"part": "hits", "whole": ["misses"]}, "unit": "rows"}}, ("quantities", "rate", "unit"),
     r"a fraction is in `fraction`, found 'rows'"),
    ({"a": {"difference": ["b", "hits"]}, "b": {"difference": ["a", "hits"]}}, ("quantities", "a"),
     r"derived from itself: a -> b -> a"),
])
def test_a_bad_override_names_the_quantity_and_the_rule(overrides: dict[str, dict[str, object] | None],
                                                        where: tuple[str, ...], message: str) -> None:
    with pytest.raises(FieldProblem, match=message) as caught:
        resolve("flare", overrides)
    assert caught.value.loc[:len(where)] == where


def test_an_inventory_overrides_its_runtime_and_names_file_line_and_field(tmp_path: Path) -> None:
    text = edited(HOSTS_YAML, "builds:\n", "measurements:\n  hits: {counter: rc_hits_total}\n"
                  "  prompt_ms: {response: timings.prompt_ms, unit: ms, direction: lower}\nbuilds:\n")
    inventory = load_inventory(write_file(tmp_path, text, "hosts.yaml"))
    assert inventory.measurement.quantities["hits"].spec.counter == "rc_hits_total"
    assert inventory.measurement.quantities["prompt_ms"].shown.describe(152.5) == "0.1525 s"
    bad = edited(HOSTS_YAML, "builds:\n", "measurements:\n  prompt_ms: {response: timings.prompt_ms}\nbuilds:\n")
    line = bad.splitlines().index("measurements:") + 2
    with pytest.raises(InventoryError, match=rf"hosts\.yaml:{line}: measurements\.prompt_ms\.unit: a response needs "
                                             r"its unit"):
        load_inventory(write_file(tmp_path, bad, "hosts.yaml"))
    unknown = edited(HOSTS_YAML, "  runtime: flare\n", "  runtime: tgi\n")
    with pytest.raises(InventoryError, match=r"server\.runtime: unknown runtime 'tgi'; expected a shipped profile "
                                             r"\(flare, llama-cpp, sglang, vllm\) or a profile file of the lab's "
                                             r"own, relative to the inventory \(`runtime: \./tgi\.yaml`"):
        load_inventory(write_file(tmp_path, unknown, "hosts.yaml"))


def test_an_inventory_names_its_runtime_there_is_no_default(tmp_path: Path) -> None:
    text = edited(HOSTS_YAML, "  runtime: flare\n", "")
    line = text.splitlines().index("server:") + 1
    with pytest.raises(InventoryError, match=rf"hosts\.yaml:{line}: server\.runtime: required field is missing; "
                                             r"expected the runtime the hosts run, whose measurement profile the "
                                             r"suite reads: one of flare, llama-cpp, sglang, vllm, or a profile "
                                             r"file of the lab's own \(\./my-runtime\.yaml\)$"):
        load_inventory(write_file(tmp_path, text, "hosts.yaml"))


def test_what_may_be_asserted_of_a_quantity_is_the_profile_s_word() -> None:
    """`asserted_as` of the profile, not the quantity's name: KV capacity is no_regression in every shipped
    profile, an inventory may say the same of any quantity, and a gauge that replaces a per-start log
    source is read per start too."""
    for name in available_runtimes():
        assert load_profile(name).quantities["kv_pages"].asserted_as == "no_regression", name
    llama = resolve("llama-cpp", {"prompt_time_s": {"asserted_as": "no_regression"},
                                  "kv_pages": {"gauge": "llamacpp:kv_cells"}})
    assert check_expectations([Asserted(metric="prompt_time_s", kind="gain", request="B")], llama) == [
        (0, "kind", "prompt_time_s of runtime llama-cpp is always `no_regression`: expected no_regression, found gain")]
    assert (llama.quantities["kv_pages"].source, llama.quantities["kv_pages"].per) == ("gauge", "start")
    freed = resolve("llama-cpp", {"kv_pages": {"asserted_as": None}})
    assert check_expectations([Asserted(metric="kv_pages", kind="gain", request="*")], freed) == []
    added = resolve("llama-cpp", {"kv_cells": {"gauge": "llamacpp:kv_cells", "unit": "cells"}})
    assert added.quantities["kv_cells"].per == "request"   # a gauge of its own: read after each request


def test_a_shipped_profile_that_is_wrong_names_its_file_and_field(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text(
        "runtime: broken\ndescription: a profile with a column it does not declare\ncolumns: [hit_rate]\n"
        "quantities:\n  hits: {counter: h_total, unit: tokens}\n", encoding="utf-8")
    with pytest.raises(ProfileError, match=r"broken\.yaml:3: columns: not a quantity of the profile: hit_rate"):
        load_profile("broken", tmp_path)
    with pytest.raises(ProfileError, match=r"unknown runtime 'nothing'; expected a shipped profile \(broken\)"):
        load_profile("nothing", tmp_path)


def test_expectations_are_checked_against_what_the_runtime_exports() -> None:
    llama = resolve("llama-cpp")
    problems = check_expectations([Asserted(metric="readiness_wait_ns", kind="gain", request="B"),
                                   Asserted(metric="prompt_time_s", kind="gain", request="B"),
                                   Asserted(metric="kv_pages", kind="gain", request="*"),
                                   Asserted(metric="startup_s", kind="no_regression", request="B")], llama)
    assert problems == [
        (0, "metric", "runtime llama-cpp does not export 'readiness_wait_ns'; it exports: hits, misses, hit_rate, "
                      "prompt_time_s, client_time_s, kv_pages, startup_s"),
        (2, "kind", "kv_pages of runtime llama-cpp is always `no_regression`: expected no_regression, found gain"),
        (3, "request", 'startup_s is read once per start: expected request "*", found \'B\'')]


def _snapshot(values: dict[tuple[str, str], float], at: float) -> Snapshot:
    return Snapshot(host="cpu0", rank=0, taken_at=at, values=values)


def test_llama_server_figures_keep_fractional_seconds_and_whole_tokens() -> None:
    llama: Measurement = resolve("llama-cpp")
    before = _snapshot({("llamacpp:prompt_tokens_total", ""): 5000.0, ("llamacpp:prompt_tokens_cached_total", ""): 0.0,
                        ("llamacpp:prompt_seconds_total", ""): 1.40731}, 1.0)
    after = _snapshot({("llamacpp:prompt_tokens_total", ""): 5001.0,
                       ("llamacpp:prompt_tokens_cached_total", ""): 4999.0,
                       ("llamacpp:prompt_seconds_total", ""): 1.55312}, 2.0)
    figures = combine([delta(before, after, llama)], llama)
    assert (figures["hits"], figures["misses"]) == (4999, 1)
    assert figures["hit_rate"] == pytest.approx(4999 / 5000)
    assert figures["prompt_time_s"] == pytest.approx(0.14581)
    assert build_model(load_profile("llama-cpp")).names() == llama.names()


FLARE_PROFILE = (REPO / "fixtures/cache_qualify/config/runtimes/flare.yaml").read_text(encoding="utf-8")


def own_runtime(tmp_path: Path, profile: str, runtime: str = "./myruntime.yaml") -> Path:
    """The committed inventory beside a profile file of its own (`profile`, as myruntime.yaml), naming it."""
    write_file(tmp_path, profile, "myruntime.yaml")
    return write_file(tmp_path, edited(HOSTS_YAML, "  runtime: flare\n", f"  runtime: {runtime}\n"), "hosts.yaml")


def test_an_inventory_may_name_a_profile_file_of_its_own_beside_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The path is relative to the inventory (not the working directory); the profile is read as a shipped
    one is, with the inventory's overrides over it."""
    text = edited(FLARE_PROFILE, "runtime: flare\n", "runtime: myruntime\n")
    inventory = own_runtime(tmp_path, edited(text, "request: {max_tokens: 1, logprobs: 20}\n",
                                             "request: {max_tokens: 2}\n"))
    monkeypatch.chdir(REPO)
    model = load_inventory(inventory).measurement
    assert (model.runtime, model.columns) == ("myruntime", resolve("flare").columns)
    assert (model.request.max_tokens, model.request.logprobs) == (2, None)
    overridden = write_file(tmp_path, edited(inventory.read_text(), "builds:\n",
                                             "measurements:\n  hits: {counter: my_hits_total}\nbuilds:\n"),
                            "hosts.yaml")
    assert load_inventory(overridden).measurement.quantities["hits"].spec.counter == "my_hits_total"
    # --baseline/--candidate validate the file again with their builds: still beside the inventory
    builds = load_inventory(inventory).builds
    again = load_inventory(inventory, baseline=list(builds)[1], candidate=list(builds)[0])
    assert again.measurement.runtime == "myruntime"


@pytest.mark.parametrize(("profile", "runtime", "error", "message"), [
    (None, "./missing.yaml", InventoryError, r"hosts\.yaml:\d+: server\.runtime: no profile file "
                                            r"'\./missing\.yaml' \(looked for .*missing\.yaml\); a path is "
                                            r"relative to the inventory's directory$"),
    (None, "./myruntime", InventoryError, r"server\.runtime: expected a profile file ending in \.yaml, found "
                                         r"'\./myruntime'$"),
    (FLARE_PROFILE, "./myruntime.yaml", ProfileError, r"myruntime\.yaml:4: runtime: expected the file's name "
                                                     r"'myruntime', found 'flare' \(a copied profile is renamed "
                                                     r"inside too\)$"),
    ("runtime: myruntime\ndescription: d\nrequest: {logprobs: 50}\nquantities:\n  hits: {counter: h, unit: rows}\n",
     "./myruntime.yaml", ProfileError, r"myruntime\.yaml:3: request\.logprobs: expected a value less than or "
                                       r"equal to 20, found 50$"),
    ("runtime: myruntime\ndescription: d\nquantities:\n  hits: {counter: h, unit: rowz}\n", "./myruntime.yaml",
     ProfileError, r"myruntime\.yaml:4: quantities\.hits\.unit: unknown unit 'rowz'"),
    # a fraction's misspelt input: its own field, whether or not a column shows the fraction (without the
    # column the fraction was dropped silently, and a scenario asserting on it was blamed)
    *((f"runtime: myruntime\ndescription: d\n{columns}quantities:\n  hits: {{counter: h, unit: rows}}\n"
       "  misses: {counter: m, unit: rows}\n  hit_rate:\n    fraction: {part: hits, whole: [hits, missess]}\n",
       "./myruntime.yaml", ProfileError,
       rf"myruntime\.yaml:{line}: quantities\.hit_rate\.fraction\.whole\[1\]: not a quantity of the profile: "
       r"'missess' \(did you mean 'misses'\?\)")
      for columns, line in (("columns: [hit_rate]\n", 8), ("", 7))),
])
def test_a_profile_file_that_is_wrong_names_its_file_line_and_field(
        tmp_path: Path, profile: str | None, runtime: str, error: type[Exception], message: str) -> None:
    inventory = own_runtime(tmp_path, profile or "", runtime)
    with pytest.raises(error, match=message):
        load_inventory(inventory)


def test_an_unknown_runtime_offers_the_close_shipped_name_and_the_file_form(tmp_path: Path) -> None:
    inventory = own_runtime(tmp_path, "", "flair")
    with pytest.raises(InventoryError, match=r"server\.runtime: unknown runtime 'flair' \(did you mean 'flare'\?\); "
                                             r"expected a shipped profile .* \(`runtime: \./flair\.yaml`; "
                                             r"docs/runtimes\.md, \"Writing a profile\"\)$"):
        load_inventory(inventory)


@pytest.mark.slow
def test_a_lab_with_a_runtime_of_its_own_qualifies_without_touching_the_package(tmp_path: Path) -> None:
    """`pytest qualify --hosts <copy of hosts.yaml>` whose `server.runtime` is a profile file beside it (the
    flare profile under a name of the lab's): the simulated lab's hosts decide, and the plan records it."""
    profile = edited(edited(FLARE_PROFILE, "runtime: flare\n", "runtime: myruntime\n"),
                     "request: {max_tokens: 1, logprobs: 20}\n", "request: {max_tokens: 1}\n")
    write_file(tmp_path, profile, "myruntime.yaml")
    inventory = write_inventory(tmp_path, server={"runtime": "./myruntime.yaml"})
    scenario = small_scenario_option(tmp_path, "own-runtime")
    run = run_qualify(inventory, tmp_path / "reports", *scenario)
    outcome = runfolder.read_outcome(run.run_dir())
    assert outcome is not None and outcome.overall in ("pass", "fail") and not outcome.errors, run.output
    assert runfolder.read_plan(run.run_dir()).runtime == "myruntime"
    assert "test_row_cache[" in run.output, run.output
