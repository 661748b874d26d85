"""`cache_qualify.lab.preflight.check_builds`: every file a build's command line names is on the host."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache_qualify.config.inventory import load_inventory
from cache_qualify.errors import CommandFailed
from cache_qualify.lab.preflight import check_builds
from cache_qualify.lab.transport import LocalTransport
from tests.support.labfixtures import committed_inventory, write_inventory


def test_a_model_file_the_server_command_names_must_exist(tmp_path: Path) -> None:
    model = tmp_path / "models" / "model.gguf"
    command = committed_inventory()["server"]["command"] + f" --model-file {model}"
    inventory = load_inventory(write_inventory(tmp_path, server={"command": command},
                                               builds={"two_choice": {"path": "fixtures/cache_qualify/sim/server.py",
                                                                      "flags": ["--lora", str(tmp_path / "a.lora")]}}))
    host = inventory.hosts[0]
    with LocalTransport(host.name) as transport:
        with pytest.raises(CommandFailed, match=rf"^host {host.name}: file named by the server command not found: "
                                                rf"{model}, {tmp_path / 'a.lora'}$"):
            check_builds(inventory, host, transport)
        model.parent.mkdir()
        model.write_bytes(b"GGUF")
        (tmp_path / "a.lora").write_bytes(b"")
        check_builds(inventory, host, transport)   # every file there: the check passes
