"""`cache-qualify decide RUN_DIR --baseline A --candidate B`: two builds of a recorded run decided
against each other from its folder, on a real `pytest qualify` run of the simulated lab with three
builds: the baseline set4, the candidate two_choice and a second copy of two_choice (an A/A pair)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cache_qualify.samples.rundata import load_run
from cache_qualify.stats.pairwise import decide_pair, recorded_assertions
from tests.support.labfixtures import QualifyRun, committed_inventory, run_cli, run_qualify, write_inventory

pytestmark = pytest.mark.xdist_group("decide-run")

FOUR = ("--trials", "4", "--max-trials", "4")   # one look: the run's verdicts are a fixed design, as decide's
COMPARED = ("outcome", "p_value", "ci_low", "ci_high", "difference", "trials_baseline", "trials_candidate")


@pytest.fixture(scope="module")
def three_builds(tmp_path_factory: pytest.TempPathFactory) -> QualifyRun:
    folder = tmp_path_factory.mktemp("decide")
    again = dict(committed_inventory()["builds"]["two_choice"], description="two_choice again (A/A)")
    inventory = write_inventory(folder, builds={"two_choice-again": again})
    return run_qualify(inventory, folder / "reports", "--seed", "7", "--candidate", "two_choice,two_choice-again",
                       *FOUR, timeout_s=600)


def decide(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("decide", str(run_dir), *args, timeout_s=120)


def test_the_run_s_own_pair_decides_as_the_run_did(three_builds: QualifyRun, tmp_path: Path) -> None:
    """A one-look run re-decided between its baseline and a candidate gives the verdicts it recorded,
    figure for figure: the same assertions, alpha, method and seed."""
    out = tmp_path / "pair.json"
    done = decide(three_builds.run_dir(), "--baseline", "set4", "--candidate", "two_choice", "--json", str(out))
    recorded = [v for v in json.loads((three_builds.run_dir() / "verdicts-reread-1g.json").read_text())
                if v["arm"] == "two_choice"]
    again = json.loads(out.read_text())
    assert again["scenario"] == "reread-1g" and again["baseline"] == "set4", again
    assert [v["id"] for v in again["verdicts"]] == [v["id"] for v in recorded]
    for new, old in zip(again["verdicts"], recorded):
        assert {k: new[k] for k in COMPARED} == {k: old[k] for k in COMPARED}, (new["id"], new["reason"])
    assert done.returncode == (0 if all(v["outcome"] == "pass" for v in recorded) else 1), done.stdout
    assert "two_choice against set4 (4 and 4 starts, alpha" in done.stdout, done.stdout


def test_a_build_against_its_own_copy_does_not_pass(three_builds: QualifyRun) -> None:
    done = decide(three_builds.run_dir(), "--baseline", "two_choice", "--candidate", "two_choice-again")
    assert done.returncode == 1, done.stdout + done.stderr
    decision = decide_pair(load_run(three_builds.run_dir()), "two_choice", "two_choice-again")
    gains = [v.record for v in decision.verdicts if v.record.kind == "gain"]
    assert gains and all(v.outcome != "pass" for v in gains), [v.reason for v in gains]
    assert all(v.trials_baseline == v.trials_candidate == 4 for v in gains)
    assert decision.outcome != "pass" and decision.notes == ()
    assert done.stdout.strip().endswith(f"outcome: {decision.outcome.upper()}"), done.stdout


def test_the_recorded_assertions_are_the_scenario_s(three_builds: QualifyRun) -> None:
    data = load_run(three_builds.run_dir())
    records = data.verdicts["reread-1g"]
    assertions = recorded_assertions(records)
    assert [a.id for a in assertions] == list(dict.fromkeys(r.id for r in records))
    for a in assertions:
        r = next(r for r in records if r.id == a.id)
        assert (a.metric, a.request, a.kind, a.higher_is_better, a.min_effect, a.margin, a.unit, a.relative) == \
            (r.metric, r.request, r.kind, r.higher_is_better, r.min_effect, r.margin, r.unit, r.relative)


@pytest.mark.parametrize(("args", "expected"), [
    (("--baseline", "set4", "--candidate", "set16"),
     "scenario 'reread-1g' has no ok trial of build 'set16'; its builds: set4, two_choice, two_choice-again"),
    (("--baseline", "set4", "--candidate", "set4"), "--baseline and --candidate are both 'set4'"),
    (("--baseline", "set4", "--candidate", "two_choice", "--scenario", "reread-4g"),
     "the run has no verdicts of scenario 'reread-4g', so no assertions to decide; it decided reread-1g"),
])
def test_what_the_folder_lacks_is_one_line_naming_it(three_builds: QualifyRun, args: tuple[str, ...],
                                                     expected: str) -> None:
    done = decide(three_builds.run_dir(), *args)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith("cache-qualify: error: ") and expected in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_json_file_that_cannot_be_written_is_one_line(three_builds: QualifyRun, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    out = tmp_path / "a-file" / "pair.json"
    done = decide(three_builds.run_dir(), "--baseline", "set4", "--candidate", "two_choice", "--json", str(out))
    assert done.returncode == 2 and done.stderr.startswith(f"cache-qualify: error: --json {out}: cannot write it: ")
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    done = decide(tmp_path / "nope", "--baseline", "a", "--candidate", "b")
    assert done.returncode == 2 and f"{tmp_path / 'nope'}: no such run folder" in done.stderr, done.stderr
