"""The transport contract, over both transports, plus what is specific to LocalTransport.

Tests taking ``any_transport`` run twice: through LocalTransport and through
SshTransport to a real sshd on 127.0.0.x (marked ``sshd``). SSH-only behaviour
(host keys, jump host, reconnect) is in test_transport_ssh.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from cache_qualify.errors import CommandFailed, CommandTimeout, HostUnreachable, TransportError
from cache_qualify.lab.control import free_port
from cache_qualify.lab.transport import LocalTransport, Transport
from tests.support.httpfixtures import StubServer
from tests.support.waiting import wait_for

# every value a shell would interpret if it were not quoted
METACHARACTERS = [
    "a; touch {canary}",
    "$(touch {canary})",
    "`touch {canary}`",
    "x && touch {canary}",
    "x || touch {canary}",
    "x | tee {canary}",
    "> {canary}",
    "line one\ntouch {canary}",
    "'single' \"double\" \\back",
    "*", "/*/", "~", "$HOME", "${{PATH}}", "a\tb", "#comment", "",
]


def live_processes_with(token: str) -> list[int]:
    """PIDs of running (not zombie) processes whose command line contains ``token``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


def test_result_is_a_frozen_value_with_both_streams(any_transport: Transport) -> None:
    result = any_transport.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.host, result.exit_status, result.stdout, result.stderr) == (
        "h1", 3, "out\n", "err\n")
    assert result.command == "sh -c 'echo out; echo err >&2; exit 3'"
    assert not result.ok and 0 < result.duration_s < 10
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'exit_status'"):
        result.exit_status = 0  # type: ignore[misc]


def test_check_raises_with_host_command_status_and_stderr_tail(any_transport: Transport) -> None:
    lines = "; ".join(f"echo line{n} >&2" for n in range(40))
    with pytest.raises(CommandFailed, match=r"(?s)^host h1: command .*exited with status 7, "
                                            r"expected 0\..*line39$") as info:
        any_transport.run(f"{lines}; exit 7", check=True)
    assert "line5\n" not in str(info.value)  # only the tail is quoted
    assert any_transport.run("true", check=True).ok


def test_shell_metacharacters_in_arguments_are_not_interpreted(
        any_transport: Transport, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    values = [value.format(canary=canary) for value in METACHARACTERS]
    result = any_transport.run(["printf", r"%s\0", *values], check=True)
    assert result.stdout.split("\0")[:-1] == values
    assert not canary.exists()


def test_timeout_kills_the_whole_process_group(any_transport: Transport) -> None:
    token = f"{time.time_ns() % 10**6 + 1000}.{uuid.uuid4().int % 10**6}"  # a unique sleep
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match=r"^host h1: command 'sleep .* did not finish "
                                             r"within 1 s; its process group was killed"):
        any_transport.run(f"sleep {token} & sleep {token}; echo never", timeout_s=1)
    assert time.monotonic() - started < 8
    wait_for(lambda: live_processes_with(f"sleep {token}") == [], 30, "every sleep of the killed group gone",
             detail=lambda: f"still running: {live_processes_with(f'sleep {token}')}")


def test_megabytes_on_both_streams_do_not_deadlock(any_transport: Transport) -> None:
    size = 5_000_000
    # all of stderr first: a reader draining stdout first would block the command
    line = (f"head -c {size} /dev/zero | tr '\\0' e >&2; "
            f"head -c {size} /dev/zero | tr '\\0' o")
    result = any_transport.run(line, timeout_s=60, check=True)
    assert len(result.stdout) == size and set(result.stdout) == {"o"}
    assert len(result.stderr) == size and set(result.stderr) == {"e"}


def test_signal_death_reads_as_128_plus_signal(any_transport: Transport) -> None:
    assert any_transport.run("kill -9 $$").exit_status == 128 + 9


def test_stdin_of_a_command_is_empty(any_transport: Transport) -> None:
    assert any_transport.run("cat; echo end", timeout_s=10).stdout == "end\n"


def test_channel_reads_lines_and_ends_when_stdin_closes(
        any_transport: Transport, tmp_path: Path) -> None:
    after = tmp_path / "after-eof"
    channel = any_transport.open_channel(
        f"echo ready; cat > /dev/null; echo bye > {after}")
    assert channel.readline(10) == "ready\n"
    assert channel.readline(0.2) is None  # timeout: nothing more yet
    assert channel.alive()
    channel.close(wait_s=10)
    assert after.read_text() == "bye\n" and not channel.alive()


def test_channel_reports_end_of_output(any_transport: Transport) -> None:
    channel = any_transport.open_channel(["sh", "-c", "echo one; echo two >&2"])
    lines = {channel.readline(10), channel.readline(10)}
    assert lines == {"one\n", "two\n"}  # stderr is merged into the lines
    assert channel.readline(10) == ""
    assert channel.readline(0) == ""  # stays at end of output
    channel.close()


def test_commands_are_logged_with_the_host(
        any_transport: Transport, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="cache_qualify.transport"):
        any_transport.run(["echo", "a b"])
    assert "h1: $ echo 'a b'" in caplog.text
    assert "h1: exit 0 in" in caplog.text


def test_bad_arguments_are_rejected() -> None:
    transport = LocalTransport("h1")
    with pytest.raises(ValueError, match=r"`command` is an empty sequence"):
        transport.run([])
    with pytest.raises(ValueError, match=r"`timeout_s` must be > 0, got 0"):
        transport.run("true", timeout_s=0)
    with pytest.raises(ValueError, match=r"`command_timeout_s` must be > 0, got -1"):
        LocalTransport("h1", command_timeout_s=-1)


def test_local_default_timeout_comes_from_the_transport() -> None:
    with LocalTransport("h2", command_timeout_s=0.5) as transport:
        with pytest.raises(CommandTimeout, match=r"^host h2: .*within 0.5 s"):
            transport.run("sleep 5")


def test_local_channel_runs_outside_the_runners_process_group() -> None:
    """Ctrl-C signals the runner's process group; the channel is in its own session."""
    transport = LocalTransport("h1")
    channel = transport.open_channel("echo ready; cat > /dev/null")
    assert channel.readline(10) == "ready\n"
    pids = live_processes_with("echo ready; cat > /dev/null")
    assert pids and all(os.getpgid(pid) != os.getpgrp() for pid in pids)
    assert channel.alive()
    channel.close(wait_s=10)
    assert not channel.alive()


# --- the runner's way to a port of the host (the HTTP route) ----------------------------------------

def test_the_direct_route_tells_a_listening_port_from_a_free_one(
        any_transport: Transport, stub_servers: Callable[..., StubServer]) -> None:
    server = stub_servers("127.0.0.1")
    assert "direct" in any_transport.routes
    assert any_transport.port_open(server.host, server.port, route="direct", timeout_s=5.0) is True
    assert any_transport.port_open("127.0.0.1", free_port(["127.0.0.1"]), route="direct", timeout_s=5.0) is False
    assert any_transport.http_base_url(server.host, server.port, route="direct") == server.url
    assert any_transport.http_base_url("::1", 8080, route="direct") == "http://[::1]:8080"


def test_an_address_the_runner_cannot_reach_directly_is_named(any_transport: Transport) -> None:
    # a multicast address: no TCP connection can be routed to it, on any machine
    with pytest.raises(HostUnreachable, match=r"^host h1: the runner cannot reach 224\.0\.0\.1:9, the rank's HTTP "
                                              r"port, directly \(http_route: direct\): Network is unreachable\.$"):
        any_transport.port_open("224.0.0.1", 9, route="direct", timeout_s=5.0, what="the rank's HTTP port")


def test_the_local_transport_offers_no_ssh_route() -> None:
    """Its host is this machine: only `direct` (the inventory allows `ssh` with the SSH transport only)."""
    with LocalTransport("h1") as transport:
        assert transport.routes == {"direct"}
        refused = (r"^host h1: the `ssh` HTTP route goes over the host's SSH connection, and LocalTransport has "
                   r"none \(it offers: direct\); set `http_route: direct` for this host$")
        with pytest.raises(TransportError, match=refused):
            transport.http_base_url("127.0.0.1", 8080, route="ssh")
        with pytest.raises(TransportError, match=refused):
            transport.port_open("127.0.0.1", 8080, route="ssh", timeout_s=5.0)
