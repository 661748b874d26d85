"""One verdict record: verdicts.json, JUnit's properties and the history's verdict rows are renderings of
`VerdictRecord`, each field saying where it is shown (`Figure`), so none can lose a figure the others have."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from cache_qualify.gate import junit_figures
from cache_qualify.history import schema
from cache_qualify.history.rows import verdict_row
from cache_qualify.samples.records import ClaimRecord, VerdictRecord, figures
from cache_qualify.stats.assertion import Assertion
from cache_qualify.stats.manytoone import Tournament
from cache_qualify.stats.verdict import Trials, Verdict, VerdictWarning, evaluate
from cache_qualify.units import unit

WAIT = Assertion("readiness_wait_ns", "B-new-start", "gain", False, min_effect=5e7, unit="ns")
PER_START = {"baseline", "candidate", "flagged_starts", "extra"}   # the history keeps these in tables of their own


def _record() -> VerdictRecord:
    rng = np.random.default_rng(2)
    base, cand = 2.0e9 + rng.normal(0, 2e7, 8), 1.8e9 + rng.normal(0, 2e7, 8)
    [verdict] = evaluate([WAIT], {WAIT.id: (base, cand)}, alpha=0.01, arm="two_choice")
    return verdict.record


def test_every_field_of_the_record_says_where_it_is_shown() -> None:
    shown = {name for name, _ in figures()}
    assert {f.name for f in fields(VerdictRecord)} - shown == PER_START
    assert {name for name, how in figures() if how.in_unit} <= {name for name, how in figures() if how.junit
                                                                or how.history}


def test_verdicts_json_and_junit_show_the_same_figures(tmp_path: Path) -> None:
    record = _record()
    written = json.loads(json.dumps(record.to_json(), allow_nan=False))
    assert VerdictRecord.from_json(written, path="verdicts.json") == record   # read back as written
    shown = junit_figures(record)
    ns = unit("ns")
    expected = {name for name, how in figures() if how.junit and not how.with_history   # no history noise here
                and written[name] is not None}   # a figure it has none of is absent, never "None"
    assert set(shown) == expected | {"unit", "difference_unit"}
    for name, how in figures():
        if name in expected:
            value = written[name]
            if isinstance(value, bool):
                assert shown[name] == str(value).lower(), name   # XML Schema's true / false
                continue
            if not isinstance(value, float):
                assert shown[name] == value, name
                continue
            # JUnit's figure is the record's, in the shown unit, to the digits it means (tests/test_junit.py)
            exact = ns.to_shown(value) if how.in_unit else value
            assert math.isclose(shown[name], exact, rel_tol=5e-6 if how.in_unit else 5e-4), name
    assert shown["unit"] == ns.shown and record.outcome == "pass"


def test_the_history_keeps_every_figure_it_lists(tmp_path: Path) -> None:
    record = _record()
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'h.sqlite'}")
    with engine.begin() as conn:
        schema.metadata.create_all(conn)
        conn.execute(schema.verdicts.insert(), [verdict_row("r1", "reread-1g", record)])
        (row,) = conn.execute(sa.select(schema.verdicts)).mappings().all()
    engine.dispose()
    kept = {how.column or name: name for name, how in figures() if how.history}
    assert set(row) == {"run_id", "scenario", *kept}
    for column, name in kept.items():
        value = getattr(record, name)
        assert row[column] == (list(value) if isinstance(value, tuple) else value), column


def test_a_recorded_error_says_which_process_met_it_in_words_for_a_person() -> None:
    claim = ClaimRecord(session="s1", pid=13722, group="default", error="host gb10-1: the lock is held",
                        error_kind="LockHeld")
    error = claim.as_error("reread-1g")
    assert error is not None and str(error) == (
        "LockHeld: host gb10-1: the lock is held (met by the run's process 13722, which measured scenario "
        "reread-1g on host group default for every process of this run; this one read it from the run "
        "folder's claims/reread-1g.json)")
    assert ClaimRecord(session="s1", pid=1).as_error("reread-1g") is None


def test_a_verdict_is_its_one_record_built_when_decided_for_its_arm() -> None:
    """A decision's verdict stores its record and nothing beside it, tagged with the candidate arm it was
    decided for; its decision's view (assertion, interval, boundary, figures) reads the record's fields."""
    assert [f.name for f in fields(Verdict)] == ["record"]
    rng = np.random.default_rng(4)
    base = 2.0e9 + rng.normal(0, 2e7, 8)
    arms = Tournament(["two_choice", "lru"], [WAIT], alpha=0.01, looks=(8,))
    arms.look(1, {c: {WAIT.id: (base, base * shift + rng.normal(0, 2e7, 8))}
                  for c, shift in (("two_choice", 0.9), ("lru", 1.0))})
    for arm in ("two_choice", "lru"):
        [v] = arms.verdicts(arm)
        r = v.record
        assert r.arm == arm and v.assertion == WAIT and r.id == WAIT.id
        assert v.ci == (r.ci_low, r.ci_high, r.ci_level) and v.boundary == r.null_boundary
        assert (v.difference, v.p_value, v.noise_sd) == (r.difference, r.p_value, r.noise_sd)
        assert v.as_dict() == {k: x for k, x in r.to_json().items() if k != "arm"}
    # three starts a build: no shift reaches the level, so the interval has no finite end, and says so
    hit = Assertion("hit_rate", "A-third-read", "gain", True)
    with pytest.warns(VerdictWarning, match="below the values' resolution"):
        [few] = evaluate([hit], {hit.id: ([0.86, 0.86, 0.861], [0.87, 0.87, 0.871])}, alpha=0.05,
                         method="mannwhitney")
    assert (few.ci.low, few.ci.high) == (-math.inf, math.inf) and (few.record.ci_low, few.record.ci_high) == (None, None)


def test_a_flagged_start_keeps_its_distances_and_side_and_its_file_three_decimals() -> None:
    """The record holds a flagged start's distances as decided (JUnit describes the start with them, as the
    reason does) and its side; verdicts.json keeps them to 3 decimals and reads back."""
    rng = np.random.default_rng(1)
    base, cand = 2.0e9 * rng.lognormal(0, 0.05, 8), 1.2e9 * rng.lognormal(0, 0.05, 8)
    cand[3] *= 4.0      # a bad start of the candidate's: far out on the wait's worse (longer) side
    ids = tuple(range(8))
    [v] = evaluate([WAIT], {WAIT.id: (Trials(tuple(base), ids, ids), Trials(tuple(cand), ids, ids))}, alpha=0.05)
    [flag] = v.flagged
    assert (flag.arm, flag.start, flag.worse) == ("candidate", 3, True)
    assert f"Flagged start: {flag.describe()}." in v.reason
    [written] = v.record.to_json()["flagged_starts"]
    assert written["studentized_distance"] == [round(z, 3) for z in flag.distance] != list(flag.distance)
    again = VerdictRecord.from_json(json.loads(json.dumps(v.as_dict())), path="verdicts.json")
    assert again.flagged_starts[0].studentized_distance == tuple(round(z, 3) for z in flag.distance)
