"""One function decides a run (`cache_qualify.stats.outcome.decide`): each candidate's and scenario's
outcome, the recommendation and the exit status, which the plugin exits with and the report shows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cache_qualify.samples.records import VerdictRecord
from cache_qualify.stats.outcome import LAB_ERROR, ScenarioFacts, decide, lab_problem

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
def test_a_candidates_failed_trial_fails_the_scenario_and_the_run(mode: str) -> None:
    run = decide([scenario("two_choice", verdicts=PASS, bad_trials=("build two_choice trial 3: start_failed",))],
                 mode=mode)  # type: ignore[arg-type]
    assert (run.overall, run.exit_status, run.cause) == ("fail", 1, "")
    assert run.errors == ("reread-1g: build two_choice trial 3: start_failed",)


LOCK = "LockHeld: host gb10-a: the lock is held"


@pytest.mark.parametrize("mode", ["gate", "screening"])
def test_a_scenario_the_lab_could_not_measure_is_an_error_with_a_status_of_its_own(mode: str) -> None:
    run = decide([scenario("two_choice", error=LOCK, lab_problem=LOCK)], mode=mode)  # type: ignore[arg-type]
    assert (run.overall, run.exit_status, run.scenarios[0].outcome) == ("error", LAB_ERROR, "error")
    assert run.cause == f"reread-1g: {LOCK}" and run.errors[0] == run.cause
    # a candidate shown failing elsewhere is the answer: retrying the lab would not change it
    failing = scenario("lru4", verdicts=verdicts("lru4", "fail", "pass", "pass"))
    both = decide([replace(failing, scenario="long-prompt"), scenario("lru4", lab_problem=LOCK)], mode=mode)  # type: ignore[arg-type]
    assert (both.overall, both.exit_status) == ("fail", 1) and both.cause


@pytest.mark.parametrize("mode", ["gate", "screening"])
def test_a_failed_preflight_is_the_labs_error_unless_the_candidate_failed(mode: str) -> None:
    failed = "test_drop_caches[gb10-a] failed: CommandFailed: host gb10-a: sudo: a password is required"
    not_run = decide([scenario("two_choice", qualified=False)], mode=mode, lab_errors=[failed])  # type: ignore[arg-type]
    assert (not_run.overall, not_run.exit_status, not_run.cause) == ("error", LAB_ERROR, failed)
    facts = scenario("lru4", "two_choice", verdicts=(*verdicts("lru4", "fail", "pass", "pass"), *PASS))
    run = decide([facts], mode=mode, lab_errors=[failed])  # type: ignore[arg-type]
    # the gate's failing candidate is an answer; screening's best one passed, so the lab's error stands
    assert run.exit_status == (1 if mode == "gate" else LAB_ERROR) and run.errors == (failed,) and run.note == ""
    other = decide([scenario("two_choice", verdicts=PASS)], mode=mode, errors=["test_counter_consistency failed"])  # type: ignore[arg-type]
    assert (other.overall, other.exit_status, other.cause) == ("pass", 1, "")


def test_whose_trial_failed_decides_whether_the_lab_or_the_candidate_did() -> None:
    """A candidate whose ranks die at start failed; a baseline that does not start, an error of the lab's
    kind (a metric the runtime does not serve, a host) or a qualification that could not run is the lab's."""
    died = ("two_choice", 0, "start_failed", "host gb10-b rank 1: exited during startup")
    assert lab_problem("set4", [died], raised=False, error="exited", error_kind="RankExited") is None
    baseline = ("set4", 1, "start_failed", "host gb10-b rank 1: exited during startup\nlog tail")
    assert lab_problem("set4", [died, baseline], raised=False, error=None, error_kind=None) == (
        "the baseline set4 could not be measured: trial 2 start_failed: host gb10-b rank 1: exited during startup")
    metric = ("two_choice", 0, "failed", "host gb10-c rank 2: no flare_engram_row_cache_hits_total")
    assert lab_problem("set4", [metric], raised=False, error="no metric", error_kind="MetricMissing") == \
        "the lab could not measure it: MetricMissing: no metric"
    assert lab_problem("set4", [], raised=True, error="held", error_kind="LockHeld") == \
        "the qualification could not run: LockHeld: held"


def test_a_scenario_not_measured_in_this_run_does_not_decide_it() -> None:
    """Only some tests selected (`-k test_preflight`): what was not qualified neither passes nor fails it."""
    run = decide([scenario("two_choice", qualified=False)], mode="gate")
    assert (run.overall, run.exit_status) == ("inconclusive", 0)


def test_an_interrupted_run_exits_two() -> None:
    run = decide([scenario("two_choice", verdicts=PASS)], mode="gate", interrupted=True)
    assert (run.overall, run.exit_status) == ("pass", 2)
