"""`cache_qualify.lab.control` apart from a whole lab: the free port a lab on one machine shares, and
the simulated lab's state, which is each checkout's own."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from cache_qualify.config.inventory import Inventory, InventoryError, load_inventory
from cache_qualify.errors import NoFreePort
from cache_qualify.lab.control import Lab, free_port
from tests.support.labfixtures import REPO, write_file


def test_free_port_binds_on_every_address() -> None:
    port = free_port(["127.0.0.11", "127.0.0.12", "127.0.0.13"])
    for address in ("127.0.0.11", "127.0.0.12", "127.0.0.13"):
        with socket.socket() as sock:
            sock.bind((address, port))


def test_no_port_free_on_every_address_names_the_addresses() -> None:
    # a documentation address (TEST-NET-2) is no machine's own: no port binds there
    with pytest.raises(NoFreePort, match=r"^found no TCP port free on all of 127\.0\.0\.1, 198\.51\.100\.1: 50 ports "
                                         r"free on 127\.0\.0\.1 were each taken \(or not this machine's\)") as caught:
        free_port(["127.0.0.1", "198.51.100.1"])
    assert caught.value.addresses == ("127.0.0.1", "198.51.100.1")


def test_an_address_that_is_not_this_machines_is_named() -> None:
    with pytest.raises(NoFreePort, match=r"^cannot bind a TCP port on 198\.51\.100\.1: Cannot assign requested "
                                         r"address; every address of a lab on one machine must be this machine's"):
        free_port(["198.51.100.1", "127.0.0.1"])


def checkout(tmp_path: Path, name: str) -> Inventory:
    """The committed hosts.yaml as a clone named `name` has it (its own directory)."""
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(REPO / "hosts.yaml", folder / "hosts.yaml")
    return load_inventory(folder / "hosts.yaml")


def test_two_checkouts_of_the_simulated_lab_never_share_its_state_or_its_port(tmp_path: Path) -> None:
    first, second = checkout(tmp_path, "clone-a"), checkout(tmp_path, "clone-b")
    group = first.groups_resolved()[0]
    with Lab(first, group, run_id="a").open() as lab_a, Lab(second, group, run_id="b").open() as lab_b:
        # both hold every host of their lab at once: neither waits for the other
        assert all(lock.held for lock in lab_a._locks + lab_b._locks)
        host = group.hosts[0]
        assert lab_a.dir(host) == str(tmp_path / "clone-a" / ".sim-lab" / host.name)
        assert lab_b.dir(host) == str(tmp_path / "clone-b" / ".sim-lab" / host.name)
        ports = lab_a.inventory.server.http_port, lab_b.inventory.server.http_port
        assert 0 not in ports and ports[0] != ports[1]
        assert ":" + str(ports[0]) in lab_a.http_base(host)


def test_a_relative_run_dir_or_a_picked_port_is_refused_for_a_host_over_ssh(tmp_path: Path) -> None:
    text = (REPO / "hosts.yaml").read_text(encoding="utf-8")
    ssh_host = text.replace("transport: local}", "transport: ssh}", 1)
    # both fields in one message, with what the preflight checks next: no round trip per field
    with pytest.raises(InventoryError, match=r"server\.run_dir: expected an absolute path: host 'gb10-a' is "
                                             r"reached over SSH, .*; also server\.http_port: expected a port "
                                             r"number: 0 \(picked here\) .*; then the preflight's test_reachable "
                                             r"checks the SSH login \(`ssh:` user, identity_file, known_hosts\)$"):
        load_inventory(write_file(tmp_path, ssh_host, "hosts.yaml"))
    absolute = ssh_host.replace("run_dir: .sim-lab", f"run_dir: {tmp_path}")
    with pytest.raises(InventoryError, match=r"server\.http_port: expected a port number: 0 \(picked here\) is for "
                                             r"hosts of this machine only"):
        load_inventory(write_file(tmp_path, absolute, "hosts.yaml"))
