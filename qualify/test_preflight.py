"""Preflight: every host reachable with a known key, the drop works without a password,
both builds present, the server port free, clocks in step. Runs first; `--preflight-only`
runs only these."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cache_qualify.lab import preflight
from cache_qualify.config.inventory import Host
from cache_qualify.plugin import QualifyState, state_of
from cache_qualify.lab.transport import Transport

pytestmark = pytest.mark.qualify_preflight


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "lab_host" in metafunc.fixturenames:
        hosts = state_of(metafunc.config).inventory.hosts
        metafunc.parametrize("lab_host", hosts, ids=[h.name for h in hosts], scope="module")


@pytest.fixture(scope="module")
def transport(qualify_state: QualifyState, lab_host: Host) -> Iterator[Transport]:
    from cache_qualify.lab.control import transport_for

    with transport_for(qualify_state.inventory, lab_host) as t:
        yield t


def test_reachable(transport: Transport) -> None:
    preflight.check_reachable(transport)


def test_drop_caches(qualify_state: QualifyState, transport: Transport) -> None:
    preflight.check_drop_caches(qualify_state.inventory, transport)


def test_builds_present(qualify_state: QualifyState, lab_host: Host, transport: Transport) -> None:
    preflight.check_builds(qualify_state.inventory, lab_host, transport)


def test_port_free(qualify_state: QualifyState, lab_host: Host, transport: Transport) -> None:
    preflight.check_port_free(qualify_state.inventory, lab_host, transport,
                              kill_stale=bool(qualify_state.config.getoption("cq_kill_stale")))


def test_clock(transport: Transport) -> None:
    preflight.check_clock(transport)
