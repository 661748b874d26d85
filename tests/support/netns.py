"""Network namespaces made by a test, for hosts the runner cannot reach directly.

A :class:`Netns` is a fresh namespace (``ip netns add``) with its loopback up;
:func:`veth` joins two of them with a veth pair of private addresses. Nothing
is routed anywhere else: a namespace made here has no default route, so its
traffic stays inside the namespaces the test made. ``delete`` kills every
process left in the namespace and removes it (its veth end goes with it).
Needs root and iproute2 (``ip``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence

from tests.support.waiting import NotInTime, wait_for

_counter = itertools.count()
PREFIX = "cq-test-"


class NetnsUnavailable(RuntimeError):
    """`ip netns` cannot be used here (not root, or iproute2 missing)."""


def require_netns() -> None:
    """Raise NetnsUnavailable with the fix unless namespaces can be made."""
    if shutil.which("ip") is None:
        raise NetnsUnavailable("the bastion tests make network namespaces with `ip netns` and `ip` was not found; "
                               "install iproute2 (e.g. `apt-get install iproute2`). They fail rather than skip "
                               "so a CI without it cannot pass silently.")
    if os.geteuid() != 0:
        raise NetnsUnavailable("the bastion tests make network namespaces and must run as root")


def ip(*args: str) -> str:
    """Run ``ip ARGS``; its stdout (an error names the command and what ip said)."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed with status {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    """Names of the network namespaces that exist now."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


class Netns:
    """One namespace, named after the test process so parallel workers never clash."""

    def __init__(self, role: str) -> None:
        require_netns()
        self.name = f"{PREFIX}{os.getpid()}-{next(_counter)}-{role}"
        ip("netns", "add", self.name)
        try:
            ip("-n", self.name, "link", "set", "lo", "up")
        except NetnsUnavailable:
            self.delete()
            raise

    def exec_prefix(self) -> tuple[str, ...]:
        """What runs a command inside this namespace."""
        return ("ip", "netns", "exec", self.name)

    def argv(self, command: Sequence[str]) -> list[str]:
        return [*self.exec_prefix(), *command]

    def add_address(self, address: str, device: str = "lo") -> None:
        """`address`/32 on `device` (on lo: a host address only this namespace reaches)."""
        ip("-n", self.name, "addr", "add", f"{address}/32", "dev", device)

    def pids(self) -> list[int]:
        """Processes running in this namespace."""
        return [int(p) for p in ip("netns", "pids", self.name).split()]

    def listening(self) -> str:
        """``ss -tln`` inside the namespace (what accepts TCP connections there)."""
        return subprocess.run(self.argv(["ss", "-Htln"]), capture_output=True, text=True, timeout=30).stdout

    def delete(self, grace_s: float = 5.0) -> list[int]:
        """Kill what is left in the namespace, then remove it; returns the PIDs that had to be killed."""
        left = self.pids() if self.name in namespaces() else []
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if left:   # removed either way: what outlives the grace is what the caller reports
            with contextlib.suppress(NotInTime):
                wait_for(lambda: not self.pids(), grace_s, f"the killed processes of {self.name} gone")
        if self.name in namespaces():
            ip("netns", "del", self.name)
        return left


def veth(a: Netns, address_a: str, b: Netns, address_b: str, prefix_len: int = 30) -> None:
    """A veth pair between `a` and `b` with the two addresses on one small private subnet."""
    ip("link", "add", "cq0", "netns", a.name, "type", "veth", "peer", "name", "cq0", "netns", b.name)
    for ns, address in ((a, address_a), (b, address_b)):
        ip("-n", ns.name, "addr", "add", f"{address}/{prefix_len}", "dev", "cq0")
        ip("-n", ns.name, "link", "set", "cq0", "up")


def leftovers_of(pid: int) -> list[str]:
    """Namespaces a (finished) test process made and did not remove."""
    return [name for name in namespaces() if name.startswith(f"{PREFIX}{pid}-")]


__all__ = ["Netns", "NetnsUnavailable", "leftovers_of", "namespaces", "require_netns", "veth"]
