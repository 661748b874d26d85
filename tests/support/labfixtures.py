"""Simulated labs for the suite's own tests: inventories derived from the committed hosts.yaml.

Each test gets its own copy with a free server port, its own run folder on
the "hosts" and absolute paths, so tests can run side by side (and beside a
lab runner using the committed file) without sharing a port or a lock. Also:
a short scenario for tests about lifecycle rather than figures, running the
real `pytest qualify` in a subprocess, and finding emulated-server processes in
the process table.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cache_qualify.lab import control as lab
from tests.support.waiting import NotInTime, wait_for

REPO = Path(__file__).resolve().parents[2]
SIM_ADDRESSES = ("127.0.0.11", "127.0.0.12", "127.0.0.13")


def free_port(addresses: Sequence[str] = SIM_ADDRESSES) -> int:
    """A TCP port free on every address (probed, then released)."""
    return lab.free_port(addresses)


def write_file(folder: Path, text: str, name: str) -> Path:
    """`text` written to `folder/name` (a config file under test)."""
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def edited(base: str, old: str, new: str) -> str:
    """`base` with its first `old` replaced (which must be there: a test that edits nothing proves nothing)."""
    assert old in base, old
    return base.replace(old, new, 1)


def committed_inventory() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "hosts.yaml").read_text(encoding="utf-8"))
    return data


# The calibrated noise's client latency (0.15 s a request, 0.75 s a trial) is really slept by rank 0
# and moves nothing but the client time, which no verdict reads; every other draw (waits, bad starts,
# KV pages) comes from its own stream of the start's seed, so a test's samples and decisions are the
# same without it. Tests about time (the calibration's figures, the lifecycle benchmark) keep it.
NO_CLIENT_LATENCY = ("--sim-latency-s", "0", "--sim-latency-sd-s", "0")


def write_inventory(tmp_path: Path, *, name: str = "hosts.yaml", hosts: list[dict[str, Any]] | None = None,
                    groups: list[dict[str, Any]] | None = None, ssh: Mapping[str, Any] | None = None,
                    server: Mapping[str, Any] | None = None, builds: Mapping[str, Mapping[str, Any]] | None = None,
                    baseline: str | None = None, candidate: str | None = None, noise: str | None = None,
                    client_latency: bool = False, sim_flags: Sequence[str] = ()) -> Path:
    """An inventory like the committed one with a free port, its own run folder and absolute paths;
    `noise` names the emulated server's noise profile of every build (default: the calibrated one).
    The profile's client latency is left out unless `client_latency` (see NO_CLIENT_LATENCY);
    `sim_flags` go to every build's emulated server."""
    data = committed_inventory()
    addresses = [h["address"] for h in (hosts or data["hosts"])]
    # a port given in `server` is not probed here (hosts behind a jump host cannot be)
    port = (server or {}).get("http_port") or free_port(addresses)
    data["server"].update(http_port=port, workdir=str(REPO), run_dir=str(tmp_path / "on-hosts"),
                          **{k: v for k, v in (server or {}).items() if k != "http_port"})
    data["builds"].update({k: dict(v) for k, v in (builds or {}).items()})
    for build in data["builds"].values():   # the test's own builds too
        build["path"] = str(REPO / build["path"])
        build["flags"] = [*build.get("flags", ()), *(("--sim-noise", noise) if noise else ()),
                          *(() if client_latency else NO_CLIENT_LATENCY), *sim_flags]
    if hosts is not None:
        data["hosts"] = hosts
    if groups is not None:
        data["groups"] = groups
    if ssh is not None:
        data["ssh"] = dict(ssh)
    if baseline:
        data["baseline"] = baseline
    if candidate:
        data["candidate"] = candidate
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


# wide margins: two trials per build decide little, and the tests that run this scenario are about
# lifecycle (scale-out, resuming, history, routes), not the RowCache's figures
SMALL_EXPECTATIONS: tuple[Mapping[str, Any], ...] = (
    {"metric": "hit_rate", "request": "A-new-start", "kind": "no_regression", "margin": 0.2},
    {"metric": "kv_pages", "request": "*", "kind": "no_regression", "margin": 0.2})


def small_scenario(tmp_path: Path, name: str, cache: str = "1G", *, trials: int = 2, max_trials: int | None = None,
                   expectations: Sequence[Mapping[str, Any]] = SMALL_EXPECTATIONS) -> Path:
    """The RowCache study's A and A-new-start only, 4,000 tokens each (the default scenario's trial replays
    180,000 on every rank): the time is the servers' lifecycle, not the RowCache emulation's CPU.
    Written to `tmp_path/<name>.yaml`; `max_trials` defaults to `trials` (no extra blocks)."""
    text = (REPO / "fixtures" / "cache_qualify" / "config" / "scenarios" / "reread-1g.yaml").read_text()
    data = yaml.safe_load(text)
    data.update(name=name, server_flags=["--embedding-table-cache-size", cache, "--prefix-cache-memory", "0"],
                requests=[{"name": "A", "start": 1000, "stop": 5000},
                          {"name": "A-new-start", "start": 1000, "stop": 5000, "new_start": 1}],
                trials=trials, max_trials=trials if max_trials is None else max_trials,
                expectations=[dict(e) for e in expectations])
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def small_scenario_option(tmp_path: Path, name: str, cache: str = "1G", *, trials: int = 2) -> tuple[str, str]:
    """`--scenario PATH` of a `small_scenario` written under `tmp_path`."""
    return "--scenario", str(small_scenario(tmp_path, name, cache, trials=trials))


def sim_processes(port: int | None = None) -> list[tuple[int, str]]:
    """(pid, command line) of every emulated-server rank in the process table (on `port` if given)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        line = " ".join(a.decode(errors="replace") for a in args if a)
        if "cache_qualify.sim.server" not in line or line.startswith("sh -c"):
            continue
        if port is None or f"--port {port}" in line:
            found.append((int(entry.name), line))
    return found


def wait_no_sim_processes(port: int, timeout_s: float = 10.0) -> list[tuple[int, str]]:
    """Wait until no rank on `port` is left; return what is still there after `timeout_s`."""
    with contextlib.suppress(NotInTime):
        wait_for(lambda: not sim_processes(port), timeout_s, f"no rank left on port {port}", every_s=0.1)
    return sim_processes(port)


def inventory_port(path: Path) -> int:
    return int(yaml.safe_load(path.read_text(encoding="utf-8"))["server"]["http_port"])


@dataclass(frozen=True)
class QualifyRun:
    """A finished `pytest qualify` subprocess and where it wrote (its JUnit XML where `--junitxml` said,
    else in its run folder)."""

    returncode: int
    output: str
    reports: Path
    junit_file: Path | None = None

    def run_dir(self) -> Path:
        runs = self.run_folders()
        assert runs, f"no run folder in {self.reports}:\n{self.output}"
        return runs[-1]

    def run_folders(self) -> list[Path]:
        """The run folders in the reports folder (none: the run left none)."""
        return sorted(p for p in self.reports.iterdir() if p.is_dir()) if self.reports.is_dir() else []

    def junit_path(self) -> Path:
        return self.junit_file or self.run_dir() / "junit.xml"

    def junit(self) -> ET.Element:
        return ET.parse(self.junit_path()).getroot()

    def tail(self) -> list[str]:
        """The lines of the terminal's cache-qualify section (without pytest's own last line under -q)."""
        lines = self.output.splitlines()
        start = next(i for i, line in enumerate(lines) if " cache-qualify " in line and line.startswith("="))
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("=")), len(lines))
        return [line for line in lines[start + 1:end]
                if not re.match(r"\d+ (passed|deselected|tests? collected)", line)]

    def testcases(self) -> dict[str, ET.Element]:
        return {case.get("name", ""): case for case in self.junit().iter("testcase")}

    def reading_rule_violations(self, *, required: bool = True) -> list[str]:
        """Every verdict test in the JUnit XML read by the rule docs/statistics.md states, on its printed
        figures: where higher is better a pass is exactly `ci_low > null_boundary` and a shown failure
        `ci_high < null_boundary`; where lower is better a pass is exactly `ci_high < null_boundary` and a
        shown failure `ci_low > null_boundary`; the bad-start check fails exactly when `p_value < level`.
        Returns the verdicts that break it (none), and (`required`) checks that there were verdicts to read."""
        broken, read = [], 0
        if not required and (self.junit_file is None and not self.run_folders() or not self.junit_path().is_file()):
            return []
        for name, case in self.testcases().items():
            props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
            if props.get("outcome") not in ("pass", "fail", "inconclusive"):
                continue
            read += 1
            passed = case.find("failure") is None and case.find("error") is None
            if passed != (props["outcome"] == "pass"):
                broken.append(f"{name}: the test {'passed' if passed else 'failed'}, the verdict is {props['outcome']}")
            if props["kind"] == "no_excess":
                if passed == (_number(props["p_value"]) < _number(props["level"])):
                    broken.append(f"{name}: {props}")
                continue
            low, high, boundary = (_number(props[k]) for k in ("ci_low", "ci_high", "null_boundary"))
            better, worse = (low > boundary, high < boundary) if props["higher_is_better"] == "true" \
                else (high < boundary, low > boundary)
            if passed != better or (worse and props["outcome"] != "fail"):
                broken.append(f"{name}: {props}")
        assert read or not required, f"no verdict test in the JUnit XML of {self.run_dir()}"
        return broken


def _number(text: str) -> float:
    return float(text) if text not in ("", "None") else math.nan


TEST_SEED = "1"   # every run of the suite's own tests has a seed, so its noise replays (a resume keeps its own)


# pytest plugins of the suite's own test environment that a lab runner's `pytest qualify` does not
# load: blocked in the runs the tests start, which then import what a runner's do (1.3 s of CPU
# less per run); blocking a plugin that is not installed is a no-op
TEST_ONLY_PLUGINS = ("hypothesispytest", "benchmark", "anyio")


def qualify_command(inventory: Path, reports: Path, *args: str) -> list[str]:
    """The command line of a lab runner's `pytest qualify`, seeded, without the report's plots: they cost
    a second of CPU a run and no test of a run reads them (tests/test_report.py draws and checks them,
    and the gate's default run checks that `cache-qualify report` draws them afterwards)."""
    seeded = () if "--seed" in args or "--resume" in args else ("--seed", TEST_SEED)
    blocked = [arg for name in TEST_ONLY_PLUGINS for arg in ("-p", f"no:{name}")]
    return [sys.executable, "-m", "pytest", "qualify", "--hosts", str(inventory), "--reports-dir", str(reports),
            "-p", "no:cacheprovider", *blocked, "-q", "-rA", "--no-plots", *seeded, *args]


def run_cli(*args: str, timeout_s: float = 300.0, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """`cache-qualify ARGS` in a process of its own, from the repository, its output captured. It runs the
    package's module under the tests' interpreter, so no console script on PATH is needed (tests that
    check the console script itself call it by name). A non-zero exit status is returned, not raised."""
    return subprocess.run([sys.executable, "-m", "cache_qualify.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout_s, check=False)


def run_qualify(inventory: Path, reports: Path, *args: str, timeout_s: float = 300.0,
                env: Mapping[str, str] | None = None) -> QualifyRun:
    """Run the real `pytest qualify` on `inventory`, from the repository, and wait for it."""
    proc = subprocess.run(qualify_command(inventory, reports, *args), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, **(env or {})})
    run = QualifyRun(proc.returncode, proc.stdout + proc.stderr, reports, junit_file=junit_option(args))
    # every verdict of every end-to-end run of the suite reads as docs/statistics.md says it does
    broken = run.reading_rule_violations(required=False)
    assert broken == [], "verdicts that break the reading rule:\n" + "\n".join(broken)
    return run


def junit_option(args: Sequence[str]) -> Path | None:
    """The file `--junitxml` names among a command line's `args` (None: not given)."""
    for i, arg in enumerate(args):
        if arg.startswith("--junitxml="):
            return Path(arg.split("=", 1)[1])
        if arg == "--junitxml" and i + 1 < len(args):
            return Path(args[i + 1])
    return None


def _as_from_a_terminal() -> None:
    # a shell without job control starts its background commands with SIGINT ignored, and the
    # ignoring is inherited down to the run, whose Python then never raises KeyboardInterrupt:
    # the run gets Ctrl-C's default, as a runner's terminal gives it, however the suite was started
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_qualify(inventory: Path, reports: Path, *args: str) -> subprocess.Popen[str]:
    """Start `pytest qualify` in its own session (so a test can signal it like a terminal would)."""
    return subprocess.Popen(qualify_command(inventory, reports, *args), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_as_from_a_terminal)


def interrupt(proc: subprocess.Popen[str], sig: int = signal.SIGINT) -> str:
    """Send `sig` to the run (as Ctrl-C would) and collect its output."""
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    return out


def collected(*args: str) -> list[str]:
    """The qualification tests `pytest qualify --collect-only` lists with `args`, each as `name[id]`."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "qualify", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line.split("::", 1)[1] for line in proc.stdout.splitlines() if line.startswith("qualify/")]
