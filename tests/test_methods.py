"""A test method is one registered object (cache_qualify.methods): the scenario's `test:` field, its JSON
schema, `--test`, the plan's checks and the sizing read the registry, and no module outside a method's
own names a method to branch on it."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest

from cache_qualify.config.scenario import MethodName
from cache_qualify.errors import PlanError
from cache_qualify.methods import DEFAULT, METHODS, NAMES, method
from cache_qualify.methods.kinds import DataTest, SpreadTest
from cache_qualify.stats.levels import check_plan
from cache_qualify.stats.power import minimum_trials, trials_for_power
from tests.support.labfixtures import REPO

PACKAGE = REPO / "fixtures" / "cache_qualify"


def test_every_method_is_one_frozen_object_under_its_name() -> None:
    assert NAMES == tuple(METHODS) and DEFAULT in NAMES and len(set(NAMES)) == len(NAMES) >= 3
    for name, m in METHODS.items():
        assert m.name == name and method(name) is m
        assert isinstance(m, SpreadTest | DataTest) and dataclasses.is_dataclass(m)
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign"):
            m.name = "other"  # type: ignore[misc]
        assert m.paired_name and m.unpaired_name and m.trials_factor >= 1
    described = [m.described(p) for m in METHODS.values() for p in (False, True)]
    assert len(set(described)) == len(described), described
    with pytest.raises(PlanError, match=rf"`method` must be one of {', '.join(NAMES)}, got 'ks'"):
        method("ks")


def test_the_scenario_field_and_its_schema_read_the_registry() -> None:
    field = pydantic.TypeAdapter(MethodName)
    assert [field.validate_python(name) for name in NAMES] == list(NAMES)
    listed = ", ".join(repr(n) for n in NAMES[:-1]) + f" or {NAMES[-1]!r}"
    with pytest.raises(pydantic.ValidationError, match=f"expected {listed}, found 'ttest'"):
        field.validate_python("ttest")
    committed = json.loads((PACKAGE / "config" / "schema" / "scenario.schema.json").read_text(encoding="utf-8"))
    assert committed["properties"]["test"]["enum"] == list(NAMES)
    assert committed["properties"]["test"]["default"] == DEFAULT


@pytest.mark.slow
def test_the_test_option_reads_the_registry(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--test", "ttest"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    choices = ", ".join(repr(n) for n in NAMES)
    assert f"argument --test: invalid choice: 'ttest' (choose from {choices})" in proc.stderr, proc.stderr


@pytest.mark.parametrize("paired", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_the_plan_check_and_the_sizing_read_each_method(name: str, paired: bool) -> None:
    m = method(name)
    fewest = minimum_trials(m, 0.01, paired=paired)
    assert m.minimum_p(fewest, paired=paired) < 0.01 <= m.minimum_p(fewest - 1, paired=paired) or fewest == 2
    check_plan(method=m, alpha=0.01, trials_per_build=fewest, paired=paired)
    if fewest > 2:
        with pytest.raises(PlanError, match=rf"{name} cannot reach .* at least {fewest} trials per build"):
            check_plan(method=m, alpha=0.01, trials_per_build=fewest - 1, paired=paired)
    t_test = trials_for_power(0.1, 0.1, alpha=0.01, method=METHODS[DEFAULT], paired=paired)
    sized = trials_for_power(0.1, 0.1, alpha=0.01, method=m, paired=paired)
    assert t_test is not None and sized is not None
    assert sized == max(fewest, -(-t_test * m.trials_factor // 1)), (sized, t_test, m.trials_factor)


def _named_methods(tree: ast.AST) -> list[int]:
    """Lines comparing a value with a method's name, or listing two or more of the names."""
    def names(node: ast.AST) -> list[str]:
        return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in NAMES]

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(names(c) for c in [node.left, *node.comparators]):
            found.append(node.lineno)
        elif isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict) and len(names(node)) >= 2:
            found.append(node.lineno)
    return found


def test_no_module_outside_the_methods_branches_on_a_method_name() -> None:
    own = PACKAGE / "methods"
    branches = {str(path.relative_to(REPO)): lines for path in sorted(PACKAGE.rglob("*.py"))
                if own not in path.parents
                and (lines := _named_methods(ast.parse(path.read_text(encoding="utf-8"))))}
    assert branches == {}, f"ask the method (cache_qualify.methods), not its name: {branches}"
    assert _named_methods(ast.parse(f"if method == {DEFAULT!r}: pass")) == [1]   # the check can see one
