"""A method is resolved from its name once, where the name enters (the scenario's `test:`, `--test`,
`--method`, `evaluate(method=...)`); the decision, sizing and validation code receive the object and read its
`name` only to show it."""

from __future__ import annotations

import ast
import dataclasses
import math

import numpy as np
import pytest

from cache_qualify.errors import PlanError
from cache_qualify.methods import METHODS, NAMES, method, resolved
from cache_qualify.methods.default import DEFAULT_METHOD
from cache_qualify.methods.kinds import TestMethod
from cache_qualify.stats.levels import check_plan
from cache_qualify.stats.manytoone import Tournament
from cache_qualify.stats.power import minimum_trials, trials_for_power
from cache_qualify.stats.verdict import Assertion, Trials, evaluate
from tests.support.labfixtures import REPO

PACKAGE = REPO / "fixtures" / "cache_qualify"
GAIN = Assertion("hit_rate", "A-again", "gain", True, min_effect=0.01, unit="fraction")
# the code that decides, sizes and validates: it takes the method as an object
PASSING = ("stats", "sizing", "validation", "trials", "qualification", "cli")
ENTRY_POINTS = {("stats/verdict.py", "evaluate")}     # documented calls name the method: resolved there
OBJECTS = {"TestMethod", "SpreadTest", "DataTest"}      # cache_qualify.methods.kinds


def _blocked(base: list[float], cand: list[float]) -> tuple[Trials, Trials]:
    blocks = tuple(range(len(base)))
    return Trials(tuple(base), blocks=blocks), Trials(tuple(cand), blocks=blocks)


SAMPLES = {GAIN.id: _blocked([0.80, 0.82, 0.79, 0.81, 0.80, 0.83], [0.83, 0.84, 0.83, 0.82, 0.84, 0.85])}


def test_the_default_is_the_registered_default_and_a_name_resolves_once() -> None:
    assert DEFAULT_METHOD is METHODS[NAMES[0]]
    for name, m in METHODS.items():
        assert resolved(name) is m and resolved(m) is m
    with pytest.raises(PlanError, match=rf"`method` must be one of {', '.join(NAMES)}, got 'ks'"):
        resolved("ks")


@pytest.mark.parametrize("name", NAMES)
def test_evaluate_decides_the_same_given_the_method_or_its_name(name: str) -> None:
    [by_name] = evaluate([GAIN], SAMPLES, alpha=0.05, method=name)
    [by_object] = evaluate([GAIN], SAMPLES, alpha=0.05, method=method(name))
    assert by_object.as_dict() == by_name.as_dict() and by_object.method == name


def test_the_object_given_is_the_one_that_decides_sizes_and_is_named() -> None:
    """A method that is not registered (the t test under another name, described and sized otherwise): the
    verdict, the plan check and the sizing read the object handed to them, not the registry."""
    own = dataclasses.replace(DEFAULT_METHOD, name="t-own", paired_name="own paired t", trials_factor=3.0)
    [v] = evaluate([GAIN], SAMPLES, alpha=0.05, method=own)
    [t] = evaluate([GAIN], SAMPLES, alpha=0.05)
    assert v.method == "t-own" and v.record.method == "t-own" and t.method == DEFAULT_METHOD.name
    assert "own paired t" in v.reason and "own paired t" not in t.reason, v.reason
    assert (v.p_value, v.outcome) == (t.p_value, t.outcome)      # the same test underneath
    single = trials_for_power(0.01, 0.02, alpha=0.05, paired=True)
    assert single is not None
    assert trials_for_power(0.01, 0.02, alpha=0.05, method=own, paired=True) == math.ceil(single * 3.0)
    assert minimum_trials(own, 0.05, paired=True) == minimum_trials(DEFAULT_METHOD, 0.05, paired=True)
    with pytest.raises(PlanError, match=r"^t-own cannot reach alpha 0.01 .* with 1 trial\(s\) per build"):
        check_plan(method=own, alpha=0.01, trials_per_build=1)
    arms = Tournament(["c"], [GAIN], alpha=0.05, method=own, looks=(6,))
    arms.look(1, {"c": SAMPLES})
    [decided] = arms.verdicts("c")
    assert decided.method == "t-own" and "own paired t" in decided.reason


def _method_parameters(tree: ast.AST) -> list[tuple[str, str]]:
    """(function, annotation) of every parameter named `method`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if arg.arg == "method":
                    found.append((node.name, ast.unparse(arg.annotation) if arg.annotation else ""))
    return found


def test_the_deciding_code_takes_the_method_as_an_object() -> None:
    taken = {(str(path.relative_to(PACKAGE)), name): annotation
             for folder in PASSING for path in sorted((PACKAGE / folder).rglob("*.py"))
             for name, annotation in _method_parameters(ast.parse(path.read_text(encoding="utf-8")))}
    named = {where: a for where, a in taken.items()
             if (a != "str | TestMethod" if where in ENTRY_POINTS else a not in OBJECTS)}
    assert len(taken) >= 10 and ENTRY_POINTS <= set(taken) and named == {}, named
    assert not any(isinstance(node, ast.Assign) and ast.unparse(node.value) == "str"
                   and any(ast.unparse(t) == "Method" for t in node.targets)
                   for path in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))
    assert _method_parameters(ast.parse("def f(method: str) -> None: pass")) == [("f", "str")]  # it can see one


def test_a_method_not_registered_still_refuses_what_it_cannot_model() -> None:
    """The crossover check reads the object's `crossover_name`, so a method without one refuses the
    host-group design whatever its name."""
    from cache_qualify.trials.crossover import check_arms
    check_arms(("c",), DEFAULT_METHOD)
    blind = dataclasses.replace(DEFAULT_METHOD, name="t-blind", crossover_name=None)
    with pytest.raises(PlanError, match=r"only the t test does .*the scenario's test is t-blind$"):
        check_arms(("c",), blind)
    assert isinstance(blind, TestMethod) and np.isfinite(blind.minimum_p(4, paired=True))
