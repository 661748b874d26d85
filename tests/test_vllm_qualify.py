"""A real vLLM qualified end to end: `pytest qualify` with `server.runtime: vllm` and no `measurements:`,
on the committed examples (examples/vllm*.yaml), over the local transport and over a real OpenSSH
sshd with strict host keys.

The server is vLLM 0.32.0's CPU build (`tests.support.vllm_build`: installed when missing, and these
tests FAIL when it cannot be), serving a seeded random-weight Llama of one layer made with
transformers (`tests.support.vllm_server`). A vLLM start costs most of a minute here, so the starts
are shared: one gate run of several candidates against one baseline without prefix caching
(caching on in blocks of 128; blocks of 32 with half the KV cache, the CPU build's smallest; the baseline against itself),
its candidates then decided against each other with `cache-qualify decide`, one replay of the shipped
Mooncake slice over sshd (the README's command: caching in blocks of 128 against none) and one run whose
candidate exits at start. The A/A is the gate run's (the baseline against itself); a copy of a caching
build in the replay would cost three starts and prove it again, and so would blocks of 32 there: their
predicted hits are vLLM's exactly one request at a time (tests/test_vllm_trace_predicted.py).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.examples import (
    adapt_example, assert_predicted_is_measured, assert_the_status_follows, banded_predictions, outcomes, ssh_edits,
)
from tests.support.labfixtures import REPO, QualifyRun, run_cli, run_qualify
from tests.support.vllm_server import vllm  # noqa: F401  (the fixture)

if TYPE_CHECKING:
    from tests.support.sshd import SshdInstance, SshdLab

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]

EXAMPLE = REPO / "examples" / "vllm.yaml"
RESEND = REPO / "examples" / "vllm-resend.yaml"
TRACE = REPO / "examples" / "vllm-trace.yaml"
EXAMPLE_MODEL = "/srv/models/tiny-llama"
EXAMPLE_PYTHON = "/opt/vllm/bin/python"
KV_1G = ["--kv-cache-memory-bytes", "1073741824"]
TOURNAMENT = {
    "prefix-caching-32-half-kv": {"description": "prefix caching in blocks of 32, half the KV cache", "flags": [
        "--enable-prefix-caching", "--block-size", "32", "--kv-cache-memory-bytes", "536870912"]},
    "no-prefix-caching-again": {"description": "the baseline again (A/A)", "flags": [
        "--no-enable-prefix-caching", *KV_1G]},
}

# three starts per arm and no more (each costs most of a minute, minutes on a loaded machine): enough
# for the hit rate, the KV cache and the A/A, which every start gives exactly
THREE_STARTS = ("--max-trials", "3")
TRACE_BAND = 0.02   # the vllm profile's emulator band: an open-loop replay's requests overlap

Inventory = Callable[..., Path]


def example_inventory(python: Path, model: Path, folder: Path, **edits: Any) -> Path:
    """examples/vllm.yaml as a lab runner would adapt it: the installed vLLM's python and the tiny model
    in place of the example's paths, a free port."""
    return adapt_example(EXAMPLE, folder, program=(EXAMPLE_PYTHON, python), model=(EXAMPLE_MODEL, model), **edits)


@pytest.fixture
def inventory(vllm: tuple[Path, Path], tmp_path: Path) -> Inventory:
    def make(**edits: Any) -> Path:
        return example_inventory(*vllm, tmp_path, **edits)
    return make


def qualify(inventory: Path, tmp_path: Path, *args: str) -> QualifyRun:
    return run_qualify(inventory, tmp_path / "reports", "--scenario", str(RESEND), *args, timeout_s=3000)


def verdicts(run: QualifyRun, arm: str, scenario: str = "vllm-resend") -> dict[str, dict[str, Any]]:
    """The verdicts of candidate `arm` on `scenario`, by (metric, request)."""
    listed = json.loads((run.run_dir() / f"verdicts-{scenario}.json").read_text(encoding="utf-8"))
    return {f"{v['metric']}[{v['request']}]": v for v in listed if v["arm"] == arm}


def check_prefill_gain(run: QualifyRun, arm: str) -> None:
    """The prefill time's gain is decided or not, on its own figures; no direction is required. The tiny
    model prefills 4,090 tokens in tens of ms, and on a loaded 2-core machine three starts often leave the
    gain inconclusive (p 0.26 and 0.81 seen, the means 0.053 s and 0.051 s apart by less than the stalls),
    and one clean-clone run showed the cached re-send slower at all three starts (B-again 63-79 ms against
    34-42 ms, a regression shown); the hit-rate gains are the decisive ones."""
    for request in ("A-again", "B-again"):
        verdict = verdicts(run, arm)[f"prefill_time_s[{request}]"]
        assert verdict["outcome"] in ("pass", "fail", "inconclusive"), verdict
        assert f"prefill_time_s on {request}" in verdict["reason"] and math.isfinite(verdict["p_value"]), verdict


def rows(run: QualifyRun, name: str) -> list[dict[str, str]]:
    with (run.run_dir() / name).open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


def samples_of(run: QualifyRun, metric: str, build: str, request: str | None = None) -> list[float]:
    return [float(r["value"]) for r in rows(run, "samples.csv") if r["metric"] == metric and r["build"] == build
            and r["host"] == "all" and (request is None or r["request"] == request)]


@pytest.fixture(scope="module")
def tournament(vllm: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> QualifyRun:
    """One gate run: prefix caching (blocks of 128), blocks of 32 with half the KV cache, and the
    baseline against itself, each against the baseline without prefix caching."""
    folder = tmp_path_factory.mktemp("vllm-tournament")
    path = example_inventory(*vllm, folder, builds=TOURNAMENT)
    return qualify(path, folder, "--candidate", "prefix-caching,prefix-caching-32-half-kv,no-prefix-caching-again",
                   *THREE_STARTS)


def test_prefix_caching_passes_the_hit_rate_and_prefill_time_gains(tournament: QualifyRun) -> None:
    assert tournament.returncode == 1, tournament.output   # the A/A and the half KV cache fail, as they must
    got = verdicts(tournament, "prefix-caching")
    for name in ("hit_rate[A-again]", "hit_rate[B-again]", "kv_pages[startup]"):
        assert got[name]["outcome"] == "pass", got[name]["reason"]
    check_prefill_gain(tournament, "prefix-caching")
    # measured, never voided; no figure NaN
    assert {t["outcome"] for t in rows(tournament, "trials.csv")} == {"ok"}
    values = [float(r["value"]) for r in rows(tournament, "samples.csv") if r["value"] not in ("",)]
    assert values and not any(math.isnan(v) for v in values)
    assert set(samples_of(tournament, "cached_tokens", "prefix-caching", "A-again")) == {3968}   # of 4,090
    assert set(samples_of(tournament, "cached_tokens", "no-prefix-caching", "A-again")) == {0}
    assert set(samples_of(tournament, "hit_rate", "no-prefix-caching", "A-again")) == {0}
    summary = (tournament.run_dir() / "summary.md").read_text(encoding="utf-8")
    assert "Prefill time" in summary and "Hit rate" in summary and "Evictions" not in summary


# the tokens each build's cache serves of a 4,090-token re-send, pinned above and in test_vllm_server.py:
# 31 whole blocks of 128, 127 of 32, none without caching (a first send is served nothing by any)
RESENT_CACHED = {"no-prefix-caching": 0, "prefix-caching": 3968, "prefix-caching-32-half-kv": 4064,
                 "no-prefix-caching-again": 0}


def test_each_builds_predicted_hit_rate_is_the_measured_one(tournament: QualifyRun) -> None:
    """Requests one at a time from a fresh start: the vllm-block emulator is exact, so per build and request
    the predicted hit rate (from the build's flags and each start's /metrics and log) equals the measured
    one, in verdicts.json, summary.md and JUnit, and every build's test_prediction passes."""
    assert_predicted_is_measured(tournament, "vllm-resend", {b: n / 4090 for b, n in RESENT_CACHED.items()})
    cases = tournament.testcases()
    props = {p.get("name"): p.get("value") for p in cases["test_prefix_cache[prefix-caching:hit_rate-gain[A-again]]"]
             .iter("property")}
    assert props["predicted_hit_rate"] == props["measured_hit_rate"] == f"{3968 / 4090:.6g}", props


def test_the_baseline_against_itself_passes_no_gain(tournament: QualifyRun) -> None:
    got = verdicts(tournament, "no-prefix-caching-again")
    gains = [v for v in got.values() if v["kind"] == "gain"]
    assert len(gains) == 4 and all(v["outcome"] != "pass" for v in gains), got
    assert "failed" in outcomes(tournament).values()


def test_half_the_kv_cache_fails_kv_non_regression(tournament: QualifyRun) -> None:
    kv = verdicts(tournament, "prefix-caching-32-half-kv")["kv_pages[startup]"]
    assert kv["outcome"] == "fail", kv["reason"]
    assert set(samples_of(tournament, "kv_pages", "prefix-caching-32-half-kv")) == {1_048_576}
    assert set(samples_of(tournament, "kv_pages", "no-prefix-caching")) == {2_097_152}


def test_blocks_of_32_serve_more_of_a_re_read_than_blocks_of_128(tournament: QualifyRun) -> None:
    # 4,090 tokens: 127 whole blocks of 32 against 31 of 128; the last partial block is computed
    assert set(samples_of(tournament, "cached_tokens", "prefix-caching-32-half-kv", "A-again")) == {4064}
    assert set(samples_of(tournament, "hits", "prefix-caching-32-half-kv", "B-again")) == {4064}
    assert set(samples_of(tournament, "hits", "prefix-caching", "B-again")) == {3968}


def test_a_server_that_exits_at_start_names_host_rank_status_and_its_log(inventory: Inventory,
                                                                          tmp_path: Path) -> None:
    bad = {"bad-flag": {"description": "a flag vLLM does not know", "flags": ["--no-such-flag"]}}
    run = qualify(inventory(builds=bad), tmp_path, "--candidate", "bad-flag", "--max-trials", "3")
    assert run.returncode == 1
    failure = run.testcases()["test_all_ranks_started[vllm-resend]"].find("failure")
    assert failure is not None, run.output
    text = (failure.get("message") or "") + (failure.text or "")
    assert "build 'bad-flag'" in text and "host cpu0 rank 0" in text, text
    assert "exit status 2" in text and "unrecognized arguments: --no-such-flag" in text, text


@pytest.fixture
def over_ssh(sshd_lab: SshdLab, sshd_host: SshdInstance, inventory: Inventory, tmp_path: Path) -> Path:
    """The example inventory with its host reached over a real sshd whose key is in a strict known_hosts."""
    return inventory(**ssh_edits(sshd_lab, sshd_host, tmp_path))


@pytest.mark.sshd
def test_the_mooncake_slice_replayed_over_a_real_sshd_decides_prefix_caching(over_ssh: Path,
                                                                              tmp_path: Path) -> None:
    """examples/vllm-trace.yaml as it is committed, with the README's command (the inventory's candidate):
    the shipped slice of Mooncake's conversation trace (1,000 records, blocks of 16 tokens) replayed open
    loop on its timestamps ten times faster, streamed, at a KV cache of 48 MiB (under a third of the
    slice's blocks, so eviction decides what is served), over a real sshd with strict host keys. Prefix
    caching in blocks of 128 passes the warm half's hit-rate gain against no caching and keeps the KV
    cache; without caching nothing is served.
    No time is asserted: the tiny model's prefill is milliseconds, which a loaded machine's stalls pass
    (the example says so)."""
    run = run_qualify(over_ssh, tmp_path / "reports", "--scenario", str(TRACE), *THREE_STARTS, timeout_s=3000)
    got = verdicts(run, "prefix-caching", "vllm-trace")
    for name in ("hit_rate[replay]", "kv_pages[startup]"):
        assert got[name]["outcome"] == "pass", got[name]["reason"]
    assert {t["outcome"] for t in rows(run, "trials.csv")} == {"ok"}
    warm = {build: samples_of(run, "hit_rate", build, "replay") for build in ("no-prefix-caching", "prefix-caching")}
    assert all(len(rates) == 3 for rates in warm.values()), warm
    assert set(warm["no-prefix-caching"]) == {0}
    # the slice's whole-block prefix hits with an unbounded cache are 21.2 % (docs/traces.md): no
    # bounded cache serves more of the warm half; 6,144 of the trace's blocks serve a few points
    assert all(0.03 < rate < 0.212 for build in warm if build != "no-prefix-caching" for rate in warm[build]), warm
    # the open loop's lateness and the streamed tokens' times (each chunk's token IDs: the server has no
    # tokenizer, so their text is empty) are one figure per start of every build, none NaN
    for figure in ("lateness_p99_s", "ttft_p50_s", "itl_p50_s"):
        for build in warm:
            values = samples_of(run, figure, build, "startup")
            assert len(values) == 3 and all(math.isfinite(v) and v >= 0 for v in values), (figure, build, values)
    summary = (run.run_dir() / "summary.md").read_text(encoding="utf-8")
    assert "vllm-trace" in summary and "Hit rate" in summary
    check_trace_predictions(run, warm)


def test_the_candidates_are_decided_against_each_other_from_the_run_folder(tournament: QualifyRun,
                                                                            tmp_path: Path) -> None:
    """The gate run's candidates decided against each other from its folder (`cache-qualify decide`, no
    more starts): blocks of 32 with half the KV cache against blocks of 128, on the same starts, each
    verdict's means those starts' (the re-send's hit rate is exact: 4,064 and 3,968 of 4,090 tokens, a
    2.3-point difference under the gain's half-prompt minimum; half the KV cache is a regression). (That an
    A/A pair decided from a run's folder does not pass is
    tests/test_decide.py::test_a_build_against_its_own_copy_does_not_pass, on the simulated lab.)"""
    pair = decide_pair_of(tournament, tmp_path, "prefix-caching", "prefix-caching-32-half-kv")
    assert pair["status"] == 1, pair
    hit, kv = pair["verdicts"]["hit_rate-gain[B-again]"], pair["verdicts"]["kv_pages-no_regression[startup]"]
    assert hit["outcome"] == "fail" and kv["outcome"] == "fail", (hit["reason"], kv["reason"])
    for verdict, metric, request in ((hit, "hit_rate", "B-again"), (kv, "kv_pages", None)):
        assert verdict["trials_baseline"] == verdict["trials_candidate"] == 3, verdict
        assert (verdict["baseline_mean"], verdict["candidate_mean"]) == pytest.approx(
            tuple(sum(samples_of(tournament, metric, b, request)) / 3
                  for b in ("prefix-caching", "prefix-caching-32-half-kv"))), verdict


def decide_pair_of(run: QualifyRun, tmp_path: Path, baseline: str, candidate: str) -> dict[str, Any]:
    """`cache-qualify decide` on the run's folder: its JSON, its verdicts by id, and its exit status."""
    out = tmp_path / f"{candidate}-vs-{baseline}.json"
    done = run_cli("decide", str(run.run_dir()), "--baseline", baseline, "--candidate", candidate, "--json", str(out))
    assert done.returncode in (0, 1) and out.exists(), done.stdout + done.stderr
    got = json.loads(out.read_text(encoding="utf-8"))
    return {**got, "status": done.returncode, "verdicts": {v["id"]: v for v in got["verdicts"]}}


def check_trace_predictions(run: QualifyRun, warm: dict[str, list[float]]) -> None:
    """Each start's warm half predicted by the vllm-block emulator (every prompt sent, the first half
    included, one at a time from an empty cache) beside its measured hit rate: open loop, requests
    overlap, so the prediction is the centre of the profile's band (docs/emulation.md), which every start
    of every build is within, each check agreeing with the starts it counts (`banded_predictions`), and the
    run passes. This holds however far a loaded server lags the schedule: the lag queues requests, which
    hold no KV blocks till scheduled, and vLLM schedules a bounded batch, 2 output tokens a request, so the
    blocks taken from the cached prefixes stay a few thousand tokens of the 98,304 (the starts measured
    within 0.2 points of the 2-point band while the replay of 33 s of schedule took 35 to 40 s). Not so
    with two clients on two llama-server slots (test_llama_qualify.py), where timing picks the slot."""
    assert banded_predictions(run, "vllm-trace", warm, TRACE_BAND) == set()
    assert_the_status_follows(run, "vllm-trace", set())
    listed = json.loads((run.run_dir() / "verdicts.json").read_text(encoding="utf-8"))["predictions"]["vllm-trace"]
    got = {c["build"]: c for c in listed}
    # of the warm half's 206,749 prompt tokens, one at a time: 20,096 cached in blocks of 128, 22,688 in blocks
    # of 32 (the decode steps' blocks counted), as docs/emulation.md and the example say
    assert {build: check["predicted"] for build, check in got.items()} == {
        "no-prefix-caching": 0, "prefix-caching": 20_096 / 206_749}, got
    cases = run.testcases()
    for build in warm:
        props = {p.get("name"): p.get("value") for p in cases[f"test_prediction[vllm-trace:{build}]"].iter("property")}
        assert props["predicted_hit_rate[replay]"] == f"{got[build]['predicted']:.6g}", props
