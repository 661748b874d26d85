"""One function decides a run (`cache_qualify.stats.outcome.decide`): each candidate's and scenario's
outcome, the recommendation and the exit status, which the plugin exits with and the report shows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cache_qualify.samples.records import VerdictRecord
from cache_qualify.stats.outcome import ScenarioFacts, decide

GAIN, WAIT, KV = "hit_rate-gain[B-new-start]", "readiness_wait_ns-gain[B-new-start]", "kv_pages-no_regression[startup]"


def verdicts(arm: str, *outcomes: str, gain: float = 0.1) -> tuple[VerdictRecord, ...]:
    """One verdict per outcome, on the assertions GAIN, WAIT, KV in order (the gain's difference `gain`)."""
    ids = (GAIN, WAIT, KV)
    return tuple(VerdictRecord(id=ids[i], arm=arm, metric=ids[i].split("-", 1)[0],
                               kind="gain" if "-gain[" in ids[i] else "no_regression", outcome=o,
                               higher_is_better=ids[i] != WAIT, difference=gain if i == 0 else 0.0)
                 for i, o in enumerate(outcomes))


def scenario(*candidates: str, **facts: object) -> ScenarioFacts:
    return replace(ScenarioFacts("reread-1g", tuple(candidates)), **facts)  # type: ignore[arg-type]


PASS = verdicts("two_choice", "pass", "pass", "pass")


def test_every_assertion_passing_passes_and_exits_zero() -> None:
    run = decide([scenario("two_choice", verdicts=PASS)], mode="gate")
    assert (run.overall, run.exit_status, run.errors, run.recommended, run.ranked) == ("pass", 0, (), None, False)
    assert run.scenarios[0].candidates[0].outcome == "pass" and run.scenarios[0].primary == GAIN


@pytest.mark.parametrize(("outcomes", "expected"), [(("pass", "fail", "pass"), "fail"),
                                                    (("pass", "inconclusive", "pass"), "inconclusive"),
                                                    (("fail", "inconclusive", "pass"), "fail")])
def test_a_failed_or_inconclusive_verdict_exits_one(outcomes: tuple[str, ...], expected: str) -> None:
    run = decide([scenario("two_choice", verdicts=verdicts("two_choice", *outcomes))], mode="gate")
    assert (run.overall, run.exit_status, run.scenarios[0].candidates[0].outcome) == (expected, 1, expected)


def test_a_candidate_without_a_verdict_is_inconclusive_and_fails_the_gate() -> None:
    run = decide([scenario("two_choice", "set8", verdicts=PASS)], mode="gate")
    assert [(c.candidate, c.outcome) for c in run.scenarios[0].candidates] == [("two_choice", "pass"),
                                                                               ("set8", "inconclusive")]
    assert run.exit_status == 1


def test_gate_mode_needs_every_candidate_to_pass_and_recommends_the_best() -> None:
    facts = scenario("set8", "two_choice", "lru4", verdicts=(
        *verdicts("set8", "pass", "pass", "pass", gain=0.05), *PASS, *verdicts("lru4", "fail", "pass", "pass", gain=0.2)))
    run = decide([facts], mode="gate")
    assert run.scenarios[0].ranking == ("lru4", "two_choice", "set8")  # by the primary gain, whatever passed
    assert (run.ranked, run.recommended, run.overall, run.exit_status, run.note) == (True, "two_choice", "fail", 1, "")


def test_screening_exits_zero_when_one_candidate_passes_everything() -> None:
    facts = scenario("lru4", "two_choice", verdicts=(*verdicts("lru4", "fail", "pass", "pass"), *PASS))
    run = decide([facts], mode="screening")
    assert (run.overall, run.exit_status, run.recommended) == ("pass", 0, "two_choice")
    assert run.note == "--tournament: exit status 0, two_choice passed every assertion (failed: lru4)"
    none = decide([scenario("lru4", verdicts=verdicts("lru4", "fail", "pass", "pass"))], mode="screening")
    assert (none.overall, none.exit_status, none.note) == ("fail", 1, "")


def test_screening_counts_a_candidate_over_every_scenario() -> None:
    first = scenario("set8", "two_choice", verdicts=(*verdicts("set8", "pass", "pass", "pass"), *PASS))
    second = replace(first, scenario="reread-4g", verdicts=(*verdicts("set8", "fail", "pass", "pass"),
                                                           *verdicts("two_choice", "pass", "inconclusive", "pass")))
    run = decide([first, second], mode="screening")
    assert run.exit_status == 1 and run.recommended is None


@pytest.mark.parametrize("mode", ["gate", "screening"])
def test_a_failed_trial_fails_the_scenario_and_the_run(mode: str) -> None:
    run = decide([scenario("two_choice", verdicts=PASS, bad_trials=("build set4 trial 3: start_failed",))],
                 mode=mode)  # type: ignore[arg-type]
    assert (run.overall, run.exit_status) == ("fail", 1)
    assert run.errors == ("reread-1g: build set4 trial 3: start_failed",)


@pytest.mark.parametrize("mode", ["gate", "screening"])
def test_a_qualification_that_could_not_run_exits_one(mode: str) -> None:
    run = decide([scenario("two_choice", error="LockHeld: host gb10-a: the lock is held")], mode=mode)  # type: ignore[arg-type]
    assert (run.overall, run.exit_status) == ("inconclusive", 1)
    assert run.errors == ("reread-1g: the qualification could not run: LockHeld: host gb10-a: the lock is held",)


@pytest.mark.parametrize("mode", ["gate", "screening"])
def test_a_failed_preflight_exits_one_whatever_the_verdicts(mode: str) -> None:
    failed = "test_drop_caches[gb10-a] failed: CommandFailed: host gb10-a: sudo: a password is required"
    facts = scenario("lru4", "two_choice", verdicts=(*verdicts("lru4", "fail", "pass", "pass"), *PASS))
    run = decide([facts], mode=mode, errors=[failed])  # type: ignore[arg-type]
    assert run.exit_status == 1 and run.errors == (failed,) and run.note == ""
    not_run = decide([scenario("two_choice", qualified=False)], mode=mode, errors=[failed])  # type: ignore[arg-type]
    assert (not_run.overall, not_run.exit_status) == ("inconclusive", 1)


def test_a_scenario_not_measured_in_this_run_does_not_decide_it() -> None:
    """Only some tests selected (`-k test_preflight`): what was not qualified neither passes nor fails it."""
    run = decide([scenario("two_choice", qualified=False)], mode="gate")
    assert (run.overall, run.exit_status) == ("inconclusive", 0)


def test_an_interrupted_run_exits_two() -> None:
    run = decide([scenario("two_choice", verdicts=PASS)], mode="gate", interrupted=True)
    assert (run.overall, run.exit_status) == ("pass", 2)
