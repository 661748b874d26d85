"""The one cache folder (`cache_qualify.cachedir`): where it is, who is given it, and a read-only
installation that runs at full speed from it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cache_qualify
from cache_qualify import cachedir
from cache_qualify.config.inventory import load_inventory
from cache_qualify.lab.control import Lab
from cache_qualify.lab.server import ServerGroup
from tests.support.labfixtures import REPO, inventory_port, qualify_command, wait_no_sim_processes, write_inventory
from tests.support.waiting import wait_for

FLAGS = ("--embedding-table-cache-size", "1G", "--prefix-cache-memory", "0")


def test_the_folder_is_the_option_else_the_variable_else_the_xdg_cache_dir(tmp_path: Path) -> None:
    home = Path("~").expanduser()
    env = {cachedir.ENV: str(tmp_path / "from-env"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert cachedir.resolve(tmp_path / "given", env).root == tmp_path / "given"
    assert cachedir.resolve(None, env).root == tmp_path / "from-env"
    assert cachedir.resolve(None, {"XDG_CACHE_HOME": str(tmp_path / "xdg")}).root == tmp_path / "xdg" / "cache-qualify"
    assert cachedir.resolve(None, {}).root == home / ".cache" / "cache-qualify"
    # a relative XDG_CACHE_HOME is invalid (the XDG spec): ignored
    assert cachedir.resolve(None, {"XDG_CACHE_HOME": "relative"}).root == home / ".cache" / "cache-qualify"
    # what ranks started elsewhere read must name the same folder: made absolute, ~ expanded
    assert cachedir.resolve("rel", {}).root == Path.cwd() / "rel"
    assert cachedir.resolve("~/c", {}).root == home / "c"
    assert cachedir.resolve(None, env).folder(cachedir.KERNELS) == tmp_path / "from-env" / "kernels"


def test_configure_exports_the_folder_and_numbas_cache_within_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cachedir, "_current", None)
    monkeypatch.delenv(cachedir.NUMBA_ENV, raising=False)
    monkeypatch.setenv(cachedir.ENV, str(tmp_path / "env"))
    chosen = cachedir.configure(tmp_path / "option")
    assert chosen.root == tmp_path / "option" and cachedir.current() == chosen
    assert os.environ[cachedir.ENV] == str(tmp_path / "option")   # what the processes it starts read
    assert os.environ[cachedir.NUMBA_ENV] == str(tmp_path / "option" / "numba")
    monkeypatch.setenv(cachedir.NUMBA_ENV, str(tmp_path / "numba-elsewhere"))
    cachedir.configure(tmp_path / "again")
    assert os.environ[cachedir.NUMBA_ENV] == str(tmp_path / "numba-elsewhere")  # the user's choice is kept


def test_a_rank_on_this_machine_is_given_the_labs_cache_folder(tmp_path: Path) -> None:
    """The runner hands a rank on a local host its cache folder: not this process's (the suite's),
    but the one the lab was opened with."""
    path = write_inventory(tmp_path)
    inventory = load_inventory(path)
    cache = cachedir.CacheDir(tmp_path / "cache")
    cache.root.mkdir()
    # the kernels the session built, so that no rank starts a build of its own into tmp_path
    (cache.root / cachedir.KERNELS).symlink_to(cachedir.current().folder(cachedir.KERNELS))
    assert cache.root != cachedir.current().root
    with Lab(inventory, inventory.groups_resolved()[0], run_id="cache", cache=cache).open() as lab:
        server = ServerGroup(lab, "set4", inventory.build("set4"), flags=FLAGS, tag="t-cache")
        server.start()
        try:
            server.wait_ready()
        finally:
            server.stop()
            server.close()
        logs = [Path(rank.log_path).read_text() for rank in server.started]
    assert len(logs) == 3
    for log in logs:
        assert "kernel compiled ahead of time" in log, log
        assert f"replay memo {cache.root}/replays/" in log, log
    assert wait_no_sim_processes(inventory_port(path)) == []


# --- a read-only installation -------------------------------------------------------------------

def read_only(folder: Path) -> list[str]:
    """A command prefix under which `folder` cannot be written, by anyone: a read-only bind mount in
    a mount namespace of its own as root (whom file modes do not stop), file modes otherwise."""
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(folder)], check=True)
        return []
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind -o ro "$0" "$0" && exec "$@"', str(folder)]


def snapshot(*folders: Path) -> dict[str, tuple[int, int]]:
    """(mtime in ns, size) of every file under `folders`, by path."""
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size)
            for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()}


def hurry_the_build(rank_logs: list[Path]) -> None:
    """Give the kernel build a rank started in the background the suite's priority: started at the
    lowest (a rank's build must not slow the starts running beside it), it would wait out every
    test running beside this one. Only root may lower a niceness; others wait."""
    for log in rank_logs:
        found = re.search(r"building ahead of time in the background \(pid (\d+)", log.read_text())
        if found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.setpriority(os.PRIO_PGRP, int(found[1]), os.getpriority(os.PRIO_PROCESS, 0))
            return


def wait_for_kernels(folder: Path, timeout_s: float = 600.0) -> list[Path]:
    """The modules a rank's background build writes into `folder` (both parts), once it ended."""
    def both() -> list[Path]:
        failed = list(folder.glob("rowcache_kernels_*.failed"))
        assert not failed, f"the kernel build failed: {failed[0].read_text()}"
        built = sorted(folder.glob("rowcache_kernels_*_[01].*.so"))
        return built if len(built) == 2 else []

    built = wait_for(both, timeout_s, f"both kernel modules built in {folder}", every_s=1.0,
                     detail=lambda: (folder / "rowcache_kernels.log").read_text(errors="replace"))
    # the build has moved both in: wait for it to release its lock (it exits then)
    subprocess.run(["flock", str(folder / "rowcache_kernels.lock"), "true"], check=True, timeout=timeout_s)
    return built


@pytest.mark.slow
def test_a_read_only_installation_builds_once_into_the_cache_folder_and_then_reuses_it(tmp_path: Path) -> None:
    """The package copied (and compiled, as an installer does) into a folder nobody can write: a
    default qualification from it runs twice with `--cache-dir`; the first builds the kernels and
    simulates the levels into the cache folder, the second builds nothing, and every rank of it
    loads the kernels compiled ahead of time. Nothing goes to the XDG cache dir."""
    site = tmp_path / "site"
    shutil.copytree(Path(cache_qualify.__file__).parent, site / "cache_qualify",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(site)], check=True)
    lab = tmp_path / "lab"   # a lab runner's folder: the qualification tests and an inventory
    shutil.copytree(REPO / "qualify", lab / "qualify", ignore=shutil.ignore_patterns("__pycache__"))
    inventory = write_inventory(lab)
    cache, xdg = tmp_path / "cache", tmp_path / "xdg"
    env = {k: v for k, v in os.environ.items() if k not in (cachedir.ENV, cachedir.NUMBA_ENV)}
    env.update(PYTHONPATH=str(site), XDG_CACHE_HOME=str(xdg))
    wrap = read_only(site)
    probe = subprocess.run([*wrap, "sh", "-c", f"touch {site}/cache_qualify/probe"], capture_output=True, text=True)
    assert probe.returncode != 0, "the installation is writable: the test would prove nothing"
    found = subprocess.run([*wrap, sys.executable, "-c", "import cache_qualify; print(cache_qualify.__file__)"],
                           env=env, cwd=lab, capture_output=True, text=True, check=True).stdout.strip()
    assert found == str(site / "cache_qualify" / "__init__.py")

    def qualify(reports: str) -> str:
        proc = subprocess.run([*wrap, *qualify_command(inventory, lab / reports, "--cache-dir", str(cache))],
                              cwd=lab, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        return proc.stdout

    first = qualify("first")
    assert "overall: PASS" in first
    hurry_the_build(sorted((lab / "first").glob("*/logs/*-rank*.log")))
    kernels = wait_for_kernels(cache / cachedir.KERNELS)
    levels = sorted((cache / cachedir.T_LEVELS).glob("*.json"))
    assert levels, "the default qualification simulated no levels"
    before = snapshot(cache / cachedir.KERNELS, cache / cachedir.T_LEVELS)
    assert all(str(path) in before for path in [*kernels, *levels])

    second = qualify("second")
    assert "overall: PASS" in second
    assert snapshot(cache / cachedir.KERNELS, cache / cachedir.T_LEVELS) == before   # nothing rebuilt
    run_dir = next(p for p in (lab / "second").iterdir() if p.is_dir())
    rank_logs = sorted(run_dir.glob("logs/*-rank*.log"))
    assert len(rank_logs) >= 24   # three ranks of at least four trials of two builds
    for log in rank_logs:
        text = log.read_text()
        assert "kernel compiled ahead of time" in text and "ahead of time in the background" not in text, text
    assert not xdg.exists()
