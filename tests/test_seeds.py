"""Seeds of server starts: derived from the run's seed, given to the server through `{seed}`, quoted."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from cache_qualify.config.inventory import load_inventory
from cache_qualify.lab.control import Lab
from cache_qualify.lab.server import ServerGroup
from cache_qualify.trials.seeds import SEED_BITS, start_seed
from tests.support.labfixtures import REPO, write_file


def test_a_start_seed_is_a_function_of_the_run_seed_and_the_starts_place() -> None:
    place = {"scenario": "reread-1g", "arm": "set4", "trial": 3, "attempt": 0}
    seed = start_seed(7, **place)  # type: ignore[arg-type]
    assert seed == start_seed(7, **place)  # type: ignore[arg-type]
    assert 0 <= seed < 1 << SEED_BITS
    others = {start_seed(8, **place),  # type: ignore[arg-type]
              *(start_seed(7, **{**place, key: value})  # type: ignore[arg-type]
                for key, value in (("scenario", "reread-4g"), ("arm", "set4-again"), ("trial", 4),
                                   ("attempt", 1)))}
    assert seed not in others and len(others) == 5


def test_an_aa_runs_two_arms_of_one_build_start_from_different_seeds() -> None:
    # the arms are told apart by label, so an A/A run compares two independent sets of starts
    seeds = {arm: [start_seed(7, scenario="reread-1g", arm=arm, trial=t) for t in range(4)]
             for arm in ("set4", "set4-again")}
    assert not set(seeds["set4"]) & set(seeds["set4-again"])


def test_the_committed_inventory_passes_each_starts_seed_to_the_emulated_server() -> None:
    inventory = load_inventory(REPO / "hosts.yaml")
    lab = Lab(inventory, inventory.groups_resolved()[0], run_id="seeds")  # not opened: commands only
    server = ServerGroup(lab, "set4", inventory.build("set4"), seed=123456)
    argv = shlex.split(server.command(lab.group.rank0))
    assert argv[argv.index("--sim-seed") + 1] == "123456"
    unseeded = [shlex.split(ServerGroup(lab, "set4", inventory.build("set4")).command(lab.group.rank0))
                for _ in range(2)]
    assert unseeded[0][unseeded[0].index("--sim-seed") + 1] != unseeded[1][unseeded[1].index("--sim-seed") + 1]


def test_the_seed_placeholder_is_quoted_like_every_value(tmp_path: Path) -> None:
    text = (REPO / "hosts.yaml").read_text(encoding="utf-8").replace(
        "--sim-seed {seed} {flags}", "'--label=run {seed}; echo x' {flags}")
    inventory = load_inventory(write_file(tmp_path, text, "hosts.yaml"))
    lab = Lab(inventory, inventory.groups_resolved()[0], run_id="seeds")
    command = ServerGroup(lab, "set4", inventory.build("set4"), seed=42).command(lab.group.rank0)
    assert "'--label=run 42; echo x'" in command
    assert "--label=run 42; echo x" in shlex.split(command)


@pytest.mark.parametrize("template", ["srv --seed={seed}", "srv {seed}"])
def test_the_seed_placeholder_is_known_to_the_inventory(tmp_path: Path, template: str) -> None:
    text = (REPO / "hosts.yaml").read_text(encoding="utf-8")
    start = text.index("  command: >-")
    end = text.index("  http_port:")
    inventory = load_inventory(write_file(tmp_path, text[:start] + f"  command: {template!r}\n" + text[end:],
                                          "hosts.yaml"))
    assert "{seed}" in inventory.server.command
