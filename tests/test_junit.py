"""JUnit as a CI shows it: each figure to the digits it means, never float noise (-826.0550000000001), the
reading rule intact on the printed figures, and each failure message saying its outcome once; verdicts.json
keeps every digit.

The rule (`cache_qualify.gate.significant`): a figure in its unit (a mean, a difference, an interval's
bound, an SD) to 6 significant digits, a probability or a level to 4, with more digits where it takes them
to keep the order of figures read against each other (a bound against the null boundary, p against the
level).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from cache_qualify.gate import (CHANCE_DIGITS, READ_TOGETHER, UNIT_DIGITS, failure_message, junit_figures,
                                significant)
from cache_qualify.samples.records import VerdictRecord, figures
from cache_qualify.stats.assertion import Assertion
from cache_qualify.stats.verdict import evaluate
from cache_qualify.units import unit
from tests.support.labfixtures import run_qualify, small_scenario, write_inventory

IN_UNIT = {name for name, how in figures() if how.in_unit}
NOISE = re.compile(r"\d{8,}")   # a run of digits no figure means


def digits(text: str) -> int:
    """Significant digits of a number as written (``-826.055`` 6, ``0.0001235`` 4, ``1234570.0`` 6)."""
    mantissa = text.lstrip("-+").split("e")[0].replace(".", "").lstrip("0")
    return len(mantissa.rstrip("0")) or 1


def pages_record(**figures_: object) -> VerdictRecord:
    """A KV-page verdict that failed, with the float noise of sums and differences in its figures."""
    base = {"id": "kv_pages-no_regression[startup]", "arm": "fat", "metric": "kv_pages", "request": "startup",
            "kind": "no_regression", "unit": "pages", "outcome": "fail", "method": "welch", "design": "paired",
            "alpha": 0.01, "level": 0.0021999999999999997, "trials_baseline": 4, "trials_candidate": 4,
            "baseline_mean": 41301.25, "candidate_mean": 40475.195, "difference": -826.0550000000001,
            "null_boundary": -826.0250000000001, "ci_low": -911.6999999999998, "ci_high": -740.4100000000001,
            "ci_level": 0.9956000000000000, "p_value": 0.48712345678901234, "p_adjusted": 0.48712345678901234,
            "noise_sd": 61.237243569579455, "reason": "Fail: a regression of more than 2 % is shown."}
    return VerdictRecord.of("fat", {**base, **figures_})


def test_junit_figures_carry_the_digits_they_mean_and_verdicts_json_every_digit() -> None:
    record = pages_record()
    shown = junit_figures(record)
    assert shown["difference"] == -826.055 and str(shown["difference"]) == "-826.055"
    assert (shown["baseline_mean"], shown["candidate_mean"], shown["noise_sd"]) == (41301.2, 40475.2, 61.2372)
    assert (shown["p_value"], shown["level"], shown["ci_level"], shown["alpha"]) == (0.4871, 0.0022, 0.9956, 0.01)
    # the upper bound's 6 digits (-740.41) keep it on its side of the boundary; the boundary -826.025 and
    # the difference -826.055 are 6 digits apart from each other
    assert (shown["ci_low"], shown["ci_high"], shown["null_boundary"]) == (-911.7, -740.41, -826.025)
    for name, value in shown.items():
        if isinstance(value, float):
            assert not NOISE.search(str(value)), (name, value)
    written = json.loads(json.dumps(record.to_json()))
    assert written["difference"] == -826.0550000000001 and written["p_value"] == 0.48712345678901234


def test_figures_read_together_keep_their_order_with_the_digits_it_takes() -> None:
    """A bound a hair above the null boundary and p a hair below the level: rounded to 6 and 4 digits
    they would tie, so they keep the digits that tell them apart, and the reading rule holds as printed."""
    record = pages_record(outcome="pass", ci_low=-826.0249999, p_value=0.00219999, p_adjusted=0.00219999,
                          ci_high=-700.0)
    shown = junit_figures(record)
    assert shown["ci_low"] > shown["null_boundary"] and shown["p_value"] < shown["level"], shown
    assert (shown["ci_low"], shown["null_boundary"]) == (-826.0249999, -826.025)
    assert (shown["p_value"], shown["level"]) == (0.00219999, 0.0022)
    assert shown["difference"] == -826.055   # a figure read against none keeps its 6 digits


def test_junit_leaves_out_figures_a_verdict_has_none_of_and_writes_booleans_as_xml_does() -> None:
    """A verdict without a figure (no trials needed, no adjusted p) names none of them, where JUnit read
    `value="None"`; a yes/no figure is XML Schema's `true` / `false`, not Python's `True`."""
    shown = junit_figures(pages_record(trials_needed=None, p_adjusted=None, higher_is_better=False))
    assert "trials_needed" not in shown and "p_adjusted" not in shown, shown
    assert None not in shown.values() and "None" not in map(str, shown.values()), shown
    assert shown["higher_is_better"] == "false"
    assert junit_figures(pages_record())["higher_is_better"] == "true"


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=3, max_size=3),
       st.lists(st.floats(min_value=0, max_value=1, allow_nan=False), min_size=3, max_size=3))
def test_rounding_never_changes_an_order_the_reading_rule_reads(bounds: list[float], chances: list[float]) -> None:
    exact = {**dict(zip(READ_TOGETHER[0], bounds)), **dict(zip(READ_TOGETHER[1], chances)), "difference": bounds[0] / 3}
    shown = {name: float(str(value)) for name, value in significant(exact, in_unit=IN_UNIT).items()}
    for group in READ_TOGETHER:
        for a in group:
            for b in group:
                assert (exact[a] < exact[b]) == (shown[a] < shown[b]), (a, b, exact, shown)
    for name, value in shown.items():
        assert math.isclose(value, exact[name], rel_tol=5e-6 if name in IN_UNIT else 5e-4, abs_tol=1e-300), name
    assert digits(repr(shown["difference"])) <= UNIT_DIGITS


@pytest.mark.parametrize(("outcome", "reason", "says"), [
    ("fail", "Fail: a regression of more than 2 % is shown.", ": candidate - baseline -826 pages (99.56 % interval "
                                                             "-912 to -740 pages). A regression of more than 2 % is shown."),
    ("inconclusive", "Inconclusive: neither shown nor ruled out (p 0.487 >= 0.0022).",
     " is inconclusive, candidate - baseline -826 pages (99.56 % interval -912 to -740 pages). Neither shown nor "
     "ruled out (p 0.487 >= 0.0022)."),
    ("inconclusive", "Inconclusive so far: p 0.487 has not reached this look's 0.0022; more trials follow.",
     " is inconclusive, candidate - baseline -826 pages (99.56 % interval -912 to -740 pages). So far, p 0.487 "
     "has not reached this look's 0.0022; more trials follow."),
])
def test_a_failure_message_says_its_outcome_once(outcome: str, reason: str, says: str) -> None:
    record = pages_record(outcome=outcome, reason=reason)
    message = failure_message(record.id, "set4", record)
    assert message == f"kv_pages-no_regression[startup] (fat vs set4){says}", message
    assert not re.search(r"\b(fail|inconclusive)\b.*\b\1\b", message, re.IGNORECASE), message
    assert not NOISE.search(message), message


def test_a_failure_message_states_each_figure_once() -> None:
    """A KV-page regression as the verdict words it: its interval was in the headline (-2,480 to -2,208
    pages), its upper end again against the boundary (-2208 pages) and the interval a third time in the
    reason's account; now once, with the boundary once."""
    kv = Assertion("kv_pages", "startup", "no_regression", True, margin=0.02, unit="pages")
    base = np.random.default_rng(11).normal(41_300, 30, 5)
    [verdict] = evaluate([kv], {kv.id: (base, base - 2_344)}, alpha=0.01, arm="fat")
    record = verdict.record
    message = failure_message(record.id, "set4", record)
    assert record.outcome == "fail" and "the interval's upper end" in record.reason, record.reason
    assert message.count(" % interval ") == 1 and "interval's upper end" not in message, message
    assert message.count(str(record.null_boundary).split(".")[0][:4]) == 1, message   # the boundary once
    assert message.startswith("kv_pages-no_regression[startup] (fat vs set4). A regression beyond the margin"), message


@pytest.mark.slow
def test_a_runs_junit_shows_figures_without_noise_and_messages_without_doubled_words(tmp_path: Path) -> None:
    """A real qualification on the simulated lab (calibrated noise) whose gain cannot be shown: every float
    property of its JUnit to the digits the rule gives, every failure said once, verdicts.json in full."""
    inventory = write_inventory(tmp_path)
    scenario = small_scenario(tmp_path, "junit-digits", expectations=(
        {"metric": "hit_rate", "request": "A-new-start", "kind": "gain", "min_effect": 0.5},
        {"metric": "kv_pages", "request": "*", "kind": "no_regression", "margin": 0.2}))
    run = run_qualify(inventory, tmp_path / "reports", "--scenario", str(scenario))
    cases = {name: case for name, case in run.testcases().items() if case.find("properties") is not None}
    verdicts = {v["id"]: v for v in json.loads((run.run_dir() / "verdicts.json").read_text())["scenarios"]
                ["junit-digits"]}
    shown_floats, messages = 0, 0
    for name, case in cases.items():
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        if "difference" not in props:
            continue
        verdict = verdicts[next(i for i in verdicts if name.endswith(f"[{i}]"))]
        scale = unit(verdict["unit"]).scale
        for prop, text in props.items():
            if prop not in verdict or not isinstance(verdict[prop], float) or text in ("None", ""):
                continue
            shown_floats += 1
            most = UNIT_DIGITS if prop in IN_UNIT else CHANCE_DIGITS
            group = next((g for g in READ_TOGETHER if prop in g), ())
            assert digits(text) <= most or group, (name, prop, text)
            exact = verdict[prop] * (scale if prop in IN_UNIT else 1)
            assert math.isclose(float(text), exact, rel_tol=10 ** (1 - most), abs_tol=1e-12), (name, prop, text, exact)
        failure = case.find("failure")
        if failure is not None:
            message, messages = failure.get("message", ""), messages + 1
            assert message.startswith("Failed: ") and not re.match(r"Failed: (FAIL|Fail|fail)\b", message), message
            assert not NOISE.search(message), message
    assert shown_floats >= 20 and messages >= 1, run.output[-3000:]   # the gain of 50 pp is not shown
    full = [v["difference"] for v in verdicts.values() if isinstance(v.get("difference"), float)]
    assert any(digits(repr(value)) > UNIT_DIGITS for value in full), full   # verdicts.json keeps every digit
