"""The gate installed: `pip install` of the package into a fresh virtual environment outside any checkout, then
`cache-qualify run --hosts hosts.yaml` in a lab's folder holding only an inventory qualifies it, with the
options, JUnit and exit statuses of `pytest qualify` in a checkout; `pytest qualify` there says how to run it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.support.installed import FreshEnvironment, lab_folder
from tests.support.labfixtures import REPO, TEST_SEED


@pytest.mark.slow
@pytest.mark.xdist_group("wheel")
def test_the_installed_gate_qualifies_a_lab_folder_holding_only_an_inventory(tmp_path: Path,
                                                                            installed_gate: FreshEnvironment) -> None:
    venv = installed_gate
    lab = tmp_path / "lab"
    package = venv.package_file(tmp_path, "cache_qualify").parent
    assert venv.root in package.parents and REPO not in package.parents, package   # the wheel's, not this checkout's
    hosts = lab_folder(lab, package / "sim" / "server.py")
    assert [p.name for p in lab.iterdir()] == ["hosts.yaml"]

    proc = venv.run(["cache-qualify", "run", "--hosts", "hosts.yaml", "--junitxml", "junit.xml", "--seed", TEST_SEED,
                     "--no-plots", "-q", "-p", "no:cacheprovider"], lab)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    cases = list(ET.parse(lab / "junit.xml").getroot().iter("testcase"))
    assert any(c.get("name", "").startswith("test_row_cache[") for c in cases), output
    assert {c.get("classname") for c in cases} >= {"qualify.test_preflight", "qualify.test_cache"}, output
    assert not any(c.find("failure") is not None or c.find("error") is not None for c in cases), output
    (run_dir,) = (p for p in (lab / "reports").iterdir() if p.is_dir())
    command = json.loads((run_dir / "plan.json").read_text())["command"]
    assert command[:6] == ["cache-qualify", "run", "--hosts", "hosts.yaml", "--junitxml", "junit.xml"], command
    assert hosts.is_file() and not (package / ".pytest_cache").exists()

    # the checkout's command, where there is no checkout: one line saying what to run instead, exit 4
    proc = venv.run(["pytest", "qualify", "--hosts", "hosts.yaml"], lab)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "cache-qualify run --hosts HOSTS_YAML" in proc.stderr, proc.stderr
    assert [p for p in (lab / "reports").iterdir() if p.is_dir()] == [run_dir], "the refused command made no run folder"
