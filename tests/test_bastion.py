"""A lab the runner reaches only through a jump host, in network namespaces this test makes.

Two namespaces joined by a veth pair: the *runner* namespace, where `pytest qualify` runs,
and the *lab* namespace, holding the jump host's sshd (on the veth address, the only thing
the runner can reach) and three hosts' sshd instances and their emulated ranks on addresses
of the lab namespace's loopback, which the runner has no route to. The hosts are named by
ssh_config aliases (HostName, Port, User, IdentityFile, ProxyJump) and their keys are
checked strictly. Nothing leaves the machine: neither namespace has a default route.
Run as root with iproute2 and openssh-server; without them these tests fail, never skip.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal
import sqlite3
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.labfaults import failures, rows
from tests.support.labfixtures import REPO, QualifyRun, qualify_command, small_scenario_option, write_inventory
from tests.support.netns import Netns, NetnsUnavailable, leftovers_of, veth
from tests.support.sshd import SshdInstance, SshdLab
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.sshd, pytest.mark.slow]

RUNNER_ADDRESS, JUMP_ADDRESS = "10.213.0.1", "10.213.0.2"
HOSTS = {"gb10-a": "10.213.1.11", "gb10-b": "10.213.1.12", "gb10-c": "10.213.1.13"}
HTTP_PORT = 18080
JUMP_PORT = 2200
# two trials per build leave Welch's test one degree of freedom: alpha 0.05 keeps the KV-pages
# verdict from failing by chance (as in test_resume)
SHORT_GATE = ("--trials", "2", "--max-trials", "2", "--seed", "5", "--alpha", "0.05")
SCENARIO = "bastion-short"


@dataclass
class BastionLab:
    runner: Netns
    lab: Netns
    jump: SshdInstance
    hosts: dict[str, SshdInstance]
    tmp_path: Path
    ssh: dict[str, Any]

    def inventory(self, name: str = "hosts.yaml", *, server: dict[str, Any] | None = None,
                  **host_fields: Any) -> Path:
        """The committed simulated lab's inventory with the hosts named by their aliases."""
        hosts = [{"name": n, "address": n, "rank": r, "transport": "ssh", **host_fields}
                 for r, n in enumerate(HOSTS)]
        # the quiet lab: two trials per build must decide the gate, so the test is about the route
        # (as in test_resume); the calibrated noise is the gate tests' business
        return write_inventory(self.tmp_path, name=name, hosts=hosts, ssh=self.ssh, noise="quiet",
                               server={"http_port": HTTP_PORT, "readiness": {"path": "/health", "timeout_s": 120},
                                       **(server or {})})

    def short_scenario(self) -> tuple[str, str]:
        """`--scenario` of the short scenario (the study's A and A-new-start), written in this lab's folder."""
        return small_scenario_option(self.tmp_path, SCENARIO)

    def command(self, inventory: Path, *args: str) -> list[str]:
        return self.runner.argv(qualify_command(inventory, self.tmp_path / "reports", *args))

    def qualify(self, inventory: Path, *args: str, timeout_s: float = 400.0) -> QualifyRun:
        """`pytest qualify` run inside the runner namespace."""
        done = subprocess.run(self.command(inventory, *args), cwd=REPO, capture_output=True, text=True,
                              timeout=timeout_s)
        return QualifyRun(done.returncode, done.stdout + done.stderr, self.tmp_path / "reports")

    def listeners(self) -> set[int]:
        return {pid for i in (self.jump, *self.hosts.values()) for pid in ([i.pid] if i.pid else [])}

    def check_nothing_left(self, timeout_s: float = 20.0) -> None:
        """No rank, lock holder, SSH session or forward of the run is left in either namespace."""
        def left() -> str:
            extra = [p for p in self.lab.pids() if p not in self.listeners()]
            runner = self.runner.pids()
            return (f"processes left in the lab namespace: {describe(extra)}; "
                    f"in the runner namespace: {describe(runner)}") if extra or runner else ""

        wait_for(lambda: not left(), timeout_s, "no process of the run left in either namespace", every_s=0.1,
                 detail=left)
        assert self.runner.listening().strip() == "", "a forward still listens in the runner namespace"
        listening = self.lab.listening()
        assert f":{HTTP_PORT} " not in listening, f"a rank still listens:\n{listening}"

    def close(self) -> None:
        for instance in (*self.hosts.values(), self.jump):
            instance.stop()
        killed = self.runner.delete() + self.lab.delete()
        assert killed == [], f"had to kill {killed} to remove the namespaces"


def describe(pids: list[int]) -> str:
    found = []
    for pid in pids:
        try:
            found.append(f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:
            found.append(f"{pid}: (gone)")
    return "; ".join(found) or "none"


@pytest.fixture
def bastion(sshd_lab: SshdLab, tmp_path: Path) -> Iterator[BastionLab]:
    try:
        runner, lab = Netns("runner"), Netns("lab")
    except NetnsUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    made: BastionLab | None = None
    try:
        veth(runner, RUNNER_ADDRESS, lab, JUMP_ADDRESS)
        for address in HOSTS.values():
            lab.add_address(address)
        inside = lab.exec_prefix()
        jump = sshd_lab.start("bastion", address=JUMP_ADDRESS, port=JUMP_PORT, prefix=inside)
        hosts = {name: sshd_lab.start(name, address=address, port=2201 + i, prefix=inside)
                 for i, (name, address) in enumerate(HOSTS.items())}
        known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts", jump, *hosts.values())
        config = tmp_path / "ssh_config"
        config.write_text(
            f"Host bastion\n  HostName {JUMP_ADDRESS}\n  Port {JUMP_PORT}\n\n"
            + "".join(f"Host {name}\n  HostName {i.address}\n  Port {i.port}\n  ProxyJump bastion\n\n"
                      for name, i in hosts.items())
            + f"Host *\n  User {sshd_lab.user}\n  IdentityFile {sshd_lab.client_key}\n", encoding="utf-8")
        ssh = {"ssh_config": str(config), "known_hosts": [str(known_hosts)], "host_key_policy": "strict",
               "use_agent": False, "connect_timeout_s": 5, "command_timeout_s": 60}
        made = BastionLab(runner, lab, jump, hosts, tmp_path, ssh)
        yield made
    finally:
        for instance in [*(made.hosts.values() if made else ()), *([made.jump] if made else ())]:
            instance.stop()
        runner.delete()
        lab.delete()


def test_hosts_are_unreachable_from_the_runner_but_through_the_jump_host(bastion: BastionLab) -> None:
    """The premise: from the runner namespace the hosts' addresses have no route, the jump host has."""
    probe = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
             "    print('connected')\nexcept OSError as exc:\n    print(exc.strerror)\n")
    host = bastion.hosts["gb10-a"]
    for address, port, expected in ((host.address, host.port, "Network is unreachable"),
                                     (JUMP_ADDRESS, JUMP_PORT, "connected")):
        said = subprocess.run(bastion.runner.argv([sys.executable, "-c", probe, address, str(port)]),
                              capture_output=True, text=True, timeout=30).stdout.strip()
        assert said == expected, (address, said)


def test_gate_passes_with_every_request_forwarded_over_ssh(bastion: BastionLab) -> None:
    """two_choice against set4, hosts named by ssh_config aliases behind the jump host, strict host keys:
    completions, /metrics and readiness all over forwarded ports; nothing left afterwards."""
    inventory = bastion.inventory()
    # the route, not the figures: a short scenario's trials forward the same completions, metrics, readiness
    run = bastion.qualify(inventory, *bastion.short_scenario(), *SHORT_GATE, "--run-id", "bastion")
    assert run.returncode == 0, run.output[-6000:]
    cases = run.testcases()
    assert any(name.startswith("test_row_cache") for name in cases), sorted(cases)
    assert all(case.find("failure") is None and case.find("error") is None for case in cases.values())
    provenance = yaml.safe_load((run.run_dir() / "provenance.json").read_text(encoding="utf-8"))
    text = str(provenance)
    for name, address in HOSTS.items():
        assert address in text, f"{name}'s listen address {address} is not in the provenance"
    assert "'http_route': 'ssh'" in text, text[:2000]
    trials = rows(run.run_dir() / "trials.csv")
    assert {t["build"] for t in trials} == {"set4", "two_choice"} and all(t["outcome"] == "ok" for t in trials)
    bastion.check_nothing_left()
    bastion.close()
    assert leftovers_of(os.getpid()) == []


def test_an_artifact_candidate_is_staged_through_the_jump_host_checked_and_qualified(
        bastion: BastionLab, monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate given whole on the command line (the emulated server's file as an artifact of the
    runner) is copied over SFTP through the jump host onto every host, into a folder named by its sha256,
    checked there and qualified, its digest and the pipeline's commit recorded in provenance.json, JUnit
    and the history; the next run finds one host holding other bytes and fails before any rank starts,
    naming the host and both digests."""
    monkeypatch.setenv("GITHUB_SHA", "0c0ffee" * 5)
    monkeypatch.delenv("CI_COMMIT_SHA", raising=False)
    artifact = bastion.tmp_path / "artifacts" / "pr-server.py"
    artifact.parent.mkdir()
    artifact.write_bytes((REPO / "fixtures" / "cache_qualify" / "sim" / "server.py").read_bytes())
    digest = hashlib.sha256(artifact.read_bytes()).hexdigest()
    # the build's file is what every rank runs: the staged copy, not the checkout's module
    inventory = bastion.inventory(server={"command": (
        "{python} {build_path} --rank {rank} --tensor-parallel-size {world_size} --rank0-address "
        "{rank0_address}:{port} --host {address} --port {port} --sim-seed {seed} {flags}")})
    given = ("--candidate", f"0421=two_choice@artifact:{artifact}")
    run = bastion.qualify(inventory, *bastion.short_scenario(), *SHORT_GATE, *given, "--run-id", "artifact")
    assert run.returncode == 0, run.output[-6000:]
    staged = {name: bastion.tmp_path / "on-hosts" / name / "builds" / digest / "pr-server.py" for name in HOSTS}
    assert all(path.read_bytes() == artifact.read_bytes() for path in staged.values())
    provenance = json.loads((run.run_dir() / "provenance.json").read_text(encoding="utf-8"))
    assert provenance["builds"]["0421"] | {"flags": []} == provenance["builds"]["0421"] | {
        "role": "candidate", "source": "artifact", "digest": digest, "ref": "0c0ffee" * 5, "path": str(artifact),
        "flags": []}
    properties = {p.get("name"): p.get("value") for p in run.junit().iter("property")}
    assert (properties["build[0421].digest"], properties["build[0421].ref"]) == (digest, "0c0ffee" * 5)
    with sqlite3.connect(run.reports / "history.sqlite") as history:
        assert history.execute("SELECT source, digest, ref FROM builds WHERE build = '0421'").fetchall() == [
            ("artifact", digest, "0c0ffee" * 5)]
    logs = {name: sorted(p.name for p in path.parents[2].glob("*.log")) for name, path in staged.items()}
    assert all(any("0421" in log for log in names) for names in logs.values()), logs

    staged["gb10-b"].write_text("# another build\n", encoding="utf-8")
    other = hashlib.sha256(staged["gb10-b"].read_bytes()).hexdigest()
    run = bastion.qualify(inventory, *bastion.short_scenario(), *SHORT_GATE, *given, "--run-id", "differs")
    assert run.returncode != 0
    assert (f"host gb10-b: build '0421': {staged['gb10-b']} has sha256 {other}, the arm's is {digest}"
            in run.output), run.output[-4000:]
    assert {name: sorted(p.name for p in path.parents[2].glob("*.log")) for name, path in staged.items()} == logs
    bastion.check_nothing_left()


def test_direct_http_behind_the_bastion_fails_preflight_once_per_host(bastion: BastionLab) -> None:
    inventory = bastion.inventory("direct.yaml", http_route="direct")
    started = time.monotonic()
    junit = bastion.tmp_path / "preflight.xml"   # a check of the lab alone keeps no run folder
    run = bastion.qualify(inventory, "--preflight-only", "--junitxml", str(junit), timeout_s=120)
    run = dataclasses.replace(run, junit_file=junit)
    took = time.monotonic() - started
    assert run.returncode == 6, run.output[-4000:]   # failed preflight checks: the lab's status
    failed = [line for line in run.output.splitlines() if line.startswith("ERROR ")]   # the lab's: errors
    assert len(failed) == len(HOSTS), "\n".join(failed) or run.output[-4000:]
    messages = failures(run)
    assert sorted(messages) == [f"test_port_free[{name}]" for name in HOSTS], messages
    for name, address in HOSTS.items():
        message = messages[f"test_port_free[{name}]"]
        assert re.search(rf"HostUnreachable: host {name}: the runner cannot reach {re.escape(address)}:{HTTP_PORT}, "
                        rf"the rank's HTTP port, directly \(http_route: direct\): Network is unreachable\. The host "
                        rf"is behind a jump host: with `http_route: ssh`", message), message
        assert message.count("HostUnreachable") <= 2  # the message and its repeat in the text, no traceback
    assert "passed" in run.output and "test_reachable" not in "\n".join(failed)  # SSH itself works
    assert took < 60, f"preflight took {took:.0f} s: it should fail at once"  # a connect timeout would be 5 s per try
    bastion.check_nothing_left()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_runner_stopped_mid_trial_leaves_no_rank_session_or_forward(bastion: BastionLab,
                                                                     stop: signal.Signals) -> None:
    inventory = bastion.inventory()
    reports = bastion.tmp_path / "reports"
    # teardown, not figures: the stop still lands mid-run, after request A of a short trial is on disk
    command = bastion.command(inventory, *bastion.short_scenario(), *SHORT_GATE, "--run-id", "stopped")
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        wait_for(lambda: any(r["request"] == "A" for r in rows(reports / "stopped" / "samples.csv")), 120,
                 "request A measured", process=proc)
        proc.send_signal(stop)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert any(r["request"] == "A" for r in rows(reports / "stopped" / "samples.csv"))  # samples kept
    bastion.check_nothing_left()


def test_example_preflight_without_an_ssh_config_reports_only_the_real_problems(tmp_path: Path) -> None:
    """The shipped example on a runner with no ~/.ssh at all (and no network: an empty namespace): one
    line for the missing key, one per unreachable host, the other checks of those hosts skipped."""
    try:
        offline = Netns("offline")
    except NetnsUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        command = offline.argv(qualify_command(REPO / "examples" / "gb10-lab.yaml", tmp_path / "reports",
                                               "--preflight-only", "--junitxml", str(tmp_path / "junit.xml")))
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HOME": str(tmp_path)})
    finally:
        offline.delete()
    output = done.stdout + done.stderr
    assert done.returncode == 6, output[-4000:]   # failed preflight checks: the lab's status, each an error
    failed = sorted(line.split(" ")[1].split("::")[1] for line in output.splitlines() if line.startswith("ERROR "))
    assert failed == ["test_reachable[gb10-a]", "test_reachable[gb10-b]", "test_reachable[gb10-c]",
                      "test_ssh_identity"], output[-4000:]
    assert "FAILED " not in output and "Traceback" not in output and "paramiko" not in output, output[-4000:]
    # a check of the lab alone keeps no run folder: its JUnit file is the one --junitxml names
    run = QualifyRun(done.returncode, output, tmp_path / "reports", junit_file=tmp_path / "junit.xml")
    messages = failures(run)
    assert re.search(r"ConfigError: \S+/examples/gb10-lab.yaml: ssh.identity_file: the identity file "
                     r"~/.ssh/cache-qualify does not exist on the runner; create it with `ssh-keygen",
                     messages["test_ssh_identity"]), messages["test_ssh_identity"]
    for name in ("gb10-a", "gb10-b", "gb10-c"):
        assert re.search(rf"HostUnreachable: host {name}: cannot connect to jump host "
                         rf"qualify@gb10-bastion.lab.example.com:22: ", messages[f"test_reachable[{name}]"])
    # test_build_flags passes: the flare runtime's responses need no server flag
    assert re.search(r"1 passed, 12 skipped, 15 deselected, 4 errors", output), output[-2000:]


def test_a_lab_opens_one_forward_per_host_and_closes_them_all(sshd_lab: SshdLab, tmp_path: Path) -> None:
    """In the runner's own process (hosts on loopback behind a jump host): the lab opens each rank's
    route with the connections, reports the port free over it, and closing the lab ends every forward."""
    from cache_qualify.config.inventory import load_inventory
    from cache_qualify.lab.control import Lab
    from tests.support.bench_forward import forwarded_lab

    path, instances = forwarded_lab(sshd_lab, tmp_path)
    inventory = load_inventory(path)
    group = inventory.groups_resolved()[0]
    lab = Lab(inventory, group, run_id="routes").open()
    try:
        routes = [lab.routes[h.name] for h in group.hosts]
        assert [r.route for r in routes] == ["ssh"] * 3
        assert len({r.base_url for r in routes}) == 3 and all(r.base_url.startswith("http://127.0.0.1:") for r in routes)
        assert [r.target for r in routes] == [f"{h.address}:{inventory.server.http_port}" for h in group.hosts]
        assert "forwarded over SSH to" in str(routes[0])
        assert [lab.http_port_open(h) for h in group.hosts] == [False] * 3
        assert len([t for t in threading.enumerate() if t.name.startswith("forward-")]) == 3
    finally:
        lab.close()
        for instance in instances:
            instance.stop()
    assert [t.name for t in threading.enumerate() if t.name.startswith("forward-")] == []
    for route in routes:
        port = int(route.base_url.rsplit(":", 1)[1])
        with pytest.raises(ConnectionRefusedError, match="Connection refused"):
            socket.create_connection(("127.0.0.1", port), timeout=2.0).close()
