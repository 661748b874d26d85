"""Preflight: the runner's SSH key exists; every build's command line has the flags its runtime's
cached-tokens field needs, and declares no cache parameter its command line contradicts; every host
reachable with a known key, the drop works without a password, both builds present, the rank's HTTP
port reachable over its route and free, clocks in step. One test per host (its name in the id). They run first, before any server of the run
is up, under pytest-xdist too; a failure stops every scenario before lab time; `--preflight-only` runs
only these. A host that cannot be reached fails once (`test_reachable`); its other checks are skipped
rather than failing alike."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cache_qualify.config.inventory import Host
from cache_qualify.emulation.readable import check_emulator
from cache_qualify.errors import QualifyError
from cache_qualify.lab import preflight
from cache_qualify.lab.transport import Transport
from cache_qualify.session.state import QualifyState

pytestmark = pytest.mark.qualify_preflight


def test_ssh_identity(qualify_state: QualifyState) -> None:
    """The runner's SSH key (the inventory's `ssh.identity`) exists and is readable."""
    preflight.check_ssh_identity(qualify_state.inventory)


def test_build_flags(qualify_state: QualifyState, record_property: Callable[[str, object], None]) -> None:
    """Every build's command line holds the flags the runtime's cached-tokens field needs (a server
    started without them leaves the field out, which reads as nothing cached), and no cache parameter its
    inventory declares is contradicted by its command line. A build whose emulator parameter nobody states
    is recorded as not predicted (`emulator_not_predicted`), never failed; the parameters a start gives are
    recorded as read after it."""
    scenarios = list(qualify_state.setup.resolved.values())
    preflight.check_flags(qualify_state.inventory, scenarios)
    for key, line in check_emulator(qualify_state.inventory, scenarios):
        record_property(key, line)


def test_reachable(connection: tuple[Transport, QualifyError | None]) -> None:
    """The host answers over its transport, with a known host key."""
    _, unreachable = connection
    if unreachable is not None:
        raise unreachable


def test_drop_caches(qualify_state: QualifyState, transport: Transport) -> None:
    """The page cache can be dropped without a password (every trial starts cold)."""
    preflight.check_drop_caches(qualify_state.inventory, transport)


def test_builds_present(qualify_state: QualifyState, lab_host: Host, transport: Transport) -> None:
    """Both builds' executables, and every file their command lines name, exist on the host."""
    preflight.check_builds(qualify_state.inventory, lab_host, transport)


def test_port_free(qualify_state: QualifyState, lab_host: Host, transport: Transport) -> None:
    """Reachable over the HTTP route the runner will use, and free."""
    preflight.check_http_route(qualify_state.inventory, lab_host, transport,
                               kill_stale=bool(qualify_state.config.getoption("cq_kill_stale")))


def test_clock(transport: Transport) -> None:
    """The host's clock is in step with the runner's."""
    preflight.check_clock(transport)
