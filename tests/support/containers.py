"""A real container engine and a real registry on loopback, for the tests of `image` builds.

podman with runc and explicit limits (this kind of machine's cgroups refuse crun, and its hard limits
refuse podman's default ones), Debian's `docker-registry` (the CNCF distribution registry) on a free
loopback port, and images made from a root filesystem (`podman import`), pushed there and pulled by
digest. The registry speaks plain HTTP: a registries.conf naming it insecure is put in the
environment (CONTAINERS_REGISTRIES_CONF), which every command the suite runs on a local host inherits.
Without podman, runc or docker-registry these tests fail, never skip.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.waiting import wait_for

ENGINE_OPTIONS = ("--runtime", "runc")
RUN_OPTIONS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
SUITE_LABEL = "cache-qualify.run"


class ContainersUnavailable(RuntimeError):
    """podman, runc or docker-registry is missing."""


def require() -> None:
    missing = [tool for tool in ("podman", "runc", "docker-registry") if shutil.which(tool) is None]
    if missing:
        raise ContainersUnavailable(f"{', '.join(missing)} not installed: apt-get install -y podman runc "
                                    f"docker-registry (the README's test command installs them)")


def podman(*args: str, check: bool = True, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *ENGINE_OPTIONS, *args], capture_output=True, text=True, check=check,
                          timeout=timeout_s)


def suite_containers(under: Path | None = None) -> list[str]:
    """Every container the suite labelled (running or not), by name; `under`: only those of host folders
    under it (a test's own: tests on other xdist workers run containers of their own meanwhile)."""
    listed = podman("ps", "-a", "--filter", f"label={SUITE_LABEL}", "--format",
                    '{{.Names}} {{index .Labels "cache-qualify.dir"}}').stdout.splitlines()
    pairs = [(line.split(" ", 1) + [""])[:2] for line in listed if line.strip()]
    return [name for name, folder in pairs if under is None or folder.startswith(f"{under}/")]


@dataclass
class Registry:
    """A distribution registry serving on 127.0.0.1:`port`, its storage under `root`."""

    root: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def push_rootfs(self, name: str, tag: str, files: Mapping[str, Path | bytes]) -> tuple[str, str]:
        """An image of `files` (path in the image -> the runner's file, or its bytes; executable), pushed
        here as name:tag and removed from the local store (so a start must pull it): (reference, digest)."""
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for inside, content in files.items():
                data = content.read_bytes() if isinstance(content, Path) else content
                info = tarfile.TarInfo(inside.lstrip("/"))
                info.size, info.mode = len(data), 0o755
                tar.addfile(info, io.BytesIO(data))
        rootfs = self.root.parent / f"{name}-{tag}.tar"
        rootfs.write_bytes(archive.getvalue())
        reference = f"{self.address}/{name}:{tag}"
        podman("import", str(rootfs), reference)
        digest_file = self.root.parent / f"{name}-{tag}.digest"
        podman("push", "--digestfile", str(digest_file), reference)   # the manifest's digest as the registry holds it
        digest = digest_file.read_text(encoding="utf-8").strip()
        podman("rmi", "-f", reference)
        return reference, digest

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@contextlib.contextmanager
def stalled_registry() -> Iterator[str]:
    """The address of a registry that accepts connections and never answers (a stalled one): a pull from it
    hangs until it is stopped."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for connection in (*held, server):
            connection.close()


def processes_naming(text: str) -> list[str]:
    """The command lines of the processes whose command line holds `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if entry.name.isdigit() and text in line and entry.name != str(os.getpid()):
                found.append(line.strip())
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_registry(folder: Path) -> Iterator[Registry]:
    """A registry on a free loopback port, and its address named insecure in CONTAINERS_REGISTRIES_CONF for
    the test's processes (restored afterwards); stopped at the end."""
    require()
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    config = folder / "registry.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {folder / 'storage'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n", encoding="utf-8")
    conf = folder / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "127.0.0.1:{port}"\ninsecure = true\n', encoding="utf-8")
    log = (folder / "registry.log").open("wb")
    process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    before = os.environ.get("CONTAINERS_REGISTRIES_CONF")
    os.environ["CONTAINERS_REGISTRIES_CONF"] = str(conf)
    registry = Registry(folder, port, process)
    try:
        wait_for(lambda: _answers(port), 20.0, f"the registry answering on 127.0.0.1:{port}", every_s=0.1)
        yield registry
    finally:
        registry.stop()
        log.close()
        _remove_images(registry.address)
        if before is None:
            os.environ.pop("CONTAINERS_REGISTRIES_CONF", None)
        else:
            os.environ["CONTAINERS_REGISTRIES_CONF"] = before


def _remove_images(address: str) -> None:
    """The images the tests pulled from the registry at `address`, out of the engine's store (each test session's
    registry has a port of its own: they would pile up)."""
    listed = podman("images", "--format", "{{.ID}} {{.Repository}}", check=False).stdout.splitlines()
    ids = sorted({line.split()[0] for line in listed if line.split()[1:2] and line.split()[1].startswith(address + "/")})
    if ids:
        podman("rmi", "-f", *ids, check=False)


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def program_files(binary: Path, inside: str) -> dict[str, Path]:
    """A root filesystem's files running `binary` as `inside`: the binary, and the shared libraries (and the
    loader) `ldd` names when it is not static, at their own paths."""
    files: dict[str, Path] = {inside: binary}
    listed = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False).stdout
    for line in listed.splitlines():
        words = line.split()
        path = next((w for w in words if w.startswith("/")), None)
        if path is not None:
            files[path] = Path(path).resolve()
    return files


def remove_suite_containers(under: Path | None = None) -> list[str]:
    """Remove every container the suite labelled (under `under`, as `suite_containers`); the names removed
    (a test's leftovers)."""
    names = suite_containers(under)
    if names:
        podman("rm", "-f", *names, check=False)
    return names


def kill_lock_holders(under: Path) -> int:
    """SIGKILL the process group of every host-lock holder of host folders under `under` (as if the holders
    died with the runner): none of them runs its release. How many groups were killed."""
    groups = set()
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if entry.name.isdigit() and "flock -o" in line and f"{under}/" in line:
                groups.add(os.getpgid(int(entry.name)))
        except (OSError, ProcessLookupError):
            continue
    for group in groups:
        os.killpg(group, signal.SIGKILL)
    return len(groups)


__all__ = ["ContainersUnavailable", "ENGINE_OPTIONS", "RUN_OPTIONS", "Registry", "kill_lock_holders", "podman",
           "processes_naming", "program_files", "remove_suite_containers", "stalled_registry",
           "require", "start_registry", "suite_containers"]
