"""Real OpenSSH sshd instances on loopback addresses, for the suite's own tests.

An ``SshdLab`` owns a temporary folder, one client key (authorized for every
instance) and any number of ``SshdInstance`` s, each a ``/usr/sbin/sshd -D`` with a
throwaway config and its own generated host key, listening on 127.0.0.x at a free
port. Addresses differ per xdist worker so parallel workers never clash. Needs
root (sshd switches to the logged-in user) and openssh-server installed.
"""

from __future__ import annotations

import contextlib
import getpass
import itertools
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cache_qualify import cachedir
from cache_qualify.lab.transport.ssh import JumpHost, SshOptions
from tests.support.waiting import NotInTime, wait_for

SSHD = Path("/usr/sbin/sshd")
INSTALL_HINT = ("OpenSSH's sshd is needed by the SSH tests and was not found at {sshd}; "
                "install openssh-server (e.g. `apt-get install openssh-server`). These tests "
                "fail rather than skip so a CI without sshd cannot pass silently.")
_READY_TIMEOUT_S = 10.0
_ADDRESSES_PER_WORKER = 30


class SshdUnavailable(RuntimeError):
    """sshd (or ssh-keygen) is missing, or an instance did not start."""


def require_sshd(sshd: Path = SSHD) -> None:
    """Raise SshdUnavailable with the install hint unless sshd and ssh-keygen are usable."""
    if not os.access(sshd, os.X_OK) or shutil.which("ssh-keygen") is None:
        raise SshdUnavailable(INSTALL_HINT.format(sshd=sshd))
    if os.geteuid() != 0:
        raise SshdUnavailable("the SSH tests start sshd instances and must run as root")


def generate_key(path: Path, comment: str) -> Path:
    """A new passphrase-less ed25519 key pair at ``path`` (and ``path``.pub)."""
    path.unlink(missing_ok=True)
    path.with_suffix(".pub").unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment,
                    "-f", str(path)], check=True, capture_output=True)
    return path


def free_port(address: str) -> int:
    """A TCP port free on ``address`` right now."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def _worker_base() -> int:
    """The first host byte of this xdist worker's block of 127.0.0.x addresses."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    return 100 + (index % 5) * _ADDRESSES_PER_WORKER


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _is_sshd(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe") == str(SSHD)
    except OSError:
        return False


class SshdInstance:
    """One sshd on ``address``:``port``; can be stopped, restarted, and given a new host key."""

    def __init__(self, name: str, address: str, workdir: Path, authorized_keys: Path,
                 extra_config: tuple[str, ...] = (), *, port: int | None = None,
                 prefix: tuple[str, ...] = ()) -> None:
        self.name = name
        self.extra_config = extra_config
        self.address = address
        self.workdir = workdir
        self.authorized_keys = authorized_keys
        self.host_key = generate_key(workdir / "ssh_host_ed25519_key", f"{name}-host")
        # `prefix` runs sshd elsewhere (``ip netns exec NS``): its port is then given, not probed here
        self.prefix = prefix
        self.port = port if port is not None else free_port(address)
        self.log_path = workdir / "sshd.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def host_key_line(self) -> str:
        """This instance's known_hosts line."""
        public = self.host_key.with_suffix(".pub").read_text().split()
        return f"[{self.address}]:{self.port} {public[0]} {public[1]}\n"

    @staticmethod
    def _environment() -> list[str]:
        """sshd hands its sessions a clean environment: the suite's cache folder (tests/conftest.py)
        is passed on, so a simulated rank started over SSH on this machine uses it, as a local one."""
        folder = os.environ.get(cachedir.ENV)
        return [f"SetEnv {cachedir.ENV}={folder}"] if folder else []

    def _write_config(self) -> Path:
        config = self.workdir / "sshd_config"
        # sshd keeps the first value of a keyword: the extra lines win
        config.write_text("\n".join([
            *self.extra_config, f"Port {self.port}", f"ListenAddress {self.address}",
            f"HostKey {self.host_key}", f"AuthorizedKeysFile {self.authorized_keys}",
            f"PidFile {self.workdir / 'sshd.pid'}",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password", "StrictModes no", "UsePAM no",
            "AllowTcpForwarding yes", "UseDNS no", "PrintMotd no", "PrintLastLog no",
            "MaxStartups 100", "MaxSessions 50", "LogLevel VERBOSE",
            # as a distribution's sshd_config has it: builds are staged over SFTP
            "Subsystem sftp internal-sftp", *self._environment(), "",
        ]))
        return config

    def start(self) -> None:
        """Start sshd and wait until it accepts connections."""
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege-separation dir
        config = self._write_config()
        logged = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen([*self.prefix, str(SSHD), "-D", "-e", "-f", str(config)],
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        process = self._process

        def listening() -> bool:
            if process.poll() is not None:
                raise SshdUnavailable(f"sshd {self.name} on {self.address}:{self.port} exited "
                                      f"at startup:\n{self.log_path.read_text()[-2000:]}")
            return self._listening(logged)

        try:
            wait_for(listening, _READY_TIMEOUT_S, f"sshd {self.name} listening on {self.address}:{self.port}",
                     every_s=0.02)
        except NotInTime as exc:
            self.stop()
            raise SshdUnavailable(str(exc)) from exc

    def _listening(self, logged: int) -> bool:
        """True once sshd accepts connections: probed here, or (run elsewhere) read from its log."""
        if self.prefix:
            with open(self.log_path, "rb") as log:
                log.seek(logged)
                return b"Server listening on" in log.read()
        try:   # its banner, not only the accept: a connection its listener takes but drops is not ready
            with socket.create_connection((self.address, self.port), timeout=2) as probe:
                return probe.recv(4) == b"SSH-"
        except OSError:
            return False

    def session_pids(self) -> list[int]:
        """PIDs of this instance's per-connection sshd processes."""
        if self._process is None:
            return []
        return [pid for pid in _children(self._process.pid) if _is_sshd(pid)]

    def stop(self) -> None:
        """Stop the listener and drop every open connection (like a host going down)."""
        if self._process is None:
            return
        for pid in self.session_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process, self._process = self._process, None
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self, *, new_host_key: bool = False) -> None:
        """Stop (dropping connections) and start again on the same address and port."""
        self.stop()
        if new_host_key:
            generate_key(self.host_key, f"{self.name}-host-new")
        self.start()

    @property
    def pid(self) -> int | None:
        """The listening sshd's PID while it runs."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __repr__(self) -> str:
        return f"SshdInstance({self.name!r}, {self.address}:{self.port})"


class SshdLab:
    """A client key plus the sshd instances started with it; ``stop_all`` cleans up."""

    def __init__(self, root: Path) -> None:
        require_sshd()
        self.root = root
        self.user = getpass.getuser()
        self.client_key = generate_key(root / "id_ed25519", "cache-qualify-tests")
        self.authorized_keys = root / "authorized_keys"
        self.authorized_keys.write_text(self.client_key.with_suffix(".pub").read_text())
        self.instances: list[SshdInstance] = []
        base = _worker_base()
        self._addresses: Iterator[str] = (
            f"127.0.0.{base + n % _ADDRESSES_PER_WORKER}" for n in itertools.count())
        self._names = itertools.count(1)

    def start(self, name: str | None = None, *, extra_config: tuple[str, ...] = (),
              address: str | None = None, port: int | None = None, prefix: tuple[str, ...] = ()
              ) -> SshdInstance:
        """A new running sshd instance on the next address of this worker's block (or on
        `address`:`port`, run under `prefix`, e.g. in a network namespace).

        ``extra_config`` lines (``"MaxSessions 1"``) override the defaults.
        """
        name = name or f"sshd{next(self._names)}"
        workdir = self.root / f"{name}-{len(self.instances)}"
        workdir.mkdir()
        error = SshdUnavailable(f"sshd {name} did not start")
        for _attempt in range(3):  # a free port can be taken between probe and bind
            instance = SshdInstance(name, address or next(self._addresses), workdir, self.authorized_keys,
                                    extra_config, port=port, prefix=prefix)
            try:
                instance.start()
            except SshdUnavailable as exc:
                error = exc
                continue
            self.instances.append(instance)
            return instance
        raise error

    def known_hosts(self, path: Path, *instances: SshdInstance) -> Path:
        """Write a known_hosts file listing ``instances`` (none: an empty file)."""
        path.write_text("".join(instance.host_key_line for instance in instances))
        return path

    def options(self, known_hosts: Path, *, jump: SshdInstance | None = None,
                **overrides: Any) -> SshOptions:
        """SshOptions logging in with the lab's client key, agent off, strict checking."""
        settings: dict[str, Any] = {
            "user": self.user, "identity_file": str(self.client_key), "use_agent": False,
            "known_hosts": (str(known_hosts),), "connect_timeout_s": 5.0,
            "command_timeout_s": 30.0,
        }
        if jump is not None:
            settings["jump"] = JumpHost(address=jump.address, port=jump.port)
        settings.update(overrides)
        return SshOptions(**settings)

    def stop_all(self) -> None:
        for instance in self.instances:
            instance.stop()
        self.instances.clear()


@contextlib.contextmanager
def waiting_for_the_client(instance: SshdInstance, address: str) -> Iterator[tuple[int, str]]:
    """A port on `address` relaying to `instance` that passes nothing back until the client has spoken:
    an SSH server that waits for the client's greeting (sshd speaks first). Yields the port and its
    known_hosts line (`instance`'s key under the relay's address)."""
    listener = socket.create_server((address, 0))
    port = int(listener.getsockname()[1])

    def serve() -> None:
        with contextlib.suppress(OSError):  # the listener closed
            while True:
                client = listener.accept()[0]
                threading.Thread(target=_relay, args=(client, instance), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield port, instance.host_key_line.replace(f"[{instance.address}]:{instance.port}", f"[{address}]:{port}")
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        listener.close()


def _relay(client: socket.socket, instance: SshdInstance) -> None:
    with client, socket.create_connection((instance.address, instance.port)) as upstream:
        first = client.recv(65536)  # sshd's banner waits in `upstream` for the client's first word
        if first:
            upstream.sendall(first)
            back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
            back.start()
            _pipe(client, upstream)
            back.join()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):  # either end gone: the relay ends
        while chunk := source.recv(65536):
            sink.sendall(chunk)
        sink.shutdown(socket.SHUT_WR)
