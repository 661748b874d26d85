"""Artifacts staged onto hosts by their sha256 and every host's build checked before a start
(cache_qualify.lab.staging), over the real local transport: three simulated hosts on this machine, each
with its own folder. The SSH transport's SFTP, through a jump host, is tested in tests/test_bastion.py."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from cache_qualify.config.builds import Build
from cache_qualify.config.inventory import Host, Inventory, load_inventory
from cache_qualify.errors import BuildError, BuildMismatch
from cache_qualify.lab.control import host_dir
from cache_qualify.lab.staging import BuildChecks, artifact_content
from cache_qualify.lab.transport import LocalTransport, Transport
from tests.support.labfixtures import write_file

INVENTORY = """\
lab: staging
hosts:
  - {name: a, address: 127.0.0.11, rank: 0, transport: local}
  - {name: b, address: 127.0.0.12, rank: 1, transport: local}
  - {name: c, address: 127.0.0.13, rank: 2, transport: local}
server:
  runtime: flare
  command: "{build_path} --port {port} {flags}"
  http_port: 0
  run_dir: on-hosts
builds:
  base: {path: /bin/true}
baseline: base
candidate: base
"""


def lab_checks(tmp_path: Path) -> tuple[Inventory, BuildChecks]:
    inventory = load_inventory(write_file(tmp_path, INVENTORY, "hosts.yaml"))
    transports: dict[str, Transport] = {h.name: LocalTransport(h.name) for h in inventory.hosts}
    for host in inventory.hosts:
        os.makedirs(host_dir(inventory, host), exist_ok=True)
    return inventory, BuildChecks(inventory, inventory.hosts, transports, lambda h: host_dir(inventory, h))


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path


def runs_build(checks: BuildChecks, name: str, build: Build) -> object:
    """What the check runs: the build's {build_path} itself (an executable file)."""
    return lambda host: checks.host_path(name, build, host)


def test_a_file_is_staged_by_digest_reused_and_checked_on_every_host(tmp_path: Path) -> None:
    inventory, checks = lab_checks(tmp_path)
    server = executable(tmp_path / "out" / "flare-server", "#!/bin/sh\necho pr\n")
    build = Build(artifact=str(server))
    digest = hashlib.sha256(server.read_bytes()).hexdigest()
    identity = checks.check("pr", build, runs_build(checks, "pr", build))
    assert (identity.source, identity.digest) == ("artifact", digest)
    placed = [Path(checks.host_path("pr", build, h)) for h in inventory.hosts]
    assert [p.parent.name for p in placed] == [digest] * 3 and all(p.name == "flare-server" for p in placed)
    assert all(subprocess.run([p], capture_output=True, text=True).stdout == "pr\n" for p in placed)
    inode = placed[1].stat().st_ino
    checks.stage([("pr", build)])          # a second run: the folder there is reused, not copied again
    assert placed[1].stat().st_ino == inode
    assert not any(p.name.startswith(".partial-") for p in placed[0].parent.parent.iterdir())


def test_a_host_holding_other_bytes_fails_before_any_start_naming_both_digests(tmp_path: Path) -> None:
    inventory, checks = lab_checks(tmp_path)
    server = executable(tmp_path / "flare-server", "#!/bin/sh\necho pr\n")
    build = Build(artifact=str(server))
    checks.stage([("pr", build)])
    on_b = Path(checks.host_path("pr", build, inventory.hosts[1]))
    on_b.write_text("#!/bin/sh\necho stale\n", encoding="utf-8")
    other = hashlib.sha256(on_b.read_bytes()).hexdigest()
    fresh = BuildChecks(inventory, inventory.hosts, checks.transports, checks.host_dir)   # the next run
    with pytest.raises(BuildMismatch, match=rf"^host b: build 'pr': {on_b} has sha256 {other}, the arm's is "
                                            rf"{artifact_content(server).digest}; every host must run the same") as info:
        fresh.check("pr", build, runs_build(fresh, "pr", build))
    assert (info.value.host, info.value.expected, info.value.found) == ("b", artifact_content(server).digest, other)


def test_a_path_build_is_checked_against_the_sha256_it_declares(tmp_path: Path) -> None:
    inventory, checks = lab_checks(tmp_path)
    server = executable(tmp_path / "installed" / "flare-server", "#!/bin/sh\n")
    right = hashlib.sha256(server.read_bytes()).hexdigest()
    assert checks.check("main", Build(path=str(server), sha256=right), lambda h: None).digest == right
    with pytest.raises(BuildMismatch, match=rf"^host a: build 'main': {server} has sha256 {right}, the arm's is "
                                            rf"{'0' * 64}"):
        checks.check("main", Build(path=str(server), sha256="sha256:" + "0" * 64), lambda h: None)


def test_a_tree_and_a_tarball_of_it_are_one_build(tmp_path: Path) -> None:
    inventory, checks = lab_checks(tmp_path)
    tree = tmp_path / "tree"
    executable(tree / "bin" / "flare-server", "#!/bin/sh\necho tree\n")
    (tree / "lib").mkdir()
    (tree / "lib" / "policy.json").write_text("{}", encoding="utf-8")
    with tarfile.open(tmp_path / "tree.tar.gz", "w:gz") as archive:
        archive.add(tree, arcname=".")
    folder = Build(artifact=str(tree))
    tarball = Build(artifact=str(tmp_path / "tree.tar.gz"))
    # the host's own sha256sum over the staged tree agrees with the runner's digest: the check passes
    first = checks.check("t", folder, lambda h: checks.host_path("t", folder, h) + "/bin/flare-server")
    second = checks.check("t2", tarball, lambda h: None)
    assert first.digest == second.digest and first.kind == "tree"
    staged = Path(checks.host_path("t", folder, inventory.hosts[2]))
    assert subprocess.run([staged / "bin" / "flare-server"], capture_output=True, text=True).stdout == "tree\n"


def test_an_artifact_without_its_exec_bit_fails_naming_host_and_build(tmp_path: Path) -> None:
    _, checks = lab_checks(tmp_path)
    server = tmp_path / "flare-server"
    server.write_text("#!/bin/sh\n", encoding="utf-8")
    server.chmod(0o644)
    build = Build(artifact=str(server))
    with pytest.raises(BuildError, match=r"^host a: build 'pr': .*/flare-server is not executable \(its exec bit "
                                         r"is not set\): the command runs it$"):
        checks.check("pr", build, runs_build(checks, "pr", build))


def test_prune_removes_builds_unused_for_the_kept_days_and_never_the_runs_own(tmp_path: Path) -> None:
    inventory, checks = lab_checks(tmp_path)
    builds = Path(host_dir(inventory, inventory.hosts[0])) / "builds"
    old, recent = builds / ("1" * 64), builds / ("2" * 64)
    for folder in (old, recent, builds / ".partial-dead-0000"):
        folder.mkdir(parents=True)
    long_ago = time.time() - 8 * 86400
    for path in (old, Path(f"{old}.used")):
        path.touch()
        os.utime(path, (long_ago, long_ago))
    Path(f"{recent}.used").touch()
    server = executable(tmp_path / "flare-server", "#!/bin/sh\n")
    own = Build(artifact=str(server))
    checks.stage([("pr", own)])
    own_folder = Path(checks.host_path("pr", own, inventory.hosts[0])).parent
    os.utime(own_folder, (long_ago, long_ago))     # the run's own build, however old, stays
    checks.stage([("pr", own)])
    assert sorted(p.name for p in builds.iterdir()) == sorted([recent.name, f"{recent.name}.used", own_folder.name])


def test_a_copy_stopped_halfway_leaves_no_folder_under_a_digest(tmp_path: Path) -> None:
    """Ctrl-C during the copy: the partial folder is removed on every host and nothing is left to reuse."""
    inventory, checks = lab_checks(tmp_path)
    big = tmp_path / "model-server"
    big.write_bytes(os.urandom(3 << 20))
    big.chmod(0o755)
    build = Build(artifact=str(big))
    checks.cancel()    # what an interrupt of the run does: every copy under way stops after its chunk
    with pytest.raises(KeyboardInterrupt, match="staging stopped"):
        checks.stage([("pr", build)])
    for host in inventory.hosts:
        assert [p.name for p in (Path(host_dir(inventory, host)) / "builds").iterdir()] == []
    _, again = lab_checks(tmp_path)     # the next run stages it whole
    again.stage([("pr", build)])
    assert all(Path(again.host_path("pr", build, h)).stat().st_size == 3 << 20 for h in inventory.hosts)


def test_a_host_whose_disk_fills_during_staging_fails_in_one_line_and_keeps_no_partial_copy(tmp_path: Path) -> None:
    """Host b's folder on a 1 MiB tmpfs: the copy of a 3 MiB artifact fails there naming the host, the build and
    the cause; its partial folder is removed."""
    inventory, checks = lab_checks(tmp_path)
    on_b = Path(host_dir(inventory, inventory.hosts[1]))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(on_b)], check=True)
    try:
        big = tmp_path / "model-server"
        big.write_bytes(os.urandom(3 << 20))
        with pytest.raises(BuildError, match=r"^host b: build 'pr': staging .*/model-server into .*/b/builds/[0-9a-f]{64} "
                                             r"failed: copying .* failed: No space left on device$"):
            checks.stage([("pr", Build(artifact=str(big)))])
        assert [p.name for p in (on_b / "builds").iterdir()] == []
    finally:
        subprocess.run(["umount", str(on_b)], check=True)
