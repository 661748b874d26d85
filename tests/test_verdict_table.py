"""summary.md's verdicts table reads as the rule does: no "-0" figure, and a pass's interval end never
reads equal to the null boundary it cleared."""

from __future__ import annotations

import re

from cache_qualify.report.tables import verdict_rows
from cache_qualify.samples.records import VerdictRecord
from cache_qualify.units import unit

WAIT = "readiness_wait-gain[B-new-start]"


def _pass(null_boundary: float, ci_low: float, ci_high: float, higher_is_better: bool = False) -> VerdictRecord:
    return VerdictRecord(id=WAIT, arm="c", metric="readiness_wait", request="B-new-start", kind="gain",
                         higher_is_better=higher_is_better, unit="s", outcome="pass", baseline_mean=2.0,
                         candidate_mean=1.7, difference=(ci_low + ci_high) / 2, null_boundary=null_boundary,
                         ci_low=ci_low, ci_high=ci_high, ci_level=0.9, p_value=0.01, p_adjusted=0.01,
                         trials_baseline=6, trials_candidate=6)


def _row(v: VerdictRecord) -> list[str]:
    [line] = [row for row in verdict_rows([v]) if row.startswith(f"| `{v.id}`")]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_a_zero_boundary_and_an_end_that_rounds_to_it_read_apart_and_unsigned() -> None:
    cells = _row(_pass(-0.0, -0.6, -0.0004))
    boundary, interval = cells[5], cells[6]
    assert boundary == "0.000 s", cells
    assert not re.search(r"-0\.0+\b(?!\d)", " ".join(cells)), cells
    low, high = interval.split(" to ")
    assert high == "-0.0004 s" and high.split(" ")[0] != boundary.split(" ")[0], cells


def test_an_end_just_past_a_boundary_shows_the_digits_that_set_them_apart() -> None:
    cells = _row(_pass(0.2, 0.2003, 0.5, higher_is_better=True))
    low = cells[6].split(" to ")[0]
    assert (cells[5], low) == ("+0.200 s", "+0.2003"), cells


def test_a_figure_that_rounds_to_zero_has_no_sign() -> None:
    s = unit("s")
    assert [s.format(x, signed=True) for x in (-0.0, 0.0, -1e-9, 4e-5)] == ["0.000 s"] * 4
    assert s.format(-0.0004, signed=True, decimals=4) == "-0.0004 s"
    assert unit("fraction").format(-0.00001, signed=True) == "0.00 pp"


def test_a_column_no_verdict_has_a_figure_for_is_left_out() -> None:
    """A decided run sizes no more trials: no "Trials needed" column of "—" in every row; an undecided
    verdict that has the figure brings the column back, with "—" for the others."""
    decided = [_pass(0.2, 0.3, 0.5, higher_is_better=True)]
    header = next(line for line in verdict_rows(decided) if line.startswith("| Assertion"))
    assert "Trials needed" not in header and "Trials (baseline / candidate)" in header, header
    undecided = VerdictRecord(**{**decided[0].__dict__, "id": "kv_pages-gain[A]", "outcome": "inconclusive",
                                 "trials_needed": 14})
    lines = verdict_rows([*decided, undecided])
    assert "Trials needed" in next(line for line in lines if line.startswith("| Assertion"))
    assert [line.rstrip(" |").rsplit("| ", 1)[-1] for line in lines if line.startswith("| `")] == ["—", "14"]


def test_the_verdicts_say_when_the_historys_noise_was_used_from_which_runs_in_the_tables_unit() -> None:
    """`--history-noise` was not mentioned in summary.md at all; its SD was raw ns beside text in s."""
    plain = _pass(0.2, 0.3, 0.5, higher_is_better=True)
    assert not [line for line in verdict_rows([plain]) if "History" in line]
    used = VerdictRecord(**{**plain.__dict__, "unit": "ns", "history_sd": 61_000_000.0, "history_df": 9,
                            "history_runs": ("lab003", "lab004"), "history_used": True})
    lines = verdict_rows([used])
    assert "History's noise (`--history-noise`):" in lines, lines
    assert (f"- `{WAIT}`: SD 0.061 s (9 degrees of freedom) over the earlier run(s) `lab003`, `lab004`: "
            f"pooled with this run's.") in lines, lines
