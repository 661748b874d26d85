"""The one rerun advice (`cache_qualify.report.advice`): a fixed `--trials N --max-trials N` rerun within the
cap, what blocks the decision past it; the same words in summary.md, the terminal's tail, JUnit and the
README; its power measured among the reruns it names a number for (slow tier)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from cache_qualify.report.advice import MEASURED_POWER, NO_SIZE, RERUN_CAP, fixed_rerun, rerun_advice
from cache_qualify.samples.records import VerdictRecord
from cache_qualify.stats.verdict import Assertion, Trials, evaluate
from cache_qualify.validation.promises import cells, power_tolerance, run_cell
from tests.support.labfixtures import REPO, run_qualify, small_scenario, write_inventory

# the llama-server run of issue 41: a host-memory prompt cache, 7.08 s -> 0.12 s at each of 4 starts on a
# loaded machine, the baseline's prompt time ranging over seconds
BASE_MS = (7080.0, 2900.0, 11200.0, 4100.0)
CAND_MS = (120.0, 45.0, 190.0, 70.0)


def _blocked(values: tuple[float, ...]) -> Trials:
    return Trials(values, blocks=tuple(range(len(values))))


def _record(a: Assertion, base: tuple[float, ...], cand: tuple[float, ...], alpha: float) -> VerdictRecord:
    [v] = evaluate([a], {a.id: (_blocked(base), _blocked(cand))}, alpha=alpha)
    return VerdictRecord.of("candidate", v.as_dict())


def test_a_huge_spread_gets_what_blocks_it_and_the_relative_effect_not_an_absurd_number() -> None:
    prompt = Assertion("prompt_time_ms", "re-send", "gain", False, min_effect=500.0, unit="ms")
    v = _record(prompt, BASE_MS, CAND_MS, 0.01)
    assert v.outcome == "inconclusive" and v.trials_needed is not None and v.trials_needed > 1000
    advice = rerun_advice([v])
    assert all(int(n.replace(",", "")) <= RERUN_CAP for n in re.findall(r"([\d,]+) trials", advice)), advice
    assert str(v.trials_needed) not in advice.replace(",", ""), advice
    assert "--max-trials" not in advice and "`min_effect: 10 %`" in advice, advice
    assert f"sd {v.noise_sd / 1000:.4g} s" in advice and "a minimum effect of 0.5 s" in advice, advice
    assert "a quieter runner" in advice and "a larger minimum effect" in advice, advice


def test_a_fraction_or_a_relative_assertion_is_not_told_to_go_relative() -> None:
    hit = VerdictRecord(id="hit_rate-gain[B]", metric="hit_rate", kind="gain", min_effect=0.005, unit="fraction",
                        outcome="inconclusive", noise_sd=0.02, trials_needed=400)
    assert "min_effect: 10 %" not in rerun_advice([hit])
    assert "sd 2 pp" in rerun_advice([hit]) and "a minimum effect of 0.5 pp" in rerun_advice([hit])
    ratio = replace(hit, id="wait-gain[B]", metric="readiness_wait_ns", unit="ns", relative=True, min_effect=0.1,
                    noise_sd=0.8)
    assert "min_effect: 10 %" not in rerun_advice([ratio]) and "sd of the log ratio 0.8" in rerun_advice([ratio])
    pages = replace(hit, id="kv_pages-no_regression[startup]", metric="kv_pages", unit="pages", kind="no_regression",
                    margin=0.02, baseline_mean=41_300.0, noise_sd=900.0)
    advice = rerun_advice([pages])
    assert "a margin of 2% (826 pages)" in advice and "sd 900 pages" in advice, advice
    assert "`relative: true`" in advice and "a larger margin" in advice, advice


def test_an_ordinary_undecided_run_gets_one_fixed_rerun_at_the_largest_trials_needed() -> None:
    base = VerdictRecord(id="a", kind="gain", unit="ns", outcome="inconclusive", min_effect=1e8, noise_sd=1e8)
    verdicts = [replace(base, trials_needed=9), replace(base, id="b", trials_needed=14),
                replace(base, id="c", outcome="pass"), replace(base, id="d", trials_needed=None)]
    assert rerun_advice(verdicts) == fixed_rerun(14)
    assert fixed_rerun(14).startswith("rerun with `--trials 14 --max-trials 14` (a fixed design of 14 trials")
    both = rerun_advice([*verdicts, replace(base, id="e", trials_needed=RERUN_CAP + 1)])
    assert both.startswith(fixed_rerun(14) + "; `e` needs more than 50 trials per build"), both
    assert rerun_advice([verdicts[3]]) == NO_SIZE


def test_the_readme_words_the_rerun_as_the_advice_does() -> None:
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert fixed_rerun("N") in readme
    assert "rerun with `--max-trials N`" not in readme


# the first read's wait differs little between the builds: two blocks leave a 0.25 s gain open (33 trials needed)
OPEN = ({"metric": "readiness_wait_ns", "request": "A", "kind": "gain", "min_effect": "0.25 s"},)


@pytest.mark.slow
def test_summary_the_tail_and_junit_give_the_same_advice(tmp_path: Path) -> None:
    """A two-trial run whose wait gain is left inconclusive: one advice line, word for word."""
    scenario = small_scenario(tmp_path, "advice-short", expectations=OPEN)
    run = run_qualify(write_inventory(tmp_path), tmp_path / "reports", "--scenario", str(scenario),
                      "--seed", "5", "--alpha", "0.05", timeout_s=500)
    assert run.returncode == 1, run.output
    [prop] = [p.get("value", "") for p in run.junit().iter("property") if p.get("name") == "rerun_advice"]
    assert prop.startswith("rerun with `--trials ") and prop in run.tail(), (prop, run.tail())
    summary = (run.run_dir() / "summary.md").read_text(encoding="utf-8").splitlines()
    assert summary[2] == f"**Undecided**: no assertion failed, some are inconclusive; {prop}.", summary[:4]


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0.01, 0.05])
def test_a_fixed_rerun_the_advice_names_has_its_power(alpha: float) -> None:
    """The reread 2 SD rerun cell (min_effect 2 SD, true 3 SD) at the validation table's seed, 2,000 first
    runs: among the reruns of at most RERUN_CAP trials per build, the power the advice states (below the 0.9
    it is sized for: a first run that underestimates the spread names a small N). The reruns past the cap
    are drawn, not decided: the figures are those of the whole cell's at a quarter of its time."""
    listed = list(cells(shapes=("reread-1g",)))
    [cell] = [c for c in listed if c.check == "rerun" and c.alpha == alpha]
    result = run_cell(cell, runs=2000, seed=listed.index(cell) + 1, capped_only=True)
    low, high = MEASURED_POWER
    assert result.capped_reruns >= 300, result
    assert low - power_tolerance(result.capped_reruns, low) <= result.capped_power, result
    assert result.capped_power <= high + power_tolerance(result.capped_reruns, high), result
