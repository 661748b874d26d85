"""`python -m tests.support.bench_forward [bench-harness options]`: what the forwarded HTTP route costs.

Starts a jump host's sshd and three hosts' sshd instances on loopback addresses
(root and openssh-server needed, as for the SSH tests), writes an inventory of
the simulated lab whose hosts are reached through the jump host, so every HTTP
exchange takes the ``ssh`` route, and runs ``cache-qualify bench-harness`` on it.
The hosts are on loopback, so the same GET sent directly is the baseline.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.labfixtures import REPO, write_inventory
from tests.support.sshd import SshdInstance, SshdLab


def forwarded_lab(lab: SshdLab, folder: Path) -> tuple[Path, list[SshdInstance]]:
    """An inventory of three loopback sshd hosts behind a loopback jump host (so HTTP goes over SSH),
    and the four sshd instances (to stop)."""
    jump = lab.start("bench-jump")
    instances = [lab.start(f"bench-{c}") for c in "abc"]
    known_hosts = lab.known_hosts(folder / "known_hosts", jump, *instances)
    hosts = [{"name": f"gb10-{c}", "address": i.address, "port": i.port, "rank": r, "transport": "ssh"}
             for r, (c, i) in enumerate(zip("abc", instances))]
    ssh = {"user": lab.user, "identity_file": str(lab.client_key), "use_agent": False, "ssh_config": None,
           "known_hosts": [str(known_hosts)], "connect_timeout_s": 5, "command_timeout_s": 60,
           "jump": {"address": jump.address, "port": jump.port}}
    return write_inventory(folder, hosts=hosts, ssh=ssh, client_latency=True), [jump, *instances]


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-forward-") as scratch:
        lab = SshdLab(Path(scratch))
        try:
            inventory, _ = forwarded_lab(lab, Path(scratch))
            return subprocess.run([sys.executable, "-m", "cache_qualify.cli", "bench-harness", "--hosts",
                                   str(inventory), *argv], cwd=REPO).returncode
        finally:
            lab.stop_all()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
