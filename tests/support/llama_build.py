"""llama-server, built CPU-only from the llama.cpp source vendored in a pinned llama-cpp-python sdist.

``python -m tests.support.llama_build`` builds it unless it is built already and prints
the binary's path; the tests' fixture calls `ensure_built` the same way. The sdist comes
with pip's ordinary client (``pip download --no-binary :all:``), only its
``vendor/llama.cpp`` is unpacked, and cmake builds the one target ``llama-server``,
static (one file, movable), for a generic x86-64/arm64 CPU (no ``-march=native``: the
cache may be shared by machines), without TLS, curl or the web UI.

The build is kept outside the checkout, one folder per version
(``$CACHE_QUALIFY_LLAMA_DIR`` or ``${XDG_CACHE_HOME:-~/.cache}/cache-qualify``, then
``llama-server/<version>/``), so a rerun reuses it. It is built in a temporary folder
beside that one and renamed into place whole, with a ``build.json`` of what it was built
from: a cut build is never taken for a finished one, and a build of other options is
rebuilt. A lock beside the folders makes concurrent callers (two xdist workers) wait
for one build instead of running two.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

VERSION = "0.3.36"   # llama-cpp-python; its sdist vendors llama.cpp 0.5.0-dev
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_CCACHE=OFF",
)
TARGET = "llama-server"
LOG_TAIL_LINES = 40
_RECORD = "build.json"


class BuildFailed(Exception):
    """llama-server could not be built; the message ends with the build log's last lines."""


BUILD_DIR_ENV = "CACHE_QUALIFY_LLAMA_DIR"


def cache_root() -> Path:
    """Where builds are kept, outside any checkout: ``$CACHE_QUALIFY_LLAMA_DIR``, else the user's cache
    folder's ``cache-qualify``. Not the suite's own cache folder (``$CACHE_QUALIFY_CACHE_DIR``), which
    the test session points at a folder of its own: the build made before the session (the README's
    test command) must be the one the session finds."""
    return user_cache_root(BUILD_DIR_ENV)


def user_cache_root(env: str) -> Path:
    """``$env`` when set, else the user's cache folder's ``cache-qualify`` (every real server's)."""
    explicit = os.environ.get(env)
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cache-qualify"


def install_dir(version: str = VERSION) -> Path:
    return cache_root() / "llama-server" / version


def _record(version: str) -> dict[str, object]:
    return {"llama-cpp-python": version, "cmake_options": list(CMAKE_OPTIONS), "target": TARGET}


def built_binary(version: str = VERSION) -> Path | None:
    """The finished build of `version` with today's options, or None."""
    folder = install_dir(version)
    try:
        recorded = json.loads((folder / _RECORD).read_text())
    except (OSError, ValueError):
        return None
    binary = folder / TARGET
    return binary if recorded == _record(version) and binary.is_file() else None


def ensure_built(version: str = VERSION, *, jobs: int | None = None) -> Path:
    """The llama-server binary of `version`, built first if it is missing (or of other options).

    Raises :class:`BuildFailed` with the log's tail when a step fails.
    """
    return made_once(install_dir(version).parent, version, lambda: built_binary(version),
                     lambda parent: _build(version, parent, jobs or os.cpu_count() or 1))


def made_once(parent: Path, version: str, find: Callable[[], Path | None], make: Callable[[Path], Path]) -> Path:
    """What `find` finds, else what `make(parent)` makes, under a lock beside the versions' folders:
    concurrent callers (two xdist workers) wait for one make, then use it."""
    found = find()
    if found is not None:
        return found
    parent.mkdir(parents=True, exist_ok=True)
    with open(parent / f"{version}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # another caller's make: wait for it, then use it
        found = find()
        return found if found is not None else make(parent)


def _build(version: str, parent: Path, jobs: int) -> Path:
    log_path = parent / f"{version}.log"   # kept after the build, failed or not
    work = Path(tempfile.mkdtemp(prefix=f".{version}-building-", dir=parent))
    try:
        with open(log_path, "w") as log:
            def run(*command: str) -> None:
                log.write(f"$ {' '.join(command)}\n")
                log.flush()
                try:
                    done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, check=False)
                except FileNotFoundError as exc:
                    raise BuildFailed(f"{command[0]} is not installed ({exc}); the build needs "
                                      f"cmake and g++ (apt-get install -y cmake g++)") from exc
                if done.returncode != 0:
                    raise BuildFailed(f"`{' '.join(command)}` exited with status {done.returncode}")

            started = time.monotonic()
            run(sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                "--disable-pip-version-check", "-q", "-d", str(work), f"llama-cpp-python=={version}")
            source = _unpack_llama_cpp(work, version, run)
            build = work / "build"
            run("cmake", "-S", str(source), "-B", str(build), *CMAKE_OPTIONS)
            run("cmake", "--build", str(build), "--target", TARGET, "-j", str(jobs))
            staged = work / "install"
            staged.mkdir()
            shutil.copy2(build / "bin" / TARGET, staged / TARGET)
            (staged / _RECORD).write_text(json.dumps(_record(version), indent=1) + "\n")
            _move_into_place(staged, install_dir(version), work)
            log.write(f"built {install_dir(version) / TARGET} in {time.monotonic() - started:.0f} s\n")
    except BuildFailed as exc:
        raise BuildFailed(f"building llama-server {version} failed: {exc}; the log "
                          f"{log_path} ends:\n{_tail(log_path)}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return install_dir(version) / TARGET


def _unpack_llama_cpp(work: Path, version: str, run: Callable[..., None]) -> Path:
    """Unpack only the sdist's vendored llama.cpp (about a third of the archive) into `work`."""
    sdists = sorted(work.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        raise BuildFailed(f"pip saved no llama_cpp_python-{version} sdist in {work}")
    member = f"llama_cpp_python-{version}/vendor/llama.cpp"
    run("tar", "-xzf", str(sdists[0]), "-C", str(work), member)
    sdists[0].unlink()
    return work / member


def _move_into_place(staged: Path, target: Path, work: Path) -> None:
    """Rename the finished build to `target`; a stale build there (other options) goes first."""
    if target.exists():
        target.rename(work / "stale")
    staged.rename(target)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.llama_build",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--version", default=VERSION, help=f"llama-cpp-python version (default {VERSION})")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="parallel compile jobs (default: the cores)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        binary = ensure_built(args.version, jobs=args.jobs)
    except BuildFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{binary} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
