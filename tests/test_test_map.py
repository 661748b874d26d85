"""tests/README.md maps the suite's promises to the tests that prove them: every test it names exists, and
every test file is named there, so a test renamed, removed or added without the map fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
MAP = TESTS / "README.md"
REFERENCE = re.compile(r"\btests/((?:[\w-]+/)*test_\w+\.py)::(\w+)")


def functions_of(path: Path) -> set[str]:
    """The test functions of a module, at its top level or in its classes (a parametrized test is one)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in tree.body:
        bodies = node.body if isinstance(node, ast.ClassDef) else [node]
        found.update(f.name for f in bodies if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and f.name.startswith("test_"))
    return found


def references(text: str) -> list[tuple[str, str]]:
    return REFERENCE.findall(text)


def test_every_test_the_map_names_exists() -> None:
    named = references(MAP.read_text(encoding="utf-8"))
    assert len(named) > 100, "the map names too few tests to be one"
    defined = {file: functions_of(TESTS / file) for file in {file for file, _ in named} if (TESTS / file).is_file()}
    missing = [f"tests/{file} (no such file)" if file not in defined else f"tests/{file}::{name}"
               for file, name in named if name not in defined.get(file, ())]
    assert not missing, f"tests/README.md names tests that do not exist: {', '.join(sorted(set(missing)))}"


def test_every_test_file_is_in_the_map() -> None:
    mapped = {file for file, _ in references(MAP.read_text(encoding="utf-8"))}
    files = {str(path.relative_to(TESTS)) for path in TESTS.rglob("test_*.py") if "support" not in path.parts}
    assert files - mapped == set(), "test files tests/README.md does not map to a promise"


def test_the_check_finds_a_test_that_is_not_there(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("def test_a():\n    pass\n\nclass TestB:\n    def test_c(self):\n        pass\n\n"
                      "def helper():\n    pass\n", encoding="utf-8")
    assert functions_of(module) == {"test_a", "test_c"}
    text = "proved by `tests/test_x.py::test_a` and tests/sim/test_y.py::test_z, not tests/support/x.py::f"
    assert references(text) == [("test_x.py", "test_a"), ("sim/test_y.py", "test_z")]
