"""Tests of cache_qualify.config.scenario: the shipped scenarios and malformed scenario files."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache_qualify.errors import ScenarioError
from cache_qualify.config.profiles import resolve
from cache_qualify.methods import NAMES
from cache_qualify.config.scenario import available_scenarios, check_against, find_scenario, load_scenario
from cache_qualify.stats.scenario_assertions import assertions_for
from tests.support.labfixtures import REPO, edited, write_file


# Lines: 1 name, 2 description, 3 corpus, 4 default, 5 server_flags, 6 requests, 7 A, 8 A2,
# 9 B, 10 trials, 11 expectations, 12 gain on A2, 13 no_regression on A, 14 kv_pages.
BASE = """\
name: mini
description: a small valid scenario
corpus:
  default: true
server_flags: [--embedding-table-cache-size, 1G]
requests:
  - {name: A, start: 0, stop: 100}
  - {name: A2, start: 0, stop: 100, new_start: 1}
  - {name: B, start: 200, stop: 300, repeat: 2}
trials: 4
expectations:
  - {metric: hit_rate, request: A2, kind: gain, min_effect: 0.02}
  - {metric: hit_rate, request: A, kind: no_regression, margin: 0.05}
  - {metric: kv_pages, kind: no_regression, margin: 0.02}
"""


def write(tmp_path: Path, text: str, name: str = "mini.yaml") -> Path:
    return write_file(tmp_path, text, name)


def edit(old: str, new: str) -> str:
    return edited(BASE, old, new)


def test_base_scenario_defaults(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, BASE))
    assert (scenario.concurrency, scenario.test, scenario.alpha, scenario.block_size) == (1, "welch", 0.01, 1)
    assert (scenario.request.max_tokens, scenario.request.logprobs, scenario.request.stream) == (1, None, False)
    # left out, `logprobs` is the runtime profile's: the RowCache study's 20 on flare, none on llama-server
    assert scenario.request.over(resolve("flare").request).logprobs == 20
    assert scenario.request.over(resolve("llama-cpp").request).logprobs is None
    given = load_scenario(write(tmp_path, BASE + "request: {logprobs: null, max_tokens: 2}\n"))
    assert (given.request.over(resolve("flare").request).logprobs, given.request.max_tokens) == (None, 2)
    assert scenario.corpus.id_range == (3, 127_999)
    assert scenario.first_reads() == ["A", "B"]
    assert scenario.expectations[2].request == "*"
    assert (scenario.prefix_reuse, scenario.max_invalid_trials) == ("forbid", 2)
    # the scenario's three expectations, then the bad-start check (fewer bad starts are better)
    assert [(a.kind, a.higher_is_better) for a in assertions_for(scenario, resolve("flare"))] == [
        ("gain", True), ("no_regression", True), ("no_regression", True), ("no_excess", False)]


MALFORMED: list[tuple[str, str, str, str, int | None]] = [
    ("missing-description", "description: a small valid scenario\n", "",
     r"mini\.yaml:1: description: required field is missing", 1),
    ("gain-on-first-read", "request: A, kind: no_regression, margin: 0.05",
     "request: A, kind: gain, min_effect: 0.01",
     r"expectations\[1\]\.kind: the hit rate of a first read \(A\) is set by cold misses: expected "
     r"no_regression, found gain", 13),
    ("gain-on-all-requests", "request: A2, kind: gain", 'request: "*", kind: gain',
     r"expectations\[0\]\.kind: the hit rate of a first read \(A, B\)", 12),
    ("unknown-request", "request: A2,", "request: A3,",
     r"expectations\[0\]\.request: unknown request 'A3' \(did you mean 'A'\?\); expected \"\*\" or "
     r"one of: A, A2, B", 12),
    ("gain-without-min-effect", "kind: gain, min_effect: 0.02", "kind: gain",
     r"expectations\[0\]\.min_effect: a gain needs `min_effect`", 12),
    ("gain-with-margin", "kind: gain, min_effect: 0.02", "kind: gain, min_effect: 0.02, margin: 0.1",
     r"expectations\[0\]\.margin: `margin` belongs to no_regression", 12),
    ("no-regression-without-margin", "kind: no_regression, margin: 0.05", "kind: no_regression",
     r"expectations\[1\]\.margin: a no_regression needs `margin`", 13),
    ("margin-not-a-fraction", "margin: 0.05", "margin: 5",
     r"expectations\[1\]\.margin: expected a share of the baseline >= 0 and below 1 \(100 %\), found 5", 13),
    ("margin-in-seconds", "margin: 0.05", "margin: 0.05 s",
     r"expectations\[1\]\.margin: a margin is a share of the baseline: a fraction such as 0.02 or a per cent "
     r"such as '2 %', found '0.05 s'", 13),
    ("min-effect-unknown-unit", "min_effect: 0.02", "min_effect: 2 points",
     r"expectations\[0\]\.min_effect: expected a number with an optional unit \(ns, us, ms, s, .*, pp, %\), "
     r"such as '0.2 s' or '2 pp', found '2 points'", 12),
    ("bad-metric-name", "{metric: hit_rate, request: A,", "{metric: Hit-Rate, request: A,",
     r"expectations\[1\]\.metric: expected a quantity name of lower-case letters, digits and '_' "
     r"\(hit_rate, prompt_time_s\), found 'Hit-Rate'", 13),
    ("prefix-reuse-unknown", "expectations:", "prefix_reuse: allow\nexpectations:",
     r"prefix_reuse: expected 'forbid' or 'measure', found 'allow'", 11),
    ("stop-before-start", "start: 200, stop: 300", "start: 300, stop: 200",
     r"requests\[2\]\.stop: expected stop > start \(300\), found 200", 9),
    ("short-new-start", "{name: A2, start: 0, stop: 100, new_start: 1}", "{name: A2, start: 0, stop: 10, new_start: 1}",
     r"requests\[1\]\.new_start: a new start replaces 16 tokens: expected an excerpt longer than 16", 8),
    ("duplicate-request", "{name: B,", "{name: A2,", r"requests\[2\]\.name: duplicate request name 'A2'", 9),
    ("repeat-zero", "repeat: 2", "repeat: 0", r"requests\[2\]\.repeat: expected a value greater than or equal to 1", 9),
    ("two-corpus-sources", "  default: true\n", "  default: true\n  tokens: t.npy\n",
     r"corpus: expected exactly one of `default: true`, `tokens` or `text`, found default, tokens", 3),
    ("no-corpus-source", "  default: true\n", "  id_range: [3, 10]\n",
     r"corpus: expected exactly one of .*found none", 3),
    ("text-without-tokenizer", "  default: true\n", "  text: corpus.txt\n",
     r"corpus\.tokenizer: `text` and `tokenizer` go together; `tokenizer` is missing", 3),
    ("tokens-bad-suffix", "  default: true\n", "  tokens: corpus.txt\n",
     r"corpus\.tokens: expected a \.npy or \.json file, found 'corpus\.txt'", 4),
    ("tokens-file-missing", "  default: true\n", "  tokens: missing.npy\n",
     r"corpus\.tokens: file not found: .*missing\.npy", 4),
    ("bad-id-range", "  default: true\n", "  default: true\n  id_range: [10, 3]\n",
     r"corpus\.id_range: expected \[low, high\] with 0 <= low <= high, found \[10, 3\]", 5),
    ("bad-test", "trials: 4\n", "trials: 4\ntest: ttest\n",
     rf":11: test: expected {', '.join(repr(n) for n in NAMES[:-1])} or {NAMES[-1]!r}, found 'ttest'", 11),
    ("alpha-too-big", "trials: 4\n", "trials: 4\nalpha: 0.5\n", r"alpha: expected a value less than 0\.5", 11),
    ("one-trial", "trials: 4", "trials: 1", r":10: trials: expected a value greater than or equal to 2", 10),
    ("max-trials-below-trials", "trials: 4\n", "trials: 4\nmax_trials: 3\n",
     r"max_trials: expected max_trials >= trials \(4\), found 3", 11),
    ("spending-rho-zero", "trials: 4\n", "trials: 4\nspending_rho: 0\n",
     r":11: spending_rho: expected a value greater than 0", 11),
    ("flags-not-strings", "server_flags: [--embedding-table-cache-size, 1G]", "server_flags: [--x, 1]",
     r"server_flags\[1\]: expected a string, found 1", 5),
    ("no-expectations", BASE[BASE.index("expectations:"):], "expectations: []\n",
     r"expectations: expected at least 1 item, found none", 11),
    ("unknown-key", "trials: 4\n", "trials: 4\ntrails: 5\n",
     r"trails: unknown key \(did you mean 'trials'\?\)", 11),
    ("name-not-file-name", "name: mini", "name: other", r":1: name: expected the file's name 'mini', found 'other' \(a copied scenario is renamed inside "
     r"too: `name: mini`\)", 1),
    ("yaml-syntax", "trials: 4\n", "trials: 4\n\tconcurrency: 2\n",
     r"mini\.yaml:11: YAML syntax error: .*found character '\\t' that cannot start any token", 11),
]


@pytest.mark.parametrize(("old", "new", "match", "line"), [case[1:] for case in MALFORMED],
                         ids=[case[0] for case in MALFORMED])
def test_malformed_scenario(tmp_path: Path, old: str, new: str, match: str, line: int | None) -> None:
    with pytest.raises(ScenarioError, match=match) as info:
        load_scenario(write(tmp_path, edit(old, new)))
    assert "\n" not in str(info.value)
    if line is not None:
        assert info.value.line == line


def test_corpus_files_resolve_next_to_the_scenario(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "docs.txt").write_text("some text", encoding="utf-8")
    (tmp_path / "data" / "tokenizer.json").write_text("{}", encoding="utf-8")
    text = edit("  default: true\n", "  text: data/docs.txt\n  tokenizer: data/tokenizer.json\n")
    scenario = load_scenario(write(tmp_path, text))
    assert scenario.corpus.text is not None
    assert scenario.corpus_path(scenario.corpus.text) == tmp_path / "data" / "docs.txt"


def test_tensor_parallel_must_match_the_group(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, edit("trials: 4\n", "trials: 4\ntensor_parallel: 4\n")))
    scenario.check_tensor_parallel(4)
    with pytest.raises(ScenarioError, match=r"mini\.yaml: tensor_parallel: expected a host group of 4 hosts, "
                       r"found group 'default' with 3"):
        scenario.check_tensor_parallel(3)


def test_find_scenario() -> None:
    assert find_scenario("reread-1g") == REPO / "fixtures" / "cache_qualify" / "config" / "scenarios" / "reread-1g.yaml"
    with pytest.raises(ScenarioError, match=r"--scenario: unknown scenario 'reread-1gg' \(did you mean "
                       r"'reread-1g'\?\); available: long-prompt, reread-1g, reread-4g, trace-replay$"):
        find_scenario("reread-1gg")
    with pytest.raises(ScenarioError, match=r"--scenario: unknown scenario 'soak'; available: long-prompt, "):
        find_scenario("soak")


def test_find_scenario_accepts_a_path(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    assert find_scenario(str(path)) == path


REPORT_SEQUENCE = [("A", 1000, 21000, None), ("A-new-start", 1000, 21000, 1), ("B", 60000, 120000, None),
                   ("B-new-start", 60000, 120000, 2), ("A-third-read", 1000, 21000, 3)]


@pytest.mark.parametrize(("name", "size"), [("reread-1g", "1G"), ("reread-4g", "4G")])
def test_reread_scenarios_are_the_reports_sequence(name: str, size: str) -> None:
    scenario = load_scenario(find_scenario(name))
    assert [(r.name, r.start, r.stop, r.new_start) for r in scenario.requests] == REPORT_SEQUENCE
    flags = scenario.server_flags
    assert flags[flags.index("--embedding-table-cache-size") + 1] == size
    assert flags[flags.index("--prefix-cache-memory") + 1] == "0"
    assert scenario.corpus.default and scenario.corpus.id_range == (3, 127_999)
    assert (scenario.request.max_tokens, scenario.request.logprobs) == (1, 20)
    kv = [e for e in scenario.expectations if e.metric == "kv_pages"]
    assert [e.kind for e in kv] == ["no_regression"]
    first = {(e.request, e.kind) for e in scenario.expectations if e.metric == "hit_rate"}
    assert {("A", "no_regression"), ("B", "no_regression")} <= first


def test_reread_1g_asks_for_the_reports_gains() -> None:
    scenario = load_scenario(find_scenario("reread-1g"))
    gains = {(e.metric, e.request) for e in scenario.expectations if e.kind == "gain"}
    assert gains == {(m, r) for m in ("hit_rate", "readiness_wait_ns") for r in ("B-new-start", "A-third-read")}
    assert all(a.min_effect > 0 for a in assertions_for(scenario, resolve("flare")) if a.kind == "gain")


def test_long_prompt_fits_and_rereads() -> None:
    scenario = load_scenario(find_scenario("long-prompt"))
    assert scenario.tensor_parallel is None  # runs on the three-host simulated lab
    assert scenario.first_reads() == ["body"]
    assert "24 GiB" in scenario.description and "500k" in scenario.description


def test_all_shipped_scenarios_load_and_fit_the_default_corpus() -> None:
    from cache_qualify.workload.corpus import default_corpus

    tokens = len(default_corpus())
    from cache_qualify.workload.trace import scenario_trace

    assert available_scenarios() == ["long-prompt", "reread-1g", "reread-4g", "trace-replay"]
    for name in available_scenarios():
        scenario = load_scenario(find_scenario(name))
        assert scenario.name == name
        assert scenario.corpus.default
        if scenario.trace is not None:   # its prompts are cut from the corpus and stay in its id range
            low, high = scenario.corpus.id_range
            assert all(low <= t <= high for r in scenario_trace(scenario).requests for t in r.prompt), name
        else:
            assert max(r.stop for r in scenario.requests) <= tokens, name


RUNTIME_PROBLEMS = [
    ("unknown", "{metric: hit_rate, request: A,", "{metric: hitrate, request: A,",
     r"expectations\[1\]\.metric: runtime flare does not export 'hitrate' \(did you mean 'hit_rate'\?\); it "
     r"exports: hits, misses, "
     r"evictions, .*readiness_wait_ns, client_time_s, kv_pages, startup_s$"),
    ("no-direction", "{metric: hit_rate, request: A, kind: no_regression, margin: 0.05}",
     "{metric: capacity_rows, request: A, kind: no_regression, margin: 0.05}",
     r"expectations\[1\]\.metric: capacity_rows of runtime flare has no direction \(neither higher nor lower "
     r"is better\), so it cannot be asserted"),
    ("min-effect-of-another-kind", "min_effect: 0.02}", "min_effect: 0.2 s}",
     r"expectations\[0\]\.min_effect: hit_rate: a difference of a quantity in fraction is in pp \(percentage "
     r"points\), found 's'"),
    ("bare-min-effect-implausible", "{metric: hit_rate, request: A2, kind: gain, min_effect: 0.02}",
     "{metric: readiness_wait_ns, request: A2, kind: gain, min_effect: 0.2}",
     r"expectations\[0\]\.min_effect: readiness_wait_ns is recorded in ns: a bare 0.2 is 0.2 ns, far below any "
     r"wait a start shows; write the unit, e.g. '0.2 s'"),
    ("bare-fraction-implausible", "min_effect: 0.02}", "min_effect: 2}",
     r"expectations\[0\]\.min_effect: hit_rate is recorded in fraction: a bare 2 is 2 x 100 percentage points of "
     r"a fraction; write the unit, e.g. '2 pp'"),
    ("per-start-on-a-request", "{metric: hit_rate, request: A, kind: no_regression, margin: 0.05}",
     "{metric: startup_s, request: A, kind: no_regression, margin: 0.05}",
     r"expectations\[1\]\.request: startup_s is read once per start: expected request \"\*\", found 'A'"),
    # what the profile says of the KV cache's size, not a rule of the scenario file
    ("gain-on-kv-pages", "{metric: kv_pages, kind: no_regression, margin: 0.02}",
     "{metric: kv_pages, kind: gain, min_effect: 10}",
     r"expectations\[2\]\.kind: kv_pages of runtime flare is always `no_regression`: expected no_regression, "
     r"found gain"),
    ("kv-pages-per-request", "{metric: kv_pages, kind", "{metric: kv_pages, request: A, kind",
     r"expectations\[2\]\.request: kv_pages is read once per start: expected request \"\*\", found 'A'"),
]


@pytest.mark.parametrize(("old", "new", "message"), [p[1:] for p in RUNTIME_PROBLEMS],
                         ids=[p[0] for p in RUNTIME_PROBLEMS])
def test_a_scenario_is_checked_against_the_runtime_before_any_lab_time(tmp_path: Path, old: str, new: str,
                                                                       message: str) -> None:
    scenario = load_scenario(write(tmp_path, edit(old, new)))   # the file alone is valid
    with pytest.raises(ScenarioError, match=r"mini\.yaml:\d+: " + message):
        check_against(scenario, resolve("flare"))
    check_against(load_scenario(write(tmp_path, BASE)), resolve("flare"))


@pytest.mark.parametrize(("metric", "written", "recorded"), [
    ("hit_rate", "2 pp", 0.02), ("hit_rate", "0.02", 0.02),
    ("readiness_wait_ns", "0.2 s", 2e8), ("readiness_wait_ns", "200 ms", 2e8), ("readiness_wait_ns", "2.0e+8", 2e8),
    ("readiness_wait_ns", "2.0e+8 ns", 2e8), ("client_time_s", "150 ms", 0.15)])
def test_a_min_effect_is_written_in_the_unit_people_read_or_the_recorded_one(
        tmp_path: Path, metric: str, written: str, recorded: float) -> None:
    text = edit("{metric: hit_rate, request: A2, kind: gain, min_effect: 0.02}",
                f"{{metric: {metric}, request: A2, kind: gain, min_effect: {written}}}")
    scenario = load_scenario(write(tmp_path, text))
    check_against(scenario, resolve("flare"))
    [gain] = [a for a in assertions_for(scenario, resolve("flare")) if a.kind == "gain"]
    assert gain.min_effect == pytest.approx(recorded)


def test_a_margin_is_a_fraction_or_a_per_cent_of_the_baseline(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, edit("margin: 0.05}", "margin: 5 %}")))
    assert [a.margin for a in assertions_for(scenario, resolve("flare")) if a.kind == "no_regression"] == [pytest.approx(0.05), 0.02]


def test_forbidding_prefix_reuse_needs_a_runtime_that_reports_cached_tokens(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, BASE))
    blind = resolve("flare").model_copy(update={"prefix_cached": None})
    with pytest.raises(ScenarioError, match=r"prefix_reuse: runtime flare names no response field of cached "
                                            r"prompt tokens .*use `prefix_reuse: measure`"):
        check_against(scenario, blind)
    measured = scenario.model_copy(update={"prefix_reuse": "measure"})
    check_against(measured, blind)
    model = resolve("flare").for_prefix_reuse("measure")
    assert model.quantities["cached_tokens"].spec.response == "usage.prompt_tokens_details.cached_tokens"
    assert "cached_tokens" not in resolve("flare").for_prefix_reuse("forbid").quantities


def test_a_unit_checked_against_the_runtime_names_the_file_and_line(tmp_path: Path) -> None:
    """A min_effect in a unit of another kind than its quantity's is found only against the runtime's
    profile, after loading: the error names the line all the same (before: file and field only)."""
    scenario = load_scenario(write(tmp_path, edit("min_effect: 0.02}", "min_effect: 0.2 s}")))
    with pytest.raises(ScenarioError, match=r"mini\.yaml:12: expectations\[0\]\.min_effect: "):
        check_against(scenario, resolve("flare"))
