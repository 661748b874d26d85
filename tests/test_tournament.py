"""Several candidates against one baseline, end to end on the simulated lab: `pytest qualify
--candidate a,b,c` with the real emulated servers, then its JUnit, summary.md, arms and provenance."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cache_qualify.samples.records import ArmRecord, ArmsRecord, Plan, VerdictRecord
from cache_qualify.stats.manytoone import screening_level
from cache_qualify.trials.runner import interleave
from tests.support.labfixtures import QualifyRun, run_qualify, write_inventory

ARMS = ("set4", "set8", "set16", "two_choice", "lru4")
GAINS = ("hit_rate-gain[B-new-start]", "hit_rate-gain[A-third-read]", "readiness_wait-gain[B-new-start]",
         "readiness_wait-gain[A-third-read]")


def _properties(run: QualifyRun, name: str) -> dict[str, str]:
    case = run.testcases()[name]
    return {p.get("name", ""): p.get("value", "") for p in case.iter("property")}


def _failure(run: QualifyRun, name: str) -> str | None:
    failure = run.testcases()[name].find("failure")
    return None if failure is None else failure.get("message", "") + (failure.text or "")


# the tests of the four-candidate run share it: one xdist worker runs them, so it is run once
ON_FOUR = pytest.mark.xdist_group("tournament-four")


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> QualifyRun:
    """The RowCache study's four alternatives against set4, sequential (2 trials, then 3), seeded."""
    tmp = tmp_path_factory.mktemp("tournament")
    return run_qualify(write_inventory(tmp), tmp / "reports", "--candidate", "set8,set16,two_choice,lru4",
                       "--trials", "2", "--max-trials", "3", "--seed", "7", timeout_s=600)


@pytest.mark.slow
@ON_FOUR
def test_gate_passes_three_candidates_and_fails_lru4_on_the_third_read(four: QualifyRun) -> None:
    assert four.returncode == 1, four.output  # each candidate is a gate of its own: lru4 fails the run
    for candidate in ("set8", "set16", "two_choice"):
        for aid in GAINS + ("kv_pages-no_regression[startup]",):
            test = "test_kv_pages" if aid.startswith("kv_pages") else "test_row_cache"
            assert _failure(four, f"{test}[{candidate}:{aid}]") is None, candidate + aid
    third = _failure(four, "test_row_cache[lru4:hit_rate-gain[A-third-read]]")
    assert third is not None and "hit_rate-gain[A-third-read] (lru4 vs set4). A regression is shown" in third
    props = _properties(four, "test_row_cache[lru4:hit_rate-gain[A-third-read]]")
    assert (props["candidate"], props["candidate_build"], props["baseline_build"], props["mode"]) == \
        ("lru4", "lru4", "set4", "gate")
    assert props["candidate_starts"] == "2" and props["candidate_stopped"].startswith("look 1, after 2 trials")
    assert _properties(four, "test_row_cache[two_choice:hit_rate-gain[B-new-start]]")["candidate_build"] == \
        "two_choice"


@pytest.mark.slow
@ON_FOUR
def test_blocks_hold_every_running_arm_in_the_seeded_order(four: QualifyRun) -> None:
    trials = pd.read_csv(four.run_dir() / "trials.csv")
    first_look = trials[trials["trial"] < 2].sort_values("started_at")
    expected = interleave(ARMS, trials=2, block_size=1, seed=7)
    assert list(first_look["build"]) == [s.build for s in expected]
    assert list(first_look["block"]) == [s.block for s in expected]
    # lru4 failed at the first look: it never started again, while the baseline ran as long as any candidate
    assert sorted(trials[trials["build"] == "lru4"]["trial"]) == [0, 1]
    assert trials["trial"].max() == (trials["build"] == "set4").sum() - 1


@pytest.mark.slow
@ON_FOUR
def test_report_ranks_two_choice_first_and_recommends_it(four: QualifyRun) -> None:
    summary = (four.run_dir() / "summary.md").read_text(encoding="utf-8")
    candidates = summary[summary.index("## Candidates"):]
    rows = [line for line in candidates.splitlines() if line.startswith("| ") and "`" in line]
    assert [row.split("|")[2].strip() for row in rows] == ["`two_choice`", "`set16`", "`set8`", "`lru4`"]
    assert [row.split("|")[3].strip() for row in rows] == ["PASS", "PASS", "PASS", "FAIL"]
    assert "| 2 | `set16` | PASS | 16 index entries scanned per lookup (4 now) | +" in candidates
    header = candidates.splitlines()[6]
    assert "Hit rate B-new-start" in header and "Readiness wait A-third-read" in header and "KV pages startup" in header
    assert summary.rstrip().endswith("**Recommendation: `two_choice`**, the best-ranked candidate that passes "
                                     "every assertion.")
    assert "| `lru4` | candidate | look 1, after 2 trials per build: failed hit_rate-gain[B-new-start], " \
           "hit_rate-gain[A-third-read]" in summary


@pytest.mark.slow
@ON_FOUR
def test_lab_time_per_arm_in_the_report_and_provenance(four: QualifyRun) -> None:
    run_dir = four.run_dir()
    trials = pd.read_csv(run_dir / "trials.csv")
    starts = json.loads((run_dir / "provenance.json").read_text(encoding="utf-8"))["starts"]["reread-1g"]
    assert starts == {arm: int((trials["build"] == arm).sum()) for arm in ARMS}
    arms = json.loads((run_dir / "arms-reread-1g.json").read_text(encoding="utf-8"))
    assert {a["label"]: a["starts"] for a in arms["arms"]} == starts
    separate = 2 * sum(n for arm, n in starts.items() if arm != "set4")
    summary = (run_dir / "summary.md").read_text(encoding="utf-8")
    saving = 1 - sum(starts.values()) / separate
    assert saving >= 0.30
    assert (f"Lab time: {sum(starts.values())} server starts; one two-arm run per candidate, deciding alike, "
            f"would have needed {separate} ({saving:.0%} fewer here).") in summary


@pytest.mark.slow
def test_tournament_exits_zero_when_one_candidate_passes(tmp_path: Path) -> None:
    run = run_qualify(write_inventory(tmp_path), tmp_path / "reports", "--candidate", "lru4,two_choice",
                      "--tournament", "--alpha", "0.05", "--trials", "2", "--max-trials", "2", "--seed", "3",
                      timeout_s=600)
    assert run.returncode == 0, run.output
    assert "--tournament: exit status 0, two_choice passed every assertion (failed: lru4)" in run.output
    outcome = json.loads((run.run_dir() / "outcome.json").read_text(encoding="utf-8"))
    assert (outcome["exit_status"], outcome["mode"], outcome["recommended"]) == (0, "screening", "two_choice")
    assert _failure(run, "test_row_cache[lru4:hit_rate-gain[A-third-read]]") is not None  # still shown failed
    props = _properties(run, "test_row_cache[two_choice:hit_rate-gain[B-new-start]]")
    # the family's alpha, and each candidate at the t-scale many-to-one level of two candidates on 2 blocks
    assert props["mode"] == "screening" and float(props["alpha"]) == 0.05
    assert float(props["level"]) == pytest.approx(screening_level(0.05, 2, units=2), rel=5e-4)  # 4 significant digits
    summary = (run.run_dir() / "summary.md").read_text(encoding="utf-8")
    assert "Mode: **screening**" in summary and "## Scenario `reread-1g`: PASS" in summary
    assert summary.rstrip().endswith("**Recommendation: `two_choice`**, the best-ranked candidate that passes "
                                     "every assertion.")


def _verdict(arm: str, aid: str, outcome: str, difference: float, higher: bool = True) -> VerdictRecord:
    metric, rest = aid.split("-", 1)
    return VerdictRecord(arm=arm, id=aid, metric=metric, request=rest.split("[", 1)[1].rstrip("]"),
                         kind=rest.split("[", 1)[0], higher_is_better=higher,
                         outcome=outcome, difference=difference, ci_low=difference - abs(difference) / 10,
                         ci_high=difference + abs(difference) / 10)


def test_recommendation_says_when_no_candidate_passes(tmp_path: Path) -> None:
    """Ranked by the primary gain even when it is a lower-is-better one; no pass, no recommendation."""
    from cache_qualify.samples.rundata import RunData
    from cache_qualify.report.tournament import recommendation

    primary, kv = "readiness_wait_ns-gain[B-new-start]", "kv_pages-no_regression[startup]"
    verdicts = [_verdict("slow", primary, "fail", 2e8, higher=False), _verdict("slow", kv, "pass", -3),
                _verdict("fast", primary, "pass", -9e8, higher=False), _verdict("fast", kv, "fail", -900)]
    arms = ArmsRecord(mode="gate", arms=(ArmRecord("base", "base", "baseline", starts=3),
                                         ArmRecord("slow", "slow", "candidate", "one more probe", starts=2),
                                         ArmRecord("fast", "fast", "candidate", "", starts=3)))
    trials = pd.DataFrame(columns=["scenario", "build", "trial", "outcome"])
    data = RunData(tmp_path, Plan(run_id="r", seed=0, scenarios=("s",), baseline="base"), pd.DataFrame(), trials,
                   {"s": tuple(verdicts)}, {}, {"s": arms})
    lines = recommendation(data)
    rows = [line for line in lines if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert rows[0] == "| 1 | `fast` | FAIL | — | -0.900 s (-0.990 to -0.810) | -900 pages (-990 to -810) | 3 |"
    assert rows[1] == "| 2 | `slow` | FAIL | one more probe | +0.200 s (+0.180 to +0.220) | -3 pages (-3 to -3) | 2 |"
    assert lines[-1] == "**Recommendation: none**: no candidate passes every assertion."
