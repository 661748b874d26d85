"""A wrapper of the emulated server that drops `--sim-policy` and its value from its command line: the server
then runs its default policy (set4) whatever the build's flags claim, as a lab whose launcher loses a flag.

    python -m tests.support.policy_dropping_server <the server's flags>
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cache_qualify.sim.server import main


def dropped(argv: Sequence[str]) -> list[str]:
    """`argv` without `--sim-policy X` (or `--sim-policy=X`)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--sim-policy":
            skip = True
        elif not arg.startswith("--sim-policy="):
            out.append(arg)
    return out


if __name__ == "__main__":
    sys.exit(main(dropped(sys.argv[1:])))
