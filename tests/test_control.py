"""`cache_qualify.lab.control` apart from a whole lab: the free port a lab on one machine shares."""

from __future__ import annotations

import socket

import pytest

from cache_qualify.errors import NoFreePort
from cache_qualify.lab.control import free_port


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
