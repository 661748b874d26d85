"""`cache-qualify bench-harness` and `bench-lifecycle` run on a simulated lab and print well-formed figures
(no timing thresholds)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.bench_forward import forwarded_lab
from tests.support.labfixtures import inventory_port, run_cli, wait_no_sim_processes, write_inventory
from tests.support.sshd import SshdLab

NUMBER = r"\d+(?:\.\d+)?"
REQUESTS = ("A", "A-new-start", "B", "B-new-start", "A-third-read")


def timed_lab(tmp_path: Path) -> Path:
    """The simulated lab with the calibrated client latency: the benchmarks' figures are about time."""
    return write_inventory(tmp_path, client_latency=True)


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("bench-harness", *args)


@pytest.mark.slow
def test_prints_snapshot_time_and_overhead_share_per_request(tmp_path: Path) -> None:
    inventory = timed_lab(tmp_path)
    done = bench("--hosts", str(inventory), "--passes", "1", "--snapshots", "5")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    header = re.search(r"^bench-harness: build set4, scenario reread-1g, 3 hosts, port (\d+)$", out, re.M)
    assert header, out
    assert re.search(rf"^snapshot of 3 hosts: median {NUMBER} ms, p90 {NUMBER} ms over 5 \(target < 50 ms\); "
                     rf"one unparsed GET of one host: median {NUMBER} ms; ratio {NUMBER}x$", out, re.M), out
    for request in REQUESTS:
        row = re.search(rf"^{re.escape(request)} +(?:{NUMBER} +){{5}}({NUMBER}) %$", out, re.M)
        assert row, (request, out)
    sequence = re.search(rf"^sequence: harness ({NUMBER}) ms / requests ({NUMBER}) ms = ({NUMBER}) %; of one "
                         rf"trial \(({NUMBER}) s, start included\) = ({NUMBER}) % \(target < 2 %\)$", out, re.M)
    assert sequence, out
    harness, requests, share = (float(sequence.group(i)) for i in (1, 2, 3))
    assert share == round(100 * harness / requests, 2) or abs(share - 100 * harness / requests) < 0.01
    assert float(sequence.group(4)) * 1000 > requests  # a trial includes its requests
    # a private port: nothing of the benchmark left behind, and not the committed inventory's port
    port = int(header.group(1))
    assert wait_no_sim_processes(port) == []


@pytest.mark.slow
def test_json_output_has_consistent_figures(tmp_path: Path) -> None:
    inventory = timed_lab(tmp_path)
    done = bench("--hosts", str(inventory), "--passes", "1", "--snapshots", "3", "--json", "--build", "two_choice")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["build"] == "two_choice" and result["snapshot"]["hosts"] == 3
    assert [r["request"] for r in result["requests"]] == list(REQUESTS)
    for r in result["requests"]:
        parts = r["snapshots_s"] + r["deltas_s"] + r["write_s"]
        assert r["harness_s"] == parts and r["share"] == parts / r["request_s"] and r["request_s"] > 0
    assert result["share_of_trial"] == result["harness_s"] / result["trial_s"]
    assert result["snapshot"]["ratio"] == result["snapshot"]["median_s"] / result["snapshot"]["get_median_s"]
    assert wait_no_sim_processes(result["port"]) == []


def test_missing_inventory_is_a_clear_error(tmp_path: Path) -> None:
    done = bench("--hosts", str(tmp_path / "nowhere.yaml"))
    assert done.returncode == 2
    assert re.search(r"cache-qualify: error: .*nowhere\.yaml", done.stderr), done.stderr


def lifecycle(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("bench-lifecycle", *args)


@pytest.mark.slow
def test_lifecycle_splits_trials_by_phase_and_adds_up(tmp_path: Path) -> None:
    """Well-formed figures only (speed is judged by running the benchmark): the phases of each
    trial, its overhead as their sum without the requests, and the ratio to the ranks' setup."""
    done = lifecycle("--hosts", str(timed_lab(tmp_path)), "--trials", "2", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["build"], result["scenario"], result["target_s"]) == ("set4", "reread-1g", 1.0)
    assert [t["trial"] for t in result["trials"]] == [0, 1]
    for t in result["trials"]:
        phases = [t[k] for k in ("drop_s", "start_s", "ready_s", "requests_s", "stop_s")]
        assert all(p > 0 for p in phases), t
        assert t["overhead_s"] == pytest.approx(sum(phases) - t["requests_s"])
        # every rank listened before rank 0 answered ready, and its log says when
        assert 0 < t["rank_setup_s"] < t["start_s"] + t["ready_s"] + 1.0
        assert t["ratio"] == pytest.approx(t["overhead_s"] / t["rank_setup_s"])


@pytest.mark.slow
def test_lifecycle_prints_a_row_per_trial_and_the_medians(tmp_path: Path) -> None:
    done = lifecycle("--hosts", str(timed_lab(tmp_path)), "--trials", "1", "--build", "two_choice")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(rf"^bench-lifecycle: build two_choice, scenario reread-1g, 3 hosts, 1 trial\(s\); "
                     rf"machine load {NUMBER} \(1-minute average, \d+ CPUs\)$", out, re.M), out
    for label in ("1", "median"):
        assert re.search(rf"^{label} +(?:{NUMBER} +){{7}}{NUMBER}x$", out, re.M), out
    assert re.search(rf"^lifecycle overhead per trial: {NUMBER} s \(target <= 1 s.*\); beyond the ranks' own "
                     rf"setup: -?{NUMBER} s$", out, re.M), out


@pytest.mark.slow
@pytest.mark.sshd
def test_reports_the_forwarded_routes_cost_against_direct_gets(sshd_lab: SshdLab, tmp_path: Path) -> None:
    inventory, instances = forwarded_lab(sshd_lab, tmp_path)
    try:
        done = bench("--hosts", str(inventory), "--passes", "1", "--snapshots", "5")
    finally:
        for instance in instances:
            instance.stop()
    assert done.returncode == 0, done.stderr
    out = done.stdout
    line = re.search(rf"^HTTP route: ssh \(a local port forwarded over each host's SSH connection; every figure "
                     rf"above went through it\); one GET of rank 0's /metrics: median ({NUMBER}) ms forwarded, "
                     rf"({NUMBER}) ms direct: ([+-]{NUMBER}) ms per exchange$", out, re.M)
    assert line, out
    forwarded, direct, extra = (float(line.group(i)) for i in (1, 2, 3))
    assert abs(extra - (forwarded - direct)) < 0.02
    share = re.search(rf"^forward: 15 exchanges per trial x ({NUMBER}) ms = ({NUMBER}) ms of one trial "
                      rf"\(({NUMBER}) s\) = ({NUMBER}) % \(target < 2 %\)$", out, re.M)
    assert share, out
    per, total, trial, percent = (float(share.group(i)) for i in (1, 2, 3, 4))
    # printed rounded: `per` to 0.01 ms (15 x 0.005 off at most), `total` to 0.1 ms, `trial` to 0.01 s and
    # `percent` to 0.01 (each half a unit off at most), so the share is checked against the range they allow
    assert abs(total - 15 * per) <= 0.126
    low, high = (total - 0.05) / (10 * (trial + 0.005)), (total + 0.05) / (10 * (trial - 0.005))
    assert low - 0.005 <= percent <= high + 0.005, (low, percent, high)
    assert wait_no_sim_processes(inventory_port(inventory)) == []


@pytest.mark.slow
def test_bench_replay_prints_both_loops_lateness_and_their_ratio(tmp_path: Path) -> None:
    inventory = timed_lab(tmp_path)
    done = run_cli("bench-replay", "--hosts", str(inventory), "--requests", "40", "--rate", "50")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(rf"bench-replay: build set4, 40 streamed requests at 50/s, 16-token prompts; "
                        rf"load average {NUMBER} \(after the open loop\)", lines[0]), lines
    late = rf"lateness p50 ({NUMBER}) ms, p99 ({NUMBER}) ms, max ({NUMBER}) ms; 0 errors"
    fast = re.fullmatch(rf"open loop \(trials\.replay\): {late} \(target p99 <= 10 ms: (met|missed)\)", lines[1])
    assert re.fullmatch(rf"open loop: end-to-end p50 {NUMBER} ms, client CPU {NUMBER} ms per request"
                        rf"(, {NUMBER} ms per request waiting for a CPU)?", lines[2]), lines
    slow = re.fullmatch(rf"naive sequential loop: {late}", lines[3])
    assert fast and slow, lines
    for match in (fast, slow):
        p50, p99, most = (float(match.group(i)) for i in (1, 2, 3))
        assert p50 <= p99 <= most
    assert (fast.group(4) == "met") == (float(fast.group(2)) <= 10)
    ratio = re.fullmatch(rf"ratio of p99s \(naive / open loop\): ({NUMBER})x", lines[4])
    assert ratio, lines
    assert float(ratio.group(1)) == pytest.approx(float(slow.group(2)) / float(fast.group(2)), rel=0.05, abs=0.06)
