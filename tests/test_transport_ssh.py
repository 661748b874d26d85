"""SshTransport against real OpenSSH sshd instances on 127.0.0.x.

Covers login, connection reuse, ssh_config aliases, the jump host, host-key
checking (unknown, accept-new, changed), reconnect after an sshd restart and the
unreachable cases. The contract shared with LocalTransport (quoting, timeouts,
large output) runs over both in test_transport_local.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from cache_qualify.errors import (AuthenticationFailed, ConfigError, HostKeyNotRecorded, HostKeyRejected,
                                  HostUnreachable, TransportError)
from cache_qualify.lab.transport import SshOptions, SshTransport
from cache_qualify.lab.transport.ssh import TcpRefused
from tests.support.httpfixtures import Reply, StubServer, together
from tests.support.sshd import (SshdInstance, SshdLab, SshdUnavailable, free_port, generate_key, require_sshd,
                                waiting_for_the_client)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.sshd


def source_port(transport: SshTransport) -> str:
    """The client port of the connection the command ran on (from $SSH_CONNECTION)."""
    return transport.run('echo "$SSH_CONNECTION"', check=True).stdout.split()[1]


def key_fingerprint(public_key: Path) -> str:
    """``SHA256:...`` as ssh-keygen computes it."""
    listing = subprocess.run(["ssh-keygen", "-lf", str(public_key)], check=True,
                             capture_output=True, text=True).stdout
    return listing.split()[1]


def connect(lab: SshdLab, host: SshdInstance, known_hosts: Path, name: str = "h1",
            **overrides: Any) -> SshTransport:
    return SshTransport(name, host.address, host.port,
                        options=lab.options(known_hosts, **overrides))


@pytest.fixture
def empty_known_hosts(tmp_path: Path) -> Path:
    return tmp_path / "ssh" / "known_hosts"


@pytest.mark.slow
def test_key_login_runs_commands_on_one_reused_connection(
        ssh_transport: SshTransport, sshd_lab: SshdLab,
        record_property: Callable[[str, object], None]) -> None:
    assert not ssh_transport.connected()  # lazy: nothing happens before the first command
    started = time.monotonic()
    assert ssh_transport.run(["id", "-un"], check=True).stdout == f"{sshd_lab.user}\n"
    login_s = time.monotonic() - started
    port = source_port(ssh_transport)
    rounds = 10
    started = time.monotonic()
    for _ in range(rounds):
        ssh_transport.run("true", check=True)
    round_trip_s = (time.monotonic() - started) / rounds
    assert source_port(ssh_transport) == port  # the same TCP connection throughout
    record_property("ssh_login_and_first_command_s", round(login_s, 4))
    record_property("ssh_command_round_trip_s", round(round_trip_s, 4))
    print(f"\nssh login + first command {login_s * 1000:.0f} ms; "
          f"round trip on the reused connection {round_trip_s * 1000:.0f} ms")


def test_ssh_config_alias_resolves_hostname_port_user_and_identity(
        sshd_lab: SshdLab, sshd_host: SshdInstance, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host gb10-a\n  HostName {sshd_host.address}\n  Port {sshd_host.port}\n"
                      f"  User {sshd_lab.user}\n  IdentityFile {sshd_lab.client_key}\n")
    known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts", sshd_host)
    options = SshOptions(ssh_config=str(config), known_hosts=(str(known_hosts),),
                         use_agent=False)
    with SshTransport("h1", "gb10-a", options=options) as transport:
        assert (transport.endpoint.address, transport.endpoint.port) == (
            sshd_host.address, sshd_host.port)
        assert transport.run(["echo", "via alias"], check=True).stdout == "via alias\n"


def test_missing_ssh_config_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nowhere/ssh_config: the ssh config file \S+nowhere/ssh_config does "
                                          r"not exist \(only the default ~/.ssh/config may be missing\)"):
        SshTransport("h1", "gb10-a", options=SshOptions(ssh_config=str(tmp_path / "nowhere"
                                                                       / "ssh_config")))


def test_missing_default_ssh_config_is_empty_as_for_openssh(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/config
    transport = SshTransport("h1", "gb10-a", 2222, options=SshOptions(ssh_config="~/.ssh/config", user="q"))
    assert (transport.endpoint.address, transport.endpoint.port, transport.endpoint.user) == ("gb10-a", 2222, "q")
    assert transport.jump is None


@pytest.fixture
def jump_pair(sshd_lab: SshdLab) -> Iterator[tuple[SshdInstance, SshdInstance]]:
    jump, target = sshd_lab.start("jump"), sshd_lab.start("target")
    yield jump, target
    jump.stop()
    target.stop()


def test_jump_host_carries_the_connection(
        sshd_lab: SshdLab, jump_pair: tuple[SshdInstance, SshdInstance], tmp_path: Path) -> None:
    jump, target = jump_pair
    known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts", jump, target)
    with connect(sshd_lab, target, known_hosts, jump=jump) as transport:
        assert transport.run(["echo", "through"], check=True).stdout == "through\n"
        assert len(jump.session_pids()) > 0  # the jump host holds a connection for us
        # once the jump host is down the target is unreachable: traffic went through it
        jump.stop()
        with pytest.raises(HostUnreachable, match=rf"^host h1: cannot connect to jump host "
                                                  rf".*@{re.escape(jump.address)}:{jump.port}: "
                                                  rf"Connection refused"):
            transport.run("true")


def test_proxy_jump_from_the_ssh_config(
        sshd_lab: SshdLab, jump_pair: tuple[SshdInstance, SshdInstance], tmp_path: Path) -> None:
    jump, target = jump_pair
    config = tmp_path / "ssh_config"
    config.write_text(f"Host bastion\n  HostName {jump.address}\n  Port {jump.port}\n"
                      f"Host gb10-b\n  HostName {target.address}\n  Port {target.port}\n"
                      f"  ProxyJump {sshd_lab.user}@bastion\n")
    known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts", jump, target)
    options = sshd_lab.options(known_hosts, ssh_config=str(config))
    with SshTransport("h2", "gb10-b", options=options) as transport:
        assert transport.jump is not None and transport.jump.port == jump.port
        assert transport.run(["echo", "hop"], check=True).stdout == "hop\n"
        assert len(jump.session_pids()) > 0


def test_jump_host_key_is_checked_too(
        sshd_lab: SshdLab, jump_pair: tuple[SshdInstance, SshdInstance], tmp_path: Path) -> None:
    jump, target = jump_pair
    known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts", target)  # jump unknown
    with pytest.raises(HostKeyRejected, match=rf"^host h1: the SSH host key of jump host "
                                              rf"\[{re.escape(jump.address)}\]:{jump.port} "
                                              rf"is unknown"):
        connect(sshd_lab, target, known_hosts, jump=jump).run("true")


def test_unknown_host_key_is_rejected_with_fingerprint_and_fix(
        sshd_lab: SshdLab, sshd_host: SshdInstance, empty_known_hosts: Path) -> None:
    fingerprint = key_fingerprint(sshd_host.host_key.with_suffix(".pub"))
    pattern = (rf"^host h1: the SSH host key of \[{re.escape(sshd_host.address)}\]:"
               rf"{sshd_host.port} is unknown: the server offered ssh-ed25519 "
               rf"{re.escape(fingerprint)}, which is in none of the known_hosts files .*"
               rf"`ssh-keyscan -p {sshd_host.port} -t ssh-ed25519 "
               rf"{re.escape(sshd_host.address)} >> .*known_hosts`, or set host_key_policy: "
               rf"accept-new")
    with pytest.raises(HostKeyRejected, match=pattern):
        connect(sshd_lab, sshd_host, empty_known_hosts).run("true")
    assert not empty_known_hosts.exists()  # strict records nothing


def test_accept_new_records_the_key_then_strict_accepts_it(
        sshd_lab: SshdLab, sshd_host: SshdInstance, empty_known_hosts: Path) -> None:
    with connect(sshd_lab, sshd_host, empty_known_hosts,
                 host_key_policy="accept-new") as transport:
        assert transport.run("echo first", check=True).ok
    recorded = empty_known_hosts.read_text()
    assert recorded.split() == sshd_host.host_key_line.split()[:3]
    with connect(sshd_lab, sshd_host, empty_known_hosts) as strict:
        assert strict.run("echo again", check=True).ok
    assert empty_known_hosts.read_text() == recorded  # known keys are not recorded twice


def test_changed_host_key_is_rejected_even_with_accept_new(
        sshd_lab: SshdLab, sshd_host: SshdInstance, tmp_path: Path) -> None:
    known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts", sshd_host)
    old = key_fingerprint(sshd_host.host_key.with_suffix(".pub"))
    sshd_host.restart(new_host_key=True)
    new = key_fingerprint(sshd_host.host_key.with_suffix(".pub"))
    before = known_hosts.read_text()
    with pytest.raises(HostKeyRejected, match=rf"^host h1: the SSH host key of "
                                              rf"\[{re.escape(sshd_host.address)}\]:"
                                              rf"{sshd_host.port} CHANGED: known_hosts .* has "
                                              rf"ssh-ed25519 {re.escape(old)}, the server offered "
                                              rf"ssh-ed25519 {re.escape(new)}\..*ssh-keygen -R"):
        connect(sshd_lab, sshd_host, known_hosts, host_key_policy="accept-new").run("true")
    assert known_hosts.read_text() == before


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """`path` cannot be written while inside, by its owner or by root (the suite runs as root, whom
    file modes do not stop: the file is made immutable then, which needs chattr and ext4 or alike)."""
    path.chmod(0o444)
    immutable = os.geteuid() == 0
    if immutable:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o644)


def test_accept_new_names_the_known_hosts_file_it_cannot_write(
        sshd_lab: SshdLab, sshd_host: SshdInstance, tmp_path: Path) -> None:
    """A read-only known_hosts file is reported as what it is, not as a host that cannot be reached."""
    known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts")  # exists, lists nothing
    with read_only(known_hosts):
        with pytest.raises(HostKeyNotRecorded, match=rf"^host h1: cannot record the new SSH host key of "
                                                     rf"\[{re.escape(sshd_host.address)}\]:{sshd_host.port} "
                                                     rf"\(ssh-ed25519 SHA256:\S+\) in {re.escape(str(known_hosts))}: "
                                                     rf"(Operation not permitted|Permission denied)\. "
                                                     rf"host_key_policy: accept-new needs"):
            connect(sshd_lab, sshd_host, known_hosts, host_key_policy="accept-new").run("true")
    assert known_hosts.read_text() == ""


def test_accept_new_without_a_known_hosts_file_names_the_host(
        sshd_lab: SshdLab, sshd_host: SshdInstance) -> None:
    with pytest.raises(HostKeyNotRecorded, match=rf"^host h1: cannot record the new SSH host key of "
                                                 rf"\[{re.escape(sshd_host.address)}\]:{sshd_host.port} .*: "
                                                 rf"`ssh.known_hosts` is empty, so host_key_policy: accept-new "
                                                 rf"has no file to record it in"):
        options = dataclasses.replace(sshd_lab.options(Path("unused")), known_hosts=(), host_key_policy="accept-new")
        SshTransport("h1", sshd_host.address, sshd_host.port, options=options).run("true")


def test_reconnects_once_after_sshd_restarts_then_reports_unreachable(
        ssh_transport: SshTransport, sshd_host: SshdInstance,
        caplog: pytest.LogCaptureFixture) -> None:
    port_before = source_port(ssh_transport)
    sshd_host.restart()  # drops every connection, like a host rebooting
    with caplog.at_level(logging.WARNING, logger="cache_qualify.transport"):
        port_after = source_port(ssh_transport)
    assert port_after != port_before
    assert caplog.text.count("reconnecting once") == 1
    sshd_host.stop()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cache_qualify.transport"):
        with pytest.raises(HostUnreachable, match=rf"^host h1: cannot connect to .*@"
                                                  rf"{re.escape(sshd_host.address)}:"
                                                  rf"{sshd_host.port}: Connection refused$"):
            ssh_transport.run("true")
    assert caplog.text.count("reconnecting once") == 1  # one attempt, then the error


def test_connection_lost_during_a_command_is_reported(
        ssh_transport: SshTransport, sshd_host: SshdInstance) -> None:
    ssh_transport.run("true", check=True)
    stopper = threading.Timer(0.5, sshd_host.stop)
    stopper.start()
    with pytest.raises(HostUnreachable, match=r"^host h1: the connection to .* was lost while "
                                              r"'sleep 20' ran; its outcome is unknown$"):
        ssh_transport.run("sleep 20")
    stopper.join()


def test_a_refused_session_is_not_mistaken_for_a_dropped_connection(
        sshd_lab: SshdLab, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    host = sshd_lab.start(extra_config=("MaxSessions 1",))
    try:
        known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts", host)
        with connect(sshd_lab, host, known_hosts) as transport:
            channel = transport.open_channel("cat")  # takes the only session
            with pytest.raises(TransportError, match=r"^host h1: .* refused a new session "
                                                     r"\(channel open failed: Connect failed\); "
                                                     r"its sshd MaxSessions may be lower"):
                transport.run("true")
            assert "reconnecting" not in caplog.text
            channel.close(wait_s=5)
            # sshd frees the session slot just after the close; then the same connection serves again
            wait_for(lambda: transport.run("true").ok, 30, "the session slot freed", ignoring=(TransportError,))
    finally:
        host.stop()


def test_unreachable_address_names_host_address_and_cause(
        sshd_lab: SshdLab, tmp_path: Path) -> None:
    address = "127.0.0.99"
    port = free_port(address)  # nothing listens there
    transport = SshTransport("h3", address, port, options=sshd_lab.options(tmp_path / "kh"))
    with pytest.raises(HostUnreachable, match=rf"^host h3: cannot connect to "
                                              rf".*@127\.0\.0\.99:{port}: Connection refused$"):
        transport.run("true")


@pytest.mark.parametrize("jumped", [False, True], ids=["direct", "through-jump-host"])
@pytest.mark.parametrize(("says", "why"), [
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", r"it answered 'HTTP/1\.1 400 Bad Request' \(an SSH server answers SSH-2\.0-\.\.\.\)"),
    (None, r"it answered TCP but said nothing within 1 s \(an SSH server speaks first\), nor to an SSH greeting"),
], ids=["http", "silent"])
def test_a_server_that_is_not_ssh_is_one_line_naming_host_port_and_what_answered(
        sshd_lab: SshdLab, tmp_path: Path, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest,
        says: bytes | None, why: str, jumped: bool) -> None:
    jump: SshdInstance | None = request.getfixturevalue("sshd_host") if jumped else None
    # through a jump host the probe reads a direct-tcpip channel, which cannot peek
    via = rf" \(reached through jump host .*@{re.escape(jump.address)}:{jump.port}\)" if jump else ""
    with socket.socket() as listener:
        listener.bind(("127.0.0.98", 0))
        listener.listen()
        port = listener.getsockname()[1]
        options = sshd_lab.options(sshd_lab.known_hosts(tmp_path / "kh", *([jump] if jump else [])),
                                   jump=jump, connect_timeout_s=1.0)
        accepted: list[socket.socket] = []

        def answer() -> None:
            accepted.append(listener.accept()[0])
            if says is not None:
                accepted[0].sendall(says)

        threading.Thread(target=answer, daemon=True).start()
        with caplog.at_level(logging.DEBUG), pytest.raises(
                HostUnreachable, match=rf"^host h1: .*@127\.0\.0\.98:{port} is not an SSH server{via}: {why}$"):
            SshTransport("h1", "127.0.0.98", port, options=options).run("true")
        for sock in accepted:
            sock.close()
    assert [r for r in caplog.records if r.name.startswith("paramiko") and r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("jumped", [False, True], ids=["direct", "through-jump-host"])
def test_an_ssh_server_that_waits_for_the_client_is_connected_after_the_probe(
        sshd_lab: SshdLab, jump_pair: tuple[SshdInstance, SshdInstance], tmp_path: Path,
        caplog: pytest.LogCaptureFixture, jumped: bool) -> None:
    jump, target = jump_pair
    with waiting_for_the_client(target, "127.0.0.96") as (port, host_key_line):
        known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts", jump)
        known_hosts.write_text(known_hosts.read_text() + host_key_line)
        # the probe's greeting spent the first connection (or channel): paramiko's goes on a new one
        options = sshd_lab.options(known_hosts, jump=jump if jumped else None, connect_timeout_s=1.0)
        with caplog.at_level(logging.DEBUG), SshTransport("h1", "127.0.0.96", port, options=options) as transport:
            assert transport.run(["echo", "greeted"], check=True).stdout == "greeted\n"
            assert (len(jump.session_pids()) > 0) == jumped
    assert [r for r in caplog.records if r.name.startswith("paramiko") and r.levelno >= logging.ERROR] == []


def test_refused_key_names_the_user_and_the_keys_tried(
        sshd_lab: SshdLab, sshd_host: SshdInstance, tmp_path: Path) -> None:
    stranger = generate_key(tmp_path / "id_stranger", "not-authorized")
    known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts", sshd_host)
    transport = connect(sshd_lab, sshd_host, known_hosts, identity_file=str(stranger))
    with pytest.raises(AuthenticationFailed, match=rf"^host h1: .*@{re.escape(sshd_host.address)}:"
                                                   rf"{sshd_host.port} refused authentication .*"
                                              rf"tried identity file\(s\) .*id_stranger\. "
                                              rf"Check the user"):
        transport.run("true")


def test_missing_identity_file_is_named(
        sshd_lab: SshdLab, sshd_host: SshdInstance, tmp_path: Path) -> None:
    transport = connect(sshd_lab, sshd_host, tmp_path / "kh",
                        identity_file=str(tmp_path / "no_such_key"))
    with pytest.raises(TransportError, match=r"^host h1: the identity file .*no_such_key does "
                                             r"not exist$"):
        transport.run("true")


def test_key_material_is_never_logged(
        sshd_lab: SshdLab, sshd_host: SshdInstance, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    known_hosts = tmp_path / "known_hosts"
    with caplog.at_level(logging.DEBUG):  # every logger, paramiko's included
        with connect(sshd_lab, sshd_host, known_hosts, host_key_policy="accept-new") as ssh:
            ssh.run("true", check=True)
    assert "recorded the new host key" in caplog.text
    private_body = sshd_lab.client_key.read_text().splitlines()[1:-1]
    public_blob = sshd_lab.client_key.with_suffix(".pub").read_text().split()[1]
    for secret in [*private_body, public_blob]:
        assert secret not in caplog.text


def test_missing_sshd_fails_with_an_install_hint(tmp_path: Path) -> None:
    with pytest.raises(SshdUnavailable, match=r"not found at .*/sbin/sshd; install "
                                              r"openssh-server .* fail rather than skip"):
        require_sshd(tmp_path / "sbin" / "sshd")


# --- local port forwards (the `ssh` HTTP route) ----------------------------------------------------

def forwarding_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("forward-")]


def test_forward_carries_http_survives_the_one_reconnect_and_closes_with_the_transport(
        ssh_transport: SshTransport, sshd_host: SshdInstance, stub_servers: Callable[..., StubServer],
        caplog: pytest.LogCaptureFixture) -> None:
    server = stub_servers(sshd_host.address)
    server.serve("/metrics", Reply(body="up 1\n"))
    forward = ssh_transport.forward(server.host, server.port)
    url = f"http://127.0.0.1:{forward.local_port}/metrics"
    with httpx.Client(timeout=5.0) as client:
        assert client.get(url).text == "up 1\n"
        sshd_host.restart()  # drops the connection: the next forwarded connection reconnects, once
        with caplog.at_level(logging.WARNING, logger="cache_qualify.transport"):
            assert client.get(url).text == "up 1\n"  # the same URL, over the new connection
        assert caplog.text.count("reconnecting once") == 1
    assert len(server.requests) == 2
    assert forwarding_threads()
    ssh_transport.close()
    assert forward.closed and forward.connections() == 0
    with pytest.raises(ConnectionRefusedError, match="Connection refused"):
        socket.create_connection(forward.local_address, timeout=2.0).close()
    assert forwarding_threads() == []  # nothing of the forward is left in the runner


def test_forwards_of_several_hosts_serve_at_once(sshd_lab: SshdLab, tmp_path: Path,
                                                 stub_servers: Callable[..., StubServer]) -> None:
    """The metric snapshots of all hosts stay concurrent over forwarded ports: each host answers
    only while all three are asked at once, so forwards that served one at a time never answer."""
    hosts = [sshd_lab.start(f"fwd{i}") for i in range(3)]
    known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts", *hosts)
    servers = [stub_servers(h.address) for h in hosts]
    for server in servers:
        server.serve("/warm", Reply(body="up 1\n"))
    answer = together(Reply(body="up 1\n"), parties=3)
    for server in servers:
        server.serve("/metrics", answer)
    transports = [connect(sshd_lab, h, known_hosts, f"h{i}") for i, h in enumerate(hosts)]
    try:
        bases = [f"http://127.0.0.1:{t.forward(s.host, s.port).local_port}" for t, s in zip(transports, servers)]
        with httpx.Client(timeout=60.0) as client, ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda b: client.get(f"{b}/warm").raise_for_status(), bases))  # connections up
            answers = list(pool.map(lambda b: client.get(f"{b}/metrics"), bases))
        assert [(a.status_code, a.text) for a in answers] == [(200, "up 1\n")] * 3, [a.text for a in answers]
    finally:
        for t in transports:
            t.close()
        for h in hosts:
            h.stop()


def test_tcp_open_tells_a_listening_port_from_a_free_one(
        ssh_transport: SshTransport, sshd_host: SshdInstance, stub_servers: Callable[..., StubServer]) -> None:
    server = stub_servers(sshd_host.address)
    assert ssh_transport.tcp_open(server.host, server.port) is True
    assert ssh_transport.tcp_open(sshd_host.address, free_port(sshd_host.address)) is False


def test_tcp_forwarding_forbidden_by_sshd_is_named(sshd_lab: SshdLab, tmp_path: Path) -> None:
    host = sshd_lab.start("nofwd", extra_config=("AllowTcpForwarding no",))
    try:
        with connect(sshd_lab, host, sshd_lab.known_hosts(tmp_path / "known_hosts", host)) as transport:
            with pytest.raises(TcpRefused, match=rf"^host h1: .*@{re.escape(host.address)}:{host.port} could not "
                                                 rf"connect to {re.escape(host.address)}:\d+ for the runner: .*"
                                                 rf"The `ssh` HTTP route needs TCP forwarding: set "
                                                 rf"AllowTcpForwarding yes"):
                transport.tcp_open(host.address, 80)
    finally:
        host.stop()


def test_the_ssh_route_goes_over_the_hosts_connection(
        sshd_lab: SshdLab, tmp_path: Path, stub_servers: Callable[..., StubServer]) -> None:
    """`port_open` and `http_base_url` over `ssh` reach a port as the host sees it, through its sshd:
    where that sshd forbids forwarding, the `ssh` route fails and the `direct` one still works."""
    host = sshd_lab.start("route")
    closed = sshd_lab.start("noroute", extra_config=("AllowTcpForwarding no",))
    known_hosts = sshd_lab.known_hosts(tmp_path / "known_hosts", host, closed)
    try:
        server = stub_servers(host.address)
        server.serve("/metrics", Reply(body="up 1\n"))
        with connect(sshd_lab, host, known_hosts) as transport:
            assert transport.routes == {"direct", "ssh"}
            assert transport.port_open(server.host, server.port, route="ssh", timeout_s=5.0) is True
            assert transport.port_open(host.address, free_port(host.address), route="ssh", timeout_s=5.0) is False
            base = transport.http_base_url(server.host, server.port, route="ssh")
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+", base) and base != server.url  # a forwarded port
            assert httpx.get(f"{base}/metrics", timeout=5.0).text == "up 1\n"
            assert transport.http_base_url(server.host, server.port, route="direct") == server.url
        with connect(sshd_lab, closed, known_hosts) as transport:
            assert transport.port_open(server.host, server.port, route="direct", timeout_s=5.0) is True
            with pytest.raises(TcpRefused, match=r"^host h1: .* could not connect to .* for the runner: .*The `ssh` "
                                                 r"HTTP route needs TCP forwarding"):
                transport.port_open(server.host, server.port, route="ssh", timeout_s=5.0)
    finally:
        host.stop()
        closed.stop()
