"""cache_qualify.sizing.planning: `cache-qualify plan` from a predicted effect and from a pilot run's samples."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from cache_qualify.cli import main
from cache_qualify.samples.records import BuildRecord, Plan
from cache_qualify.sizing.planning import per_gain_power, planned_trials, sequential_design
from cache_qualify.stats.power import SD_CONFIDENCE, sd_upper
from cache_qualify.stats.verdict import power_of
from tests.support.history_sim import write_folder
from tests.support.labfixtures import run_cli

COLUMNS = ("run", "scenario", "build", "trial", "block", "request", "host", "rank", "metric", "value")


def _write_pilot(path: Path, *, builds: dict[str, float], sd: float, trials: int,
                 scenario: str = "default") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(8)
    values = {b: rng.normal(mean, sd, trials) for b, mean in builds.items()}
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for build, draws in values.items():
            for trial, value in enumerate(draws):
                writer.writerow(("r1", scenario, build, trial, trial, "B-new-start", "all", "", "hit_rate", value))
                # per-host rows must be ignored: only host "all" holds the combined value
                writer.writerow(("r1", scenario, build, trial, trial, "B-new-start", "gb10-1", 0, "hit_rate", 0.1))
    return values


@pytest.mark.slow
def test_plan_from_a_min_effect_runs_as_a_console_script_and_sizes_the_rule_as_implemented() -> None:
    """A gain is H0 "improvement <= min_effect": sized for a true 1.5 x min_effect, i.e. 0.5 x min_effect
    from the null, on paired blocks (differences vary by sqrt(2) x sd)."""
    done = run_cli("plan", "--min-effect", "0.002", "--sd", "0.001", "--json", timeout_s=60)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    n = row["trials_per_build"]
    assert row["effect"] == pytest.approx(0.003) and row["null"] == 0.002
    sd_d = math.sqrt(2) * 0.001
    assert power_of(0.001, sd_d, n, alpha=0.05, paired=True) >= 0.9 > power_of(0.001, sd_d, n - 1, alpha=0.05,
                                                                                 paired=True)
    # the sequential design chosen for this plan (tests/test_sequential.py checks its power and mean
    # trials against the fixed design's at power 0.9): its looks, its spending shape, fewer mean trials
    design = sequential_design(n, 0.001 / 0.001, alpha=0.05)
    assert (row["first_look_sequential"], row["max_trials_sequential"], row["spending_rho_sequential"]) == \
        (design.first, design.maximum, design.rho)
    assert design.first < design.maximum and design.mean_trials < n and design.power >= 0.9


def test_a_predicted_effect_below_min_effect_or_a_worse_candidate_is_not_sized_as_a_gain(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--effect", "-0.01", "--sd", "0.001", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["trials_per_build"] is None and "not above the minimum effect" in row["note"]


def test_plan_from_a_pilot_uses_the_combined_rows_both_builds_and_the_sd_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = _write_pilot(tmp_path / "samples.csv", builds={"set4": 0.860, "two_choice": 0.862}, sd=0.002, trials=6)
    assert main(["plan", "--runtime", "flare", "--samples", str(tmp_path), "--family-size", "2"]) == 0
    out = capsys.readouterr().out
    sd = math.sqrt((values["set4"].var(ddof=1) + values["two_choice"].var(ddof=1)) / 2)
    effect = values["two_choice"].mean() - values["set4"].mean()
    expected = planned_trials(effect, sd_upper(sd, 10.0), alpha=0.05, gains=2)
    assert "all 2 gain(s) pass (1 of them sized here) (each at 94.9%)" in out and f"{SD_CONFIDENCE:.0%} upper confidence limit" in out
    assert f"| hit_rate | B-new-start | gain | {100 * values['set4'].mean():.4g} % |" in out
    assert expected is not None
    design = sequential_design(expected, effect / sd_upper(sd, 10.0), alpha=0.05, gains=2)
    shape = f" --spending-rho {design.rho:g}" if design.rho != 2 else ""
    assert f"| {expected} | --trials {design.first} --max-trials {design.maximum}{shape} |" in out


def test_plan_from_a_pilot_of_a_known_scenario_sizes_its_assertions_at_its_alpha(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A samples file of a shipped scenario is sized as that scenario checks it: its alpha (0.01), its four
    gains sharing the power, each against its minimum effect; what the pilot lacks is named as unsized.
    Without a known scenario a note says every quantity is taken as a gain at 0."""
    _write_pilot(tmp_path / "samples.csv", builds={"set4": 0.86, "two_choice": 0.99}, sd=0.002, trials=4,
                 scenario="reread-1g")
    assert main(["plan", "--runtime", "flare", "--samples", str(tmp_path / "samples.csv")]) == 0
    out = capsys.readouterr().out
    assert "all 4 gain(s) pass (1 of them sized here)" in out and "at alpha 0.01" in out
    assert "| hit_rate | B-new-start | gain | 86.00 % |" not in out
    [row] = [line for line in out.splitlines() if line.startswith("| hit_rate | B-new-start |")]
    assert "| +2 pp |" in row   # the null is the minimum effect, not 0
    assert "Unsized (7): gain hit_rate[A-third-read], gain readiness_wait_ns[B-new-start]" in out
    assert "no_regression kv_pages[startup]" in out
    _write_pilot(tmp_path / "samples.csv", builds={"set4": 0.86, "two_choice": 0.99}, sd=0.002, trials=4)
    assert main(["plan", "--runtime", "flare", "--samples", str(tmp_path / "samples.csv")]) == 0
    assert "every quantity is sized as a gain at null 0" in capsys.readouterr().err


def test_a_scenarios_assertions_are_sized_only_on_a_runtime_the_command_line_or_the_run_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No runtime is assumed: a bare samples file of a shipped scenario without --runtime or --hosts is
    refused in one line that says what to give; with a runtime, the scenario is sized on that one's profile."""
    _write_pilot(tmp_path / "samples.csv", builds={"set4": 0.86, "two_choice": 0.99}, sd=0.002, trials=4,
                 scenario="reread-1g")
    wanted = ("a scenario's assertions take their directions and units from the runtime's profile: give "
              "--runtime NAME (flare, llama-cpp, sglang, vllm) or the lab's inventory (--hosts PATH)")
    capsys.readouterr()
    assert main(["plan", "--samples", str(tmp_path / "samples.csv")]) == 2
    assert capsys.readouterr().err.strip().endswith(wanted)
    assert main(["plan", "--runtime", "llama-cpp", "--samples", str(tmp_path / "samples.csv")]) == 2
    assert "runtime llama-cpp does not export 'readiness_wait_ns'" in capsys.readouterr().err


def test_gains_that_move_together_need_less_power_each_and_apart_more() -> None:
    """All of k gains pass with power 0.9: each at 0.9^(1/k) when independent, at 0.9 when they always
    agree; the simulated lab's two waits (correlation 0.9) need about what one gain does."""
    assert per_gain_power(0.9, 4) == pytest.approx(0.9 ** 0.25)
    together = np.full((2, 2), 0.9) + 0.1 * np.eye(2)
    apart = np.array([[1.0, -0.5], [-0.5, 1.0]])
    assert 0.9 < per_gain_power(0.9, 2, together) < 0.9 ** 0.5 < per_gain_power(0.9, 2, apart)
    rng = np.random.default_rng(3)
    z = rng.multivariate_normal(np.zeros(2), together, 200_000)
    c = float(np.quantile(z[:, 0], per_gain_power(0.9, 2, together)))
    assert np.mean((z < c).all(axis=1)) == pytest.approx(0.9, abs=0.003)
    assert planned_trials(1.0, 1.0, alpha=0.01, gains=2, correlation=together) < \
        planned_trials(1.0, 1.0, alpha=0.01, gains=2)  # type: ignore[operator]


def test_plan_with_one_build_takes_the_predicted_effect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_pilot(tmp_path / "samples.csv", builds={"set4": 0.86}, sd=0.001, trials=5)
    assert main(["plan", "--runtime", "flare", "--samples", str(tmp_path / "samples.csv")]) == 2
    assert "give the predicted `--effect`" in capsys.readouterr().err
    assert main(["plan", "--runtime", "flare", "--samples", str(tmp_path / "samples.csv"), "--effect", "0.13",
                 "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["effect"] == 0.13 and row["trials_per_build"] == 2


@pytest.mark.parametrize(("content", "message"), [
    ("build,value\nset4,0.8\n", r"expected columns scenario, build, trial, request, host, metric, value; "
                                r"missing scenario, trial, request, host, metric"),
    ("", r"expected a tidy samples CSV, but it cannot be read"),
])
def test_plan_explains_unusable_pilots(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                       message: str) -> None:
    (tmp_path / "samples.csv").write_text(content)
    assert main(["plan", "--runtime", "flare", "--samples", str(tmp_path / "samples.csv")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "samples.csv") in err
    assert re.search(message, err)


def test_plan_refuses_missing_inputs_and_unknown_builds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--effect", "0.1"]) == 2
    assert ("give a pilot run (`--samples PATH`), `--emulate` with two policies, `--predict`, or a predicted `--sd` "
            "(with `--effect` or `--min-effect`)") in capsys.readouterr().err
    _write_pilot(tmp_path / "samples.csv", builds={"set4": 0.86, "lru4": 0.85}, sd=0.001, trials=4)
    assert main(["plan", "--runtime", "flare", "--samples", str(tmp_path), "--candidate", "set8"]) == 2
    assert "--candidate 'set8' is not a build of the pilot; it has set4, lru4" in capsys.readouterr().err


@pytest.mark.slow
def test_plan_from_the_emulators_prediction_sizes_every_assertion_or_names_it_unsized(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Effect and start-to-start noise from the emulator: the RowCache study's large re-read gain needs the
    minimum, first reads are sized as the no_regression they are (not as gains), and the assertions the
    emulator predicts nothing for (the waits, KV pages) are there, unsized, with the reason."""
    assert main(["plan", "--emulate", "--baseline", "set4", "--candidate", "two_choice", "--seeds", "4",
                 "--alpha", "0.01", "--json"]) == 0
    sizings = {(s["metric"], s["request"]): s for s in json.loads(capsys.readouterr().out)}
    assert len(sizings) == 8
    reread = sizings["hit_rate", "B-new-start"]
    assert reread["kind"] == "gain" and reread["null"] == 0.02
    assert 0.80 < reread["baseline_mean"] < 0.93 and reread["candidate_mean"] > 0.97
    assert 0 < reread["sd"] < reread["sd_sized"] < 0.01
    assert reread["trials_per_build"] <= 3
    first = sizings["hit_rate", "A"]
    assert first["kind"] == "no_regression" and first["trials_per_build"] <= 3
    for key in (("readiness_wait_ns", "B-new-start"), ("readiness_wait_ns", "A-third-read"), ("kv_pages", "startup")):
        assert sizings[key]["trials_per_build"] is None
        assert sizings[key]["note"].startswith(f"the emulator predicts no {key[0]}: give --history URL")


@pytest.mark.slow
def test_plan_emulate_sizes_at_the_scenarios_alpha_and_says_what_it_did_not_size(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without --alpha the scenario's 0.01; the header counts the gains it sized, and the recommendation
    covers every sized assertion and names the unsized ones."""
    assert main(["plan", "--emulate", "--baseline", "set4", "--candidate", "two_choice", "--seeds", "4"]) == 0
    out = capsys.readouterr().out
    assert "at alpha 0.01," in out and "that all 4 gain(s) pass (2 of them sized here)" in out
    rows = [line for line in out.splitlines() if line.startswith("| hit_rate")]
    needed = max(int(row.split(" | ")[8]) for row in rows)
    assert len(rows) == 5
    assert (f"Recommended: {needed} trials per build (fixed)" in out
            and "the most that any of the 5 sized assertion(s) needs." in out)
    assert ("Unsized (3): gain readiness_wait_ns[B-new-start], gain readiness_wait_ns[A-third-read], "
            "no_regression kv_pages[startup]; the recommendation does not cover them.") in out
    assert main(["plan", "--emulate", "--baseline", "set4", "--candidate", "two_choice", "--seeds", "4",
                 "--alpha", "0.05"]) == 0
    assert "at alpha 0.05," in capsys.readouterr().out


def test_plan_prints_values_in_their_units(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--runtime", "flare", "--metric", "readiness_wait_ns", "--min-effect", "2e8",
                 "--sd", "1.5e8"]) == 0
    # a wait's gain as candidate - baseline, the verdicts' sign: shorter is a negative difference
    assert "| readiness_wait_ns | - | gain | - | - | -0.3 s | -0.2 s | 0.15 s |" in capsys.readouterr().out


@pytest.mark.slow
def test_plan_sizes_a_tournament_from_the_emulator(capsys: pytest.CaptureFixture[str]) -> None:
    """Starts per arm for two candidates at once: each sized on the scenario's gains, the baseline shared."""
    assert main(["plan", "--emulate", "--baseline", "set4", "--candidate", "set8,two_choice", "--seeds", "3",
                 "--alpha", "0.01", "--family-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "## Candidate set8 (vs set4)" in out and "## Candidate two_choice (vs set4)" in out
    assert "| set4 (baseline, shared) | 3 |\n| set8 | 3 |\n| two_choice | 2 |" in out
    assert "8 server starts in one run against 10 in one two-arm run per candidate (20% fewer)." in out


def test_plan_emulate_needs_two_policies(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--emulate", "--baseline", "set4", "--candidate", "set4"]) == 2
    assert "`--emulate` needs two different policies" in capsys.readouterr().err


def _run_folder_candidate_first(reports: Path) -> Path:
    """A run folder (written by the suite's own writers) whose plan.json names set4 the baseline, while
    its first trial in trials.csv is two_choice's, as a random block order often has it."""
    plan = Plan(run_id="r1", seed=0, lab="simulated-gb10", baseline="set4", candidates=("two_choice",),
                scenarios=("reread-1g",), created="2026-01-01T00:00:00+00:00",
                builds={"set4": BuildRecord("set4", "baseline"), "two_choice": BuildRecord("two_choice", "candidate")})
    rng = np.random.default_rng(3)
    starts = {b: [{"B-new-start": {"hit_rate": v}} for v in rng.normal(mean, 0.002, 4)]
              for b, mean in (("two_choice", 0.99), ("set4", 0.88))}
    return write_folder(reports, plan, starts)


def test_plan_of_a_run_folder_sizes_the_plans_baseline_and_candidate_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The block order is random, so the first build of trials.csv is no baseline: the run's plan.json
    names it (before, two_choice was taken as the baseline here and the gain sized as a loss)."""
    folder = _run_folder_candidate_first(tmp_path)
    assert next(csv.DictReader((folder / "trials.csv").open()))["build"] == "two_choice"
    assert main(["plan", "--samples", str(folder), "--json"]) == 0
    captured = capsys.readouterr()
    assert "sized: baseline set4 (the run's plan.json), candidate two_choice (the run's plan.json)" in captured.err
    row = next(r for r in json.loads(captured.out) if (r["metric"], r["request"]) == ("hit_rate", "B-new-start"))
    assert row["baseline_mean"] == pytest.approx(0.88, abs=0.01) and row["trials_per_build"] is not None


def test_plan_flags_override_the_run_folders_arms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _run_folder_candidate_first(tmp_path)
    assert main(["plan", "--samples", str(folder), "--baseline", "two_choice", "--candidate", "set4", "--json"]) == 0
    captured = capsys.readouterr()
    assert "sized: baseline two_choice (--baseline), candidate set4 (--candidate)" in captured.err
    row = next(r for r in json.loads(captured.out) if (r["metric"], r["request"]) == ("hit_rate", "B-new-start"))
    assert row["baseline_mean"] == pytest.approx(0.99, abs=0.01)


def test_plan_of_a_bare_samples_file_says_its_baseline_is_the_first_build(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_pilot(tmp_path / "samples.csv", builds={"set4": 0.86, "two_choice": 0.99}, sd=0.002, trials=4)
    assert main(["plan", "--runtime", "flare", "--samples", str(tmp_path / "samples.csv")]) == 0
    assert ("sized: baseline set4 (the first build of the samples: give --baseline to choose), candidate "
            "two_choice (the other build of the samples)") in capsys.readouterr().err
