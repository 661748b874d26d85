"""The exception tree: the diagram at the top of errors.py is the tree the classes make."""

from __future__ import annotations

import re

import pytest

from cache_qualify import errors

_NODE = re.compile(r"^(?P<indent>(?:[│ ]   )*)(?:[├└]── )?(?P<name>[A-Z]\w+)(?:\s|$)")


def diagram_lines() -> list[str]:
    """The diagram in the module's docstring: from its `QualifyError` line on, while lines are
    branches of it, without the indent the docstring gives them all."""
    doc = (errors.__doc__ or "").splitlines()
    root = next((i for i, line in enumerate(doc) if line.strip() == "QualifyError"), None)
    assert root is not None, "errors.py's docstring draws no tree from QualifyError"
    indent = len(doc[root]) - len(doc[root].lstrip())
    lines = [doc[root][indent:]]
    for line in doc[root + 1:]:
        if "── " not in line:
            break
        lines.append(line[indent:])
    return lines


def nodes() -> list[tuple[int, str]]:
    """(depth, class) of every line of the diagram, in drawing order (the root at depth 0). The depth
    of a line is its width of `│   ` / `    ` before `├── ` or `└── `, plus one."""
    found = []
    for n, line in enumerate(diagram_lines()):
        match = _NODE.match(line)
        assert match, f"not a line of the tree: {line!r}"
        found.append((len(match["indent"]) // 4 + 1 if n else 0, match["name"]))
    return found


def diagram() -> list[tuple[str, str | None]]:
    """(class, parent) of every class drawn; the parent of the root is None."""
    drawn: list[tuple[str, str | None]] = []
    parents: list[str] = []   # the chain of classes above the current line
    for depth, name in nodes():
        assert depth <= len(parents), f"{name} is drawn deeper than the line above it allows"
        parents[depth:] = [name]
        drawn.append((name, parents[depth - 1] if depth else None))
    return drawn


def tree() -> list[tuple[str, str | None]]:
    """(class, parent) of every exception class errors.py defines."""
    found: list[tuple[str, str | None]] = []
    for name, cls in vars(errors).items():
        if isinstance(cls, type) and issubclass(cls, errors.QualifyError) and cls.__module__ == errors.__name__:
            bases = [base for base in cls.__bases__ if issubclass(base, errors.QualifyError)]
            assert len(bases) <= 1, f"{name} has several bases in the tree"
            found.append((name, bases[0].__name__ if bases else None))
    return found


def test_the_diagram_is_the_class_tree() -> None:
    drawn, real = diagram(), tree()
    assert len(drawn) == len(set(drawn)), "a class is drawn twice"
    assert sorted(drawn, key=str) == sorted(real, key=str)


def test_the_diagram_is_drawn_as_a_tree() -> None:
    """Each line's prefix is the one a tree drawing gives it: `├──` on a child with a sibling below
    it, `└──` on the last one, and `│` only where an ancestor's branch goes on below."""
    drawn = nodes()

    def goes_on(i: int, depth: int) -> bool:   # another child at `depth` follows line i in its branch
        below = next((d for d, _ in drawn[i + 1:] if d <= depth), None)
        return below == depth

    lines = diagram_lines()
    for i, (depth, name) in enumerate(drawn[1:], start=1):
        prefix = "".join("│   " if goes_on(i, level) else "    " for level in range(1, depth))
        prefix += "├── " if goes_on(i, depth) else "└── "
        assert lines[i].startswith(prefix + name), f"drawn {lines[i]!r}, expected {prefix + name!r}"


@pytest.mark.parametrize("drawn", ["    QualifyError\n    ├── Missing\n",
                                   "    QualifyError\n    └── ConfigError\n            └── InventoryError\n"])
def test_the_parser_fails_on_a_diagram_that_drifted(drawn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a class drawn that does not exist, or a line drawn too deep."""
    monkeypatch.setattr(errors, "__doc__", f"The tree:\n\n{drawn}")
    with pytest.raises(AssertionError, match=r"Missing|drawn deeper than the line above it allows"):
        test_the_diagram_is_the_class_tree()
