"""The layer contract (pyproject's [tool.importlinter]) holds: data flows one way, the gate never imports sim, and
the emulators, the sizing and the simulated lab read the workload without importing the trial or its clients;
no module of the package imports itself back through others (no import cycle); the run's decision never
imports the sizing or the self-validation; and no two modules of the package share a name."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support.labfixtures import REPO


def test_import_contracts_are_kept() -> None:
    # beside this interpreter: the environment the test extra was installed into
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.is_file(), f"{lint_imports} is missing: install the test extra (import-linter)"
    proc = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BROKEN" not in proc.stdout and proc.stdout.count("KEPT") == 3, proc.stdout
    assert "the simulated lab read the workload, not the trial" in proc.stdout, proc.stdout


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


# Above every stage of the run: only the command lines (and the self-validation, of the sizing) import them.
ABOVE_THE_RUN = ("cache_qualify.validation", "cache_qualify.sizing")


def test_sizing_and_validation_sit_above_every_stage_of_the_run() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in config if c["type"] == "layers")
    assert layers[:3] == ["cache_qualify.cli", *ABOVE_THE_RUN], layers


def test_only_the_command_lines_import_the_sizing_and_the_validation() -> None:
    import grimp

    graph = grimp.build_graph("cache_qualify")
    allowed = {"cache_qualify.validation": ("cache_qualify.cli", "cache_qualify.validation"),
               "cache_qualify.sizing": ("cache_qualify.cli", "cache_qualify.validation", "cache_qualify.sizing")}
    wrong = [f"{importer} imports {imported}"
             for package, importers in allowed.items()
             for imported in sorted(graph.find_descendants(package) | {package})
             for importer in sorted(graph.find_modules_that_directly_import(imported))
             if not importer.startswith(tuple(f"{i}." for i in importers)) and importer not in importers]
    assert not wrong, "\n".join(wrong)


# Names two modules may share, each pair by its paths: one name, one idea, unless the reason says why not.
SHARED_NAMES = {
    "emulate.py": ({"cli", "sim"}, "cli/emulate is the `cache-qualify emulate` command over sim/emulate"),
    "noise.py": ({"cli", "sim"}, "cli/noise is the `cache-qualify noise` command over sim/noise"),
    "schema.py": ({"cli", "history"}, "cli/schema is the `cache-qualify schema` command (hosts and scenario files)"),
    "page.py": ({"history", "report"}, "each package's HTML page: the history's, one run's"),
    "server.py": ({"lab", "sim"}, "a runtime server on a lab host, and the simulated lab's server program"),
    "store.py": ({"history", "samples"}, "each package's store: the history database, one run's samples"),
}


def modules_by_name(root: Path) -> dict[str, set[str]]:
    """Each module file name under `root` (but __init__.py, which every package has) and the folders,
    relative to `root`, holding one of that name."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in root.rglob("*.py"):
        if path.name != "__init__.py":
            found[path.name].add(path.parent.relative_to(root).as_posix())
    return found


def test_no_two_modules_of_the_package_share_a_name() -> None:
    shared = {name: folders for name, folders in modules_by_name(REPO / "fixtures" / "cache_qualify").items()
              if len(folders) > 1}
    unexplained = {name: sorted(folders) for name, folders in shared.items()
                   if name not in SHARED_NAMES or SHARED_NAMES[name][0] != folders}
    assert not unexplained, f"modules sharing a name: {unexplained}"
    assert set(shared) == set(SHARED_NAMES), f"no longer shared, drop from SHARED_NAMES: {set(SHARED_NAMES) - set(shared)}"


def test_the_name_check_finds_a_shared_name(tmp_path: Path) -> None:
    for folder in ("a", "b", "b/c"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "a" / "noise.py").write_text("")
    (tmp_path / "b" / "c" / "noise.py").write_text("")
    (tmp_path / "b" / "store.py").write_text("")
    assert modules_by_name(tmp_path) == {"noise.py": {"a", "b/c"}, "store.py": {"b"}}
