"""What every fault test checks after a real `pytest qualify` run: the outcome, the aftermath on the hosts.

Shared by tests/test_faults.py and tests/test_concurrent.py: a small scenario (short requests,
two trials per build), the failing tests and their messages read back from JUnit, and the
aftermath every fault must leave: no emulated-server rank running, every host's lock free,
and the samples of every request finished before the fault on disk.
"""

from __future__ import annotations

import csv
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.labfixtures import QualifyRun, inventory_port, run_qualify, sim_processes
from tests.support.waiting import wait_for

SCENARIO = "faults"
REQUESTS = ("A", "A-new-start", "B", "C")
STARTUP = "startup"
ALL = "all"
PREFLIGHT_CHECKS = ("test_ssh_identity", "test_build_flags", "test_reachable", "test_drop_caches", "test_builds_present",
                    "test_port_free", "test_clock")


def scenario_file(tmp_path: Path, *, timeout_s: float = 30.0, repeat_c: int = 1) -> Path:
    """A four-request scenario of 400-token prompts, two trials per build (a few seconds per trial)."""
    path = tmp_path / f"{SCENARIO}.yaml"
    path.write_text(f"""\
name: {SCENARIO}
description: four short requests, two trials per build, for the fault tests
corpus: {{default: true, id_range: [3, 127999]}}
server_flags: [--embedding-table-cache-size, 64M, --prefix-cache-memory, "0"]
requests:
  - {{name: A, start: 1000, stop: 1400}}
  - {{name: A-new-start, start: 1000, stop: 1400, new_start: 1}}
  - {{name: B, start: 5000, stop: 5400}}
  - {{name: C, start: 9000, stop: 9400, repeat: {repeat_c}}}
request: {{max_tokens: 1, logprobs: 20, stream: false, timeout_s: {timeout_s}}}
trials: 2
block_size: 1
max_trials: 2
test: welch
alpha: 0.2
expectations:
  - {{metric: hit_rate, request: A-new-start, kind: no_regression, margin: 0.5}}
  - {{metric: kv_pages, request: "*", kind: no_regression, margin: 0.5}}
""", encoding="utf-8")
    return path


@dataclass(frozen=True)
class SimRun:
    """Where one test's simulated lab lives: its inventory, scenario, reports and host folders."""

    inventory: Path
    scenario: Path
    reports: Path
    on_hosts: Path
    hosts: tuple[str, ...] = ("gb10-a", "gb10-b", "gb10-c")

    @property
    def port(self) -> int:
        return inventory_port(self.inventory)

    def args(self, run_id: str, *extra: str) -> tuple[str, ...]:
        return ("--scenario", str(self.scenario), "--run-id", run_id, *extra)

    def qualify(self, *extra: str, run_id: str = "fault", timeout_s: float = 240.0) -> QualifyRun:
        return run_qualify(self.inventory, self.reports, *self.args(run_id, *extra), timeout_s=timeout_s)

    def qualify_junit_outside(self, *extra: str) -> QualifyRun:
        """A run whose JUnit XML is written beside the reports folder (`--junitxml`), so a run that leaves
        no run folder can still be read back."""
        return self.qualify("--junitxml", str(self.reports.parent / "junit.xml"), *extra)


def last_failed(tmp_path: Path, *node_ids: str) -> tuple[str, ...]:
    """The arguments of pytest's `--lf` with a cache of its own that records `node_ids` as the last run's
    failures (the runs the suite starts block pytest's cache plugin; these load it again)."""
    cache = tmp_path / "pytest-cache"
    (cache / "v" / "cache").mkdir(parents=True)
    (cache / "v" / "cache" / "lastfailed").write_text(json.dumps(dict.fromkeys(node_ids, True)))
    return ("-p", "cacheprovider", "-o", f"cache_dir={cache}", "--lf")


def failures(run: QualifyRun) -> dict[str, str]:
    """Name -> message of every test that failed or errored, from the run's JUnit XML."""
    found = {}
    for name, case in run.testcases().items():
        for tag in ("failure", "error"):
            element = case.find(tag)
            if element is not None:
                found[name] = (element.get("message", "") + "\n" + (element.text or "")).strip()
    return found


def skipped(run: QualifyRun) -> dict[str, str]:
    """Name -> reason of every test that was skipped, from the run's JUnit XML."""
    return {name: element.get("message", "") for name, case in run.testcases().items()
            if (element := case.find("skipped")) is not None}


def check_stopped_by_preflight(run: QualifyRun, *checks: str) -> None:
    """The run stopped at its preflight, saying each failure once: the failed `checks` (test names),
    every scenario test skipped pointing to them, one line in the terminal's tail, and no run folder; the
    lab's exit status (6: not a verdict), each failed check an error in JUnit."""
    assert run.returncode == 6, run.output[-4000:]
    assert all(run.testcases()[check].find("error") is not None for check in checks), run.output[-4000:]
    assert sorted(failures(run)) == sorted(checks), run.output[-4000:]
    points = ", ".join(f"qualify/test_preflight.py::{check}" for check in checks)
    blocked = {n: why for n, why in skipped(run).items() if not n.startswith(PREFLIGHT_CHECKS)}
    assert len(blocked) >= 6, run.output[-4000:]   # every qualification test of the scenario
    for why in blocked.values():
        assert why.startswith(f"not run: blocked by the failed preflight check{'s' if len(checks) > 1 else ''} "
                              f"{points}; "), why
    assert f"SKIPPED [{len(blocked)}] " in run.output, run.output[-4000:]   # one line for them all
    tail = run.tail()
    assert len(tail) == 1 and tail[0].startswith(f"nothing measured: the preflight check {checks[0]} failed: "), tail
    assert tail[0].endswith("; no run folder kept"), tail
    assert "could not be rendered" not in run.output and "--resume" not in run.output, run.output[-4000:]
    assert run.run_folders() == [], run.run_folders()   # no trial started: nothing kept


def failed(run: QualifyRun, test: str) -> str:
    """The message of the failed test whose name starts with `test` (asserting it failed)."""
    messages = [m for n, m in failures(run).items() if n.startswith(test)]
    assert messages, f"{test} did not fail:\n{run.output[-6000:]}"
    return messages[0]


def rows(path: Path) -> list[dict[str, str]]:
    """Complete rows of a CSV file (a torn last line is left out; none when the file is absent)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    return list(csv.DictReader(line for line in lines if line.endswith("\n")))


def requests_on_disk(run_dir: Path) -> dict[str, list[str]]:
    """Attempt -> its request names in samples.csv, in the order first written."""
    found: dict[str, list[str]] = {}
    for row in rows(run_dir / "samples.csv"):
        names = found.setdefault(row["attempt"], [])
        if row["request"] not in names:
            names.append(row["request"])
    return found


def sequence_of(repeat_c: int = 1) -> list[str]:
    """The names of a trial's samples in order, as `scenario_file(repeat_c=...)` makes them (a repeated
    request is named per repeat: C-1, C-2, ...)."""
    *first, last = REQUESTS
    return [STARTUP, *first, *([last] if repeat_c == 1 else [f"{last}-{i}" for i in range(1, repeat_c + 1)])]


def check_samples(run_dir: Path, hosts: tuple[str, ...], *, faulty_done: tuple[str, ...] | None,
                  repeat_c: int = 1) -> None:
    """Every finished trial has all its samples; the faulty trial those of the requests done before the fault.

    `faulty_done` None: the requests the faulty trial finished are not known in advance (a drop at
    a random point), so they must only be a complete prefix of the sequence (`repeat_c`: as the
    scenario was written).
    """
    trials = rows(run_dir / "trials.csv")
    on_disk = requests_on_disk(run_dir)
    sequence = sequence_of(repeat_c)
    per_host = {(r["attempt"], r["request"], r["host"]) for r in rows(run_dir / "samples.csv")}
    for trial in trials:
        done = on_disk.get(trial["attempt"], [])
        if trial["outcome"] == "ok":
            assert done == sequence, f"trial {trial} lacks samples: {done}"
        elif faulty_done is not None:
            assert done == list(faulty_done), f"faulty trial {trial['attempt']}: on disk {done}"
        else:
            assert done == sequence[:len(done)] and STARTUP in done, done
        for request in done:
            if request != STARTUP:  # every host's delta and the combined row of each finished request
                assert {h for a, r, h in per_host if a == trial["attempt"] and r == request} == {*hosts, ALL}


def check_aftermath(lab: SimRun, *, left: tuple[int, ...] = ()) -> None:
    """No rank of this lab runs (but the `left` pids, not this suite's to stop) and every host lock is free."""
    def running() -> list[tuple[int, str]]:
        return [p for p in sim_processes(lab.port) if p[0] not in left]

    wait_for(lambda: not running(), 60, "no emulated-server rank left running", every_s=0.1,
             detail=lambda: f"still running: {running()}")
    for host in lab.hosts:
        lock = lab.on_hosts / host / "lock"
        if not lock.exists():
            continue  # the host was never locked
        probe = subprocess.run(["flock", "-n", str(lock), "true"], capture_output=True, text=True)
        assert probe.returncode == 0, f"the lock of {host} ({lock}) is still held"
