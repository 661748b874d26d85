"""The suite's own rules, kept by reading its source: every `pytest.raises` checks the message
(`match=`), a test that polls uses `tests.support.waiting.wait_for` (no hand-written deadline
loop), a rerun says why, helpers live in tests/support/, and the `slow` marker that splits the
quick tier from the whole suite is registered and enforced, no test skips (but on another platform: a
missing real part fails the test); the plugin uses pytest's public API only; and
no module of the package passes 450 lines (one split where its responsibilities split, none excepted)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests.support.labfixtures import REPO

TESTS = REPO / "tests"
WAITING = TESTS / "support" / "waiting.py"   # the one place that polls against a deadline
CLOCKS = {"time.monotonic", "time.time", "time.perf_counter"}


def sources() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in sorted(TESTS.rglob("*.py"))}


def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"


def called(node: ast.AST) -> set[str]:
    """The dotted names `node` calls anywhere inside it (`time.sleep`, `pytest.raises`)."""
    return {ast.unparse(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}


def marker_calls(tree: ast.Module, name: str) -> list[ast.Call]:
    """Every `pytest.mark.<name>(...)` in `tree`."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == f"pytest.mark.{name}"]


def test_every_pytest_raises_has_a_match() -> None:
    bare = [where(path, node) for path, tree in sources().items() for node in ast.walk(tree)
            if isinstance(node, ast.Call) and ast.unparse(node.func) in {"pytest.raises", "raises"}
            and not any(keyword.arg == "match" for keyword in node.keywords)]
    assert bare == [], f"pytest.raises without match= (check the message, not only the class): {bare}"


def test_no_hand_written_deadline_loop() -> None:
    """A loop that sleeps, or whose condition reads a clock, is a poll: `wait_for` does it."""
    loops = []
    for path, tree in sources().items():
        if path == WAITING:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.While | ast.For):
                head = node.test if isinstance(node, ast.While) else node.iter
                if "time.sleep" in called(node) or CLOCKS & called(head):
                    loops.append(where(path, node))
            elif isinstance(node, ast.Name) and node.id == "deadline" and isinstance(node.ctx, ast.Store):
                loops.append(where(path, node))
    assert loops == [], f"poll with tests.support.waiting.wait_for, not a loop of its own: {loops}"


SKIPS = {"pytest.skip", "pytest.importorskip", "pytest.xfail", "pytest.mark.skip", "pytest.mark.xfail"}


def skips(tree: ast.Module) -> list[ast.AST]:
    """Every way `tree` skips a test (or expects it to fail) other than on a platform: a test whose real
    part (sshd, PostgreSQL, Chromium, llama-server, vLLM) is missing must fail, never skip."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and ast.unparse(node) in SKIPS:
            found.append(node)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.mark.skipif":
            conditions = [*node.args, *(k.value for k in node.keywords if k.arg == "condition")]
            if not conditions or not all("sys.platform" in ast.unparse(c) for c in conditions):
                found.append(node)
    return found


def test_no_test_skips_but_on_another_platform() -> None:
    skipped = [where(path, node) for path, tree in sources().items() if path != Path(__file__)
               for node in skips(tree)]
    assert skipped == [], f"a test that cannot run fails (with what to install), never skips: {skipped}"


def test_the_skip_rule_sees_each_way_to_skip() -> None:
    tree = ast.parse("import pytest, sys, shutil\n"
                     "pytest.importorskip('psycopg')\n"
                     "@pytest.mark.skipif(shutil.which('sshd') is None, reason='no sshd')\n"
                     "def test_a(): pytest.skip('no server')\n"
                     "@pytest.mark.skip\n"
                     "def test_b(): pass\n"
                     "@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='Linux only')\n"
                     "def test_c(): pass\n")
    assert sorted(getattr(node, "lineno", 0) for node in skips(tree)) == [2, 3, 4, 5]


def test_a_rerun_says_why() -> None:
    silent = [where(path, call) for path, tree in sources().items() for call in marker_calls(tree, "flaky")
              if not any(keyword.arg == "reason" for keyword in call.keywords)]
    assert silent == [], f"@pytest.mark.flaky without reason=: {silent}"


def test_helpers_live_in_support() -> None:
    """tests/ (and tests/sim/) hold test modules only; what they share is in tests/support/."""
    others = sorted(str(path.relative_to(REPO)) for path in sources()
                    if path.parent != TESTS / "support" and not path.name.startswith("test_")
                    and path.name not in {"__init__.py", "conftest.py"})
    assert others == [], f"helpers outside tests/support/: {others}"


def test_the_slow_marker_is_registered_and_strict() -> None:
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in options["addopts"].split(), options.get("addopts")
    assert any(marker.startswith("slow:") for marker in options["markers"]), options["markers"]


PYTEST_OBJECTS = {"collector", "item", "items", "metafunc", "config", "session", "node", "request", "pytestconfig"}


# the private attributes of pytest's objects read or written by name, each with why: pytest-xdist deals a
# group's tests from the structured `Item._id` where pytest has one (9.2), an attribute with no public name
PRIVATE_BY_NAME = ["fixtures/cache_qualify/session/xdist.py: getattr(item, '_id')",
                   "fixtures/cache_qualify/session/xdist.py: setattr(item, '_id')"]


def private_by_name(tree: ast.AST) -> list[str]:
    """`getattr`, `setattr`, `hasattr` or `delattr` of a pytest object with a literal private name."""
    return [f"{node.func.id}({node.args[0].id}, {node.args[1].value!r})" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "setattr", "hasattr", "delattr"} and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name) and node.args[0].id in PYTEST_OBJECTS
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            and node.args[1].value.startswith("_") and not node.args[1].value.startswith("__")]


def test_the_rule_sees_a_private_attribute_named_by_a_literal() -> None:
    tree = ast.parse("getattr(item, '_id', None)\nsetattr(config, '_inicache', {})\ngetattr(item, 'nodeid')\n"
                     "getattr(other, '_id')")
    assert private_by_name(tree) == ["getattr(item, '_id')", "setattr(config, '_inicache')"]


def test_the_plugin_uses_pytest_s_public_api_only() -> None:
    """No private attribute of pytest's objects (`collector._genfunctions`, `config._inicache`): a pytest
    release may change them. The one import from `_pytest` is pytest's JUnit stash key, which has no
    public name."""
    package = REPO / "fixtures" / "cache_qualify"
    private = [f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}"
               for path in sorted(package.rglob("*.py"))
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
               and isinstance(node.value, ast.Name) and node.value.id in PYTEST_OBJECTS]
    assert private == []
    by_name = sorted(f"{path.relative_to(REPO)}: {access}" for path in package.rglob("*.py")
                     for access in private_by_name(ast.parse(path.read_text(encoding="utf-8"))))
    assert by_name == PRIVATE_BY_NAME
    imported = sorted(f"{path.relative_to(REPO)}: {alias.name}" for path in package.rglob("*.py")
                      for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("_pytest")
                      for alias in node.names)
    assert imported == ["fixtures/cache_qualify/plugin.py: xml_key"]


MOST_LINES = 450   # a module longer holds more than one thing to read at once


def long_modules(root: Path, most: int = MOST_LINES) -> dict[str, int]:
    """Each module under `root` of more than `most` physical lines, by its path relative to `root`."""
    lengths = {path.relative_to(root).as_posix(): len(path.read_bytes().splitlines())
               for path in sorted(root.rglob("*.py"))}
    return {name: n for name, n in lengths.items() if n > most}


def test_no_module_of_the_package_passes_450_lines() -> None:
    long = long_modules(REPO / "fixtures" / "cache_qualify")
    assert long == {}, "modules over 450 lines, to split where their responsibilities split: " + ", ".join(
        f"{name} ({n})" for name, n in long.items())


def test_the_size_rule_counts_physical_lines(tmp_path: Path) -> None:
    (tmp_path / "inner").mkdir()
    (tmp_path / "at.py").write_text("x = 1\n" * 3)
    (tmp_path / "inner" / "over.py").write_text("(\n" + "1,\n" * 2 + ")")   # one statement, four lines
    (tmp_path / "notes.txt").write_text("\n" * 9)
    assert long_modules(tmp_path, most=3) == {"inner/over.py": 4}
