"""The package as a lab installs it: a wheel built from this tree, installed into a fresh virtual environment
outside any checkout, and a lab folder holding only an inventory.

The fresh environment sees the suite's own environment's third-party packages (numpy, pandas, pytest ...)
through a folder of links to them named in a `.pth` file, and nothing of this project's but the wheel: so
`pip install` of the wheel resolves its dependencies without a download, and every import of
`cache_qualify` is the wheel's (the links leave out this checkout's editable install).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.support.labfixtures import REPO, write_inventory

# what the links leave out: this project's installation (editable: its finder and .pth), and the tools
# a fresh environment has of its own
_NOT_LINKED = ("cache_qualify", "__editable__", "pip", "__pycache__")


def build_wheel(folder: Path) -> Path:
    """A wheel of this tree (a copy, so the build leaves nothing in the checkout), made in `folder`."""
    source = folder / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "reports", "build", "*.egg-info",
                                                                 "__pycache__", ".mypy_cache", ".hypothesis",
                                                                 ".sim-lab", ".pytest_cache"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(folder / "dist"),
                           str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (folder / "dist").glob("cache_qualify-*.whl")
    return wheel


@dataclass(frozen=True)
class FreshEnvironment:
    """A virtual environment with nothing of this project installed yet, and the environment variables
    a command in it runs with (its bin first on PATH, no package index)."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        return {**keep, "VIRTUAL_ENV": str(self.root), "PATH": f"{self.bin}{os.pathsep}{keep.get('PATH', '')}",
                "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(extra or {})}

    def run(self, args: list[str], cwd: Path, *, timeout_s: float = 600,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=cwd, env=self.env(env), capture_output=True, text=True, timeout=timeout_s)

    def package_file(self, cwd: Path, module: str) -> Path:
        """Where the environment imports `module` from (run in `cwd`)."""
        proc = self.run([str(self.bin / "python"), "-c", f"import {module} as m; print(m.__file__)"], cwd)
        assert proc.returncode == 0, proc.stderr
        return Path(proc.stdout.strip())


def fresh_environment(folder: Path) -> FreshEnvironment:
    """A new virtual environment in `folder/venv` that sees the suite's third-party packages (see above)."""
    root = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    link_dependencies(root, folder / "dependencies")
    return FreshEnvironment(root)


def link_dependencies(root: Path, links: Path) -> None:
    """Let the virtual environment at `root` see the suite's third-party packages through a folder of links,
    `links` (made here), as if `pip install` had downloaded them."""
    links.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if not entry.name.startswith(_NOT_LINKED) and not entry.name.endswith(".pth"):
            (links / entry.name).symlink_to(entry)
    (purelib,) = root.glob("lib/python*/site-packages")
    for own in purelib.glob("setuptools*"):   # an older one than the package needs: the suite's is linked
        shutil.rmtree(own)
    (purelib / "suite-dependencies.pth").write_text(f"{links}\n")


def lab_folder(folder: Path, server_py: Path) -> Path:
    """A lab's folder holding only an inventory: the simulated lab's (`write_inventory`: a free port, its own
    folder on the hosts, no client latency), its builds at the installed emulated server, run from the lab's
    folder instead of this checkout. Returns the inventory's path."""
    folder.mkdir()
    path = write_inventory(folder, noise="quiet")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["server"]["workdir"] = "."
    for build in data["builds"].values():
        build["path"] = str(server_py)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


__all__ = ["FreshEnvironment", "build_wheel", "fresh_environment", "lab_folder"]
