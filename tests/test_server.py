"""Server lifecycle on real processes: local transport and SSH to loopback sshd hosts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache_qualify.errors import CommandFailed, LockHeld, RankExited, ServerError, StaleServer
from cache_qualify.config.inventory import Inventory, load_inventory
from cache_qualify.lab.control import RUNNING_FUNCTION, Lab, backoff_delays
from cache_qualify.lab.server import ServerGroup
from cache_qualify.trials.measure import read_start
from tests.support.labfixtures import REPO, inventory_port, sim_processes, wait_no_sim_processes, write_inventory
from tests.support.sshd import SshdLab
from tests.support.waiting import wait_for

FLAGS = ("--embedding-table-cache-size", "1G", "--prefix-cache-memory", "0")


def open_lab(inventory: Inventory, run_id: str = "test-run", **kw: float) -> Lab:
    return Lab(inventory, inventory.groups_resolved()[0], run_id=run_id, **kw).open()


@pytest.fixture
def inventory(tmp_path: Path) -> Iterator[Inventory]:
    path = write_inventory(tmp_path)
    yield load_inventory(path)
    assert wait_no_sim_processes(inventory_port(path)) == []


def start_build(lab: Lab, build: str, flags: tuple[str, ...] = FLAGS) -> ServerGroup:
    server = ServerGroup(lab, build, lab.inventory.build(build), flags=flags, tag=f"t-{build}")
    server.check_stale(kill=False)
    server.start()
    return server


def kv_pages_of_a_start(inventory: Inventory) -> tuple[dict[str, int], int]:
    """Start set4 on every host, read each rank's KV pages, stop; the pages and the port the ranks served."""
    with open_lab(inventory) as lab:
        server = start_build(lab, "set4")
        try:
            server.wait_ready()
            # the lab's port: the committed inventory's http_port 0 is picked when the lab opens
            assert len(sim_processes(lab.inventory.server.http_port)) == 3
            pages = read_start(server, inventory.measurement)["kv_pages"].items()
            return {host: int(n) for host, n in pages}, lab.inventory.server.http_port
        finally:
            server.stop()
            server.close()


def test_committed_inventory_starts_reads_kv_pages_and_stops() -> None:
    """The committed hosts.yaml, exactly as a lab runner uses it."""
    inventory = load_inventory(REPO / "hosts.yaml")
    pages, port = kv_pages_of_a_start(inventory)
    assert inventory.server.http_port == 0 and port > 0   # picked when the lab opened, free on every host
    assert sorted(pages) == ["gb10-a", "gb10-b", "gb10-c"]
    assert all(40_500 < p < 42_100 for p in pages.values()), pages  # the RowCache study: 41,358 and 41,301
    assert wait_no_sim_processes(port, timeout_s=1.0) == []


def test_rank_exiting_at_startup_names_host_rank_status_and_error(inventory: Inventory) -> None:
    with open_lab(inventory) as lab:
        server = start_build(lab, "rank1-exits")
        try:
            with pytest.raises(RankExited, match=r"host gb10-b rank 1: rank 1 of build 'rank1-exits' exited "
                                                 r"during startup \(exit status [1-9]\d*\)") as info:
                server.wait_ready(timeout_s=60)
        finally:
            server.stop()
            server.close()
    assert info.value.host == "gb10-b" and info.value.rank == 1
    assert "error" in info.value.log_tail.lower(), info.value.log_tail


def test_a_rank_that_exited_keeps_its_status_beside_it_when_others_are_down_too(inventory: Inventory) -> None:
    """Whether the peers are already down when a rank's exit is found is timing; the message's shape is not."""
    port = inventory.server.http_port
    with open_lab(inventory) as lab:
        server = start_build(lab, "rank1-exits")
        try:
            with pytest.raises(RankExited, match=r"^host gb10-b rank 1: rank 1 of build 'rank1-exits' exited"):
                server.wait_ready(timeout_s=60)
            for pid, _ in sim_processes(port):  # the peers go down too, behind the group's back
                os.kill(pid, signal.SIGKILL)
            assert wait_no_sim_processes(port) == []
            wait_for(lambda: not any(server.status(p).running for p in server.ranks), 60,
                     "each rank's wrapper recorded how it ended")
            with pytest.raises(RankExited, match=r"^host gb10-b rank 1: rank 1 of build 'rank1-exits' exited after "
                                                 r"the peers \(exit status [1-9]\d*\); also not running: rank 2 "
                                                 r"on host gb10-c, rank 0 on host gb10-a\n--- last lines") as info:
                server.check_alive("after the peers")
        finally:
            server.stop()
            server.close()
    assert info.value.exit_status is not None and info.value.exit_status > 0


def test_default_reserve_with_4g_cache_fails_with_the_ranks_error(inventory: Inventory) -> None:
    flags = ("--embedding-table-cache-size", "4G", "--prefix-cache-memory", "0")
    with open_lab(inventory) as lab:
        server = start_build(lab, "set4-default-reserve", flags)
        try:
            with pytest.raises(RankExited, match=r"exited during startup") as info:
                server.wait_ready(timeout_s=60)
        finally:
            server.stop()
            server.close()
    assert "4" in info.value.log_tail and "pages" in info.value.log_tail.lower()


def test_stale_server_is_reported_then_killed_with_kill_stale(inventory: Inventory) -> None:
    with open_lab(inventory) as lab:
        stale = start_build(lab, "set4")  # an earlier run that never stopped its ranks
        stale.wait_ready()
        fresh = ServerGroup(lab, "set4", inventory.build("set4"), flags=FLAGS, tag="t-fresh")
        with pytest.raises(StaleServer, match=r"host gb10-a rank 0: a server from an earlier run is still "
                                              r"running \(process group \d+"):
            fresh.check_stale(kill=False)
        fresh.check_stale(kill=True)
        assert wait_no_sim_processes(inventory.server.http_port) == []
        stale.close()
        fresh.close()


def test_unrecorded_process_on_the_port_is_reported(inventory: Inventory) -> None:
    import socket

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.12", inventory.server.http_port))
        squatter.listen()
        with open_lab(inventory) as lab:
            server = ServerGroup(lab, "set4", inventory.build("set4"), flags=FLAGS)
            with pytest.raises(StaleServer, match=rf"host gb10-b rank 1: port {inventory.server.http_port} on "
                                                  r"127.0.0.12 is already in use"):
                server.check_stale(kill=False)
            server.close()


def test_closing_the_lab_stops_servers_the_runner_left(inventory: Inventory) -> None:
    """The lock holder's release command stops whatever the runner recorded, and removes the records."""
    lab = open_lab(inventory)
    server = start_build(lab, "set4")
    server.wait_ready()
    assert len(sim_processes(inventory.server.http_port)) == 3
    records = [Path(p.pgid_path) for p in server.ranks]
    assert all(r.is_file() for r in records), records
    lab.close()  # no server.stop(): as if the runner forgot
    server.close()
    assert wait_no_sim_processes(inventory.server.http_port) == []
    assert [r for r in records if r.exists()] == [], "a process-group record outlived its group"


@pytest.mark.slow
def test_sigkilled_runner_leaves_no_server_and_no_lock(tmp_path: Path) -> None:
    path = write_inventory(tmp_path)
    port = inventory_port(path)
    runner = textwrap.dedent(f"""
        import sys, time
        from cache_qualify.config.inventory import load_inventory
        from cache_qualify.lab.control import Lab
        from cache_qualify.lab.server import ServerGroup
        inv = load_inventory({str(path)!r})
        lab = Lab(inv, inv.groups_resolved()[0], run_id="doomed").open()
        server = ServerGroup(lab, "set4", inv.build("set4"), flags={list(FLAGS)!r})
        server.start(); server.wait_ready()
        print("READY", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", runner], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        assert len(sim_processes(port)) == 3
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_no_sim_processes(port, timeout_s=30) == []
        # and the lock is free: a new runner takes every host (once the holder finished stopping)
        inventory = load_inventory(path)
        with open_lab(inventory, run_id="next", lock_wait_s=15):
            pass
    finally:
        proc.kill()


def test_second_runner_is_told_who_holds_the_hosts(inventory: Inventory) -> None:
    with open_lab(inventory, run_id="first-run"):
        with pytest.raises(LockHeld, match=r"host gb10-a: the lock .* is held by user \S+ on runner \S+ "
                                           r"\(run first-run, pid \d+\) since \S+"):
            open_lab(inventory, run_id="second-run")


def test_failing_page_cache_drop_names_the_host(tmp_path: Path) -> None:
    path = write_inventory(tmp_path, server={"drop_caches": "echo 'sudo: a password is required' >&2; exit 1"})
    with open_lab(load_inventory(path)) as lab:
        with pytest.raises(CommandFailed, match=r"host gb10-\w: dropping the page cache failed with status 1: "
                                                r"sudo: a password is required"):
            lab.drop_caches()


def test_page_cache_drop_is_recorded_per_host(inventory: Inventory) -> None:
    with open_lab(inventory) as lab:
        records = lab.drop_caches()
    assert [r.host for r in records] == ["gb10-a", "gb10-b", "gb10-c"]
    assert all(r.ok for r in records)


@pytest.mark.slow
@pytest.mark.sshd
def test_three_rank_server_over_ssh(sshd_lab: SshdLab, tmp_path: Path) -> None:
    """Three loopback sshd hosts: start, read KV pages, stop, nothing left."""
    instances = [sshd_lab.start(f"gb10-{c}") for c in "abc"]
    known = sshd_lab.known_hosts(tmp_path / "known_hosts", *instances)
    hosts = [{"name": f"gb10-{c}", "address": inst.address, "port": inst.port, "rank": r, "transport": "ssh"}
             for r, (c, inst) in enumerate(zip("abc", instances))]
    ssh = {"user": sshd_lab.user, "identity_file": str(sshd_lab.client_key), "use_agent": False,
           "known_hosts": [str(known)], "host_key_policy": "strict", "connect_timeout_s": 5,
           "command_timeout_s": 60}
    path = write_inventory(tmp_path, hosts=hosts, ssh=ssh)
    inventory = load_inventory(path)
    pages, port = kv_pages_of_a_start(inventory)
    assert port == inventory.server.http_port   # the inventory's own port (0 is for the committed one)
    assert sorted(pages) == ["gb10-a", "gb10-b", "gb10-c"]
    assert all(40_500 < p < 42_100 for p in pages.values())
    assert wait_no_sim_processes(port, timeout_s=2.0) == []


def test_a_group_of_zombies_counts_as_stopped_and_a_live_one_as_running() -> None:
    """`running` (the stop's and the lock release's check) sees through zombies, which `kill -0`
    counts: an orphaned rank waits for the host's init to reap it, here up to a second. Run with
    an empty PATH: minimal images have no procps, and the check uses shell built-ins only."""
    leader = subprocess.Popen(["setsid", "sleep", "60"])  # its own session and group; we reap it
    try:
        def check(group: int) -> str:
            line = f"{RUNNING_FUNCTION}; running {group} && echo running || echo gone; kill -0 -{group} && echo exists"
            return subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, timeout=30,
                                  env={"PATH": "/nonexistent"}).stdout

        wait_for(lambda: os.getsid(leader.pid) == leader.pid, 30, "setsid made the leader's session", every_s=0.01)
        assert check(leader.pid).split() == ["running", "exists"]
        leader.kill()
        wait_for(lambda: open(f"/proc/{leader.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", 30,
                 "the killed leader a zombie", every_s=0.01)
        assert check(leader.pid).split() == ["gone", "exists"]  # a zombie: dead, not yet reaped
    finally:
        leader.kill()
        leader.wait()


def test_backoff_starts_short_doubles_and_covers_the_wait() -> None:
    assert backoff_delays(0.5) == [0.01, 0.02, 0.04, 0.08, 0.1, 0.1, 0.1, 0.1]
    assert backoff_delays(0.001) == [0.01]
    assert backoff_delays(1.0, first_s=0.05, cap_s=0.2) == [0.05, 0.1, 0.2, 0.2, 0.2, 0.2, 0.2]


LATE_LOG_SERVER = textwrap.dedent('''
    """Answers every GET with 200 at once, and writes its KV line only `delay` seconds later (as
    llama-server may, by a few milliseconds, after it answers /health)."""
    import http.server, sys, threading
    address, port, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *args):
            pass
    if delay >= 0:
        threading.Timer(delay, lambda: print("initializing, n_slots = 1, n_ctx_slot = 4,096", flush=True)).start()
    http.server.HTTPServer((address, port), Ready).serve_forever()
''')


def test_a_log_line_written_after_ready_is_waited_for_and_one_never_written_is_named(tmp_path: Path) -> None:
    script = tmp_path / "late_log_server.py"
    script.write_text(LATE_LOG_SERVER, encoding="utf-8")
    builds = {"late": {"path": str(script), "flags": ["0.4"]}, "never": {"path": str(script), "flags": ["-1"]}}
    path = write_inventory(tmp_path, builds=builds, server={
        "command": "{python} {build_path} {address} {port} {flags}",
        "kv_pages": {"log_regex": r"n_ctx_slot = ([\d,]+)"}, "readiness": {"path": "/", "timeout_s": 30}})
    inventory = load_inventory(path)
    with open_lab(inventory) as lab:
        for build, expected in (("late", 4_096), ("never", None)):
            server = ServerGroup(lab, build, inventory.build(build), tag=f"t-{build}")
            server.start()
            try:
                server.wait_ready()
                if expected is not None:
                    read = read_start(server, inventory.measurement)["kv_pages"]
                    assert set(read.values()) == {expected} and len(read) == 3
                else:
                    with pytest.raises(ServerError, match=r"host gb10-a rank 0: no line of the rank's log matches "
                                                          r"the regex 'n_ctx_slot = \(\[\\\\d,\]\+\)' \(read for "
                                                          r"0\.3 s after it was ready\)"):
                        server.number_from_log(r"n_ctx_slot = ([\d,]+)", wait_s=0.3)
            finally:
                server.stop()
                server.close()
