"""Packaging: one import package, `cache_qualify`, that installs beside PyPI's `fixtures` without a clash.

The test extra installs PyPI's `fixtures` (testing-cabal's, required by stestr and
oslotest) into the same environment as this project, so every end-to-end test of
the suite also runs with both installed; these tests check the import names and
the wheel's contents directly.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.labfixtures import REPO

PROBE = ("import fixtures, cache_qualify.plugin, cache_qualify.sim.server; from fixtures import TempDir; "
         "print(fixtures.__file__); print(cache_qualify.plugin.__file__)")


@pytest.mark.parametrize("where", ["project root", "elsewhere"])
def test_pypi_fixtures_and_cache_qualify_import_side_by_side(where: str, tmp_path: Path) -> None:
    cwd = REPO if where == "project root" else tmp_path
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    fixtures_file, plugin_file = (Path(line) for line in proc.stdout.splitlines())
    # PyPI's package, not this checkout's source root (which holds no __init__.py, so never shadows it)
    assert REPO / "fixtures" not in fixtures_file.parents, fixtures_file
    assert plugin_file == REPO / "fixtures" / "cache_qualify" / "plugin.py"


@pytest.mark.slow
@pytest.mark.xdist_group("wheel")
def test_the_wheel_installs_one_top_level_package_with_its_data(built_wheel: Path) -> None:
    names = zipfile.ZipFile(built_wheel).namelist()
    top = {name.split("/", 1)[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"cache_qualify"}, sorted(top)
    for data in ("cache_qualify/config/scenarios/reread-1g.yaml", "cache_qualify/config/schema/inventory.schema.json",
                 "cache_qualify/workload/data/corpus.npy", "cache_qualify/workload/data/conversations.jsonl",
                 *(f"cache_qualify/workload/data/mooncake/{name}" for name in (
                     "conversation_trace.jsonl", "LICENSE-APACHE", "README.md"))):
        assert data in names, f"{data} is missing from the wheel"
    assert not any(n.startswith(("cache_qualify/tests", "qualify/", "tests/")) for n in names)
    # the qualification tests, as the checkout's `qualify/` holds them (`cache-qualify run` collects them)
    shipped = sorted(n.removeprefix("cache_qualify/") for n in names if n.startswith("cache_qualify/qualify/"))
    assert shipped == sorted(f"qualify/{p.name}" for p in (REPO / "qualify").glob("*.py")), shipped
