"""The layer contract (pyproject's [tool.importlinter]) holds: data flows one way and the gate never imports sim;
and no module of the package imports itself back through others (no import cycle)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.labfixtures import REPO


def test_import_contracts_are_kept() -> None:
    # beside this interpreter: the environment the test extra was installed into
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.is_file(), f"{lint_imports} is missing: install the test extra (import-linter)"
    proc = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BROKEN" not in proc.stdout and proc.stdout.count("KEPT") == 2, proc.stdout


def import_cycles(package: str) -> list[list[str]]:
    """Every cycle of modules importing one another in `package` (function-level imports too), each
    as one path through its strongly connected component: Tarjan's algorithm on grimp's graph."""
    import grimp

    graph = grimp.build_graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    cycles = []
    for component in components:  # a readable cycle: the first module, around and back
        first, rest = component[0], set(component[1:])
        back = next(m for m in sorted(rest) if graph.direct_import_exists(importer=m, imported=first))
        there = graph.find_shortest_chain(importer=first, imported=back) or (first, back)
        cycles.append([*there, first])
    return cycles


def test_no_module_of_the_package_imports_itself_back() -> None:
    cycles = import_cycles("cache_qualify")
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_cycle_finder_names_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "cyclic_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic_pkg import b\n")
    (package / "b.py").write_text("def f() -> None:\n    from cyclic_pkg import c\n")
    (package / "c.py").write_text("import cyclic_pkg.a\n")
    (package / "d.py").write_text("import cyclic_pkg.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("cyclic_pkg") == [["cyclic_pkg.a", "cyclic_pkg.b", "cyclic_pkg.c", "cyclic_pkg.a"]]
