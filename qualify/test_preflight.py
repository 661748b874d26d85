"""Preflight: the runner's SSH key exists; every host reachable with a known key, the drop works
without a password, both builds present, the rank's HTTP port reachable over its route and free,
clocks in step. Runs first; `--preflight-only` runs only these. A host that cannot be reached
fails once (`test_reachable`); its other checks are skipped rather than failing alike.

Under pytest-xdist (`-n N`, loadgroup) too: these tests are handed out before any scenario's
group, each one's outcome is recorded in the run folder (`preflight/<session>/`), and a worker
waits for all of them before its first scenario test, so no server of the run is up while one of
them runs (`test_port_free` sees only other runners' servers) and a failure on any worker stops
every scenario (cache_qualify.plugin)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cache_qualify.errors import QualifyError
from cache_qualify.lab import preflight
from cache_qualify.config.inventory import Host
from cache_qualify.plugin import state_of
from cache_qualify.session.state import QualifyState
from cache_qualify.lab.transport import Transport

pytestmark = pytest.mark.qualify_preflight


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "lab_host" in metafunc.fixturenames:
        hosts = state_of(metafunc.config).inventory.hosts
        metafunc.parametrize("lab_host", hosts, ids=[h.name for h in hosts], scope="module")


@pytest.fixture(scope="module")
def connection(qualify_state: QualifyState, lab_host: Host) -> Iterator[tuple[Transport, QualifyError | None]]:
    """The host's transport, and why it cannot be reached (None when it can): tried once per host."""
    from cache_qualify.lab.control import transport_for

    with transport_for(qualify_state.inventory, lab_host) as t:
        try:
            preflight.check_reachable(t)
        except QualifyError as exc:
            yield t, exc
        else:
            yield t, None


@pytest.fixture
def transport(connection: tuple[Transport, QualifyError | None]) -> Transport:
    """The transport of a reachable host; the checks of an unreachable one are skipped."""
    t, unreachable = connection
    if unreachable is not None:
        pytest.skip(f"host {t.host} is unreachable (test_reachable says why)")
    return t


def test_ssh_identity(qualify_state: QualifyState) -> None:
    preflight.check_ssh_identity(qualify_state.inventory)


def test_reachable(connection: tuple[Transport, QualifyError | None]) -> None:
    _, unreachable = connection
    if unreachable is not None:
        raise unreachable


def test_drop_caches(qualify_state: QualifyState, transport: Transport) -> None:
    preflight.check_drop_caches(qualify_state.inventory, transport)


def test_builds_present(qualify_state: QualifyState, lab_host: Host, transport: Transport) -> None:
    preflight.check_builds(qualify_state.inventory, lab_host, transport)


def test_port_free(qualify_state: QualifyState, lab_host: Host, transport: Transport) -> None:
    """Reachable over the HTTP route the runner will use, and free."""
    preflight.check_http_route(qualify_state.inventory, lab_host, transport,
                               kill_stale=bool(qualify_state.config.getoption("cq_kill_stale")))


def test_clock(transport: Transport) -> None:
    preflight.check_clock(transport)
