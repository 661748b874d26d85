"""What `--history-noise` pools in a merge pipeline, where builds are named by commit: the key is the lab,
the scenario and each build's recorded digest (its name and ref only where no digest is known), and the
run's line says what it searched by and found (docs/history.md, "What `--history-noise` pools")."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from cache_qualify.cli import main
from cache_qualify.config.profiles import resolve
from cache_qualify.config.scenario import find_scenario, load_scenario
from cache_qualify.history.priors import KnownNoise, known_noise
from cache_qualify.history.store import default_url
from cache_qualify.qualification import AA_SUFFIX
from cache_qualify.samples.records import BuildRecord, Plan
from cache_qualify.stats.scenario_assertions import assertions_for
from tests.support import history_sim

LAB, SCENARIO = "simulated-gb10", "reread-1g"
MAIN, MOVED = "a1" * 32, "b2" * 32          # main's build's digest; main's after it moved on
REQUESTS = ("A", "B", "A-new-start", "B-new-start", "A-third-read")
# each earlier pipeline: (run id, baseline name, baseline digest, candidate name, candidate digest)
PIPELINES = (("p1", "main-0a1b2c3", MAIN, "9f00001", "c1" * 32),
             ("p2", "main-4d5e6f7", MAIN, "9f00002", "c2" * 32),
             ("p3", "main-8a9b0c1", MAIN, "9f00003", "c3" * 32),
             ("p4", "main-0a1b2c3", MOVED, "9f00004", "c4" * 32))   # main's old name, other bits


def _history(reports: Path) -> str:
    """The pipelines' runs (4 starts per build, hit rates 0.4 points apart between starts), imported."""
    rng = np.random.default_rng(5)
    begin = datetime(2026, 3, 2, tzinfo=timezone.utc)
    folders = []
    for i, (run_id, base, base_digest, cand, cand_digest) in enumerate(PIPELINES):
        builds = {base: BuildRecord(base, "baseline", ref=f"main@{i}", source="artifact", digest=base_digest),
                  cand: BuildRecord(cand, "candidate", ref=f"mr-7@{i}", source="artifact", digest=cand_digest)}
        plan = Plan(run_id=run_id, seed=i, lab=LAB, baseline=base, candidates=(cand,), scenarios=(SCENARIO,),
                    created=(begin + timedelta(days=i)).isoformat(), builds=builds)
        starts = {b: [{r: {"hit_rate": 0.95 + float(rng.normal(0, 0.004))} for r in REQUESTS} for _ in range(4)]
                  for b in builds}
        folders.append(history_sim.write_folder(reports, plan, starts))
    assert main(["history", "import", "--reports-dir", str(reports), *map(str, folders)]) == 0
    return default_url(reports)


def _pool(url: str, baseline: BuildRecord, candidate: BuildRecord) -> KnownNoise:
    wanted = [a for a in assertions_for(load_scenario(find_scenario(SCENARIO)), resolve("flare"))
              if a.metric == "hit_rate" and a.kind != "no_excess"]
    assert wanted
    return known_noise(url, lab=LAB, scenario=SCENARIO, assertions=wanted, baseline=baseline,
                       candidates={candidate.build: candidate}, run_id="now", suffix=AA_SUFFIX)


def test_a_renamed_build_pools_by_its_digest_and_another_digest_does_not(tmp_path: Path) -> None:
    """This pipeline names main's build by yet another commit and its candidate is new: the baseline's noise
    comes from the three runs of the same bits under three names (not p4's, same name as p1's, other
    bits), the candidate's is taken as the baseline's, and the line says so."""
    url = _history(tmp_path / "reports")
    baseline = BuildRecord("main-2e3f4a5", "baseline", ref="main@9", source="artifact", digest=MAIN)
    candidate = BuildRecord("9f00009", "candidate", ref="mr-7@9", source="artifact", digest="d9" * 32)
    found = _pool(url, baseline, candidate)
    priors = found.priors["9f00009"]
    assert priors and all(set(p.runs) == {"p1", "p2", "p3"} for p in priors.values()), priors
    assert all("taken as the baseline's" in p.note for p in priors.values()), priors
    assert found.said["9f00009"] == (
        f"history of lab {LAB!r}, scenario {SCENARIO}: baseline main-2e3f4a5 (sha256 {MAIN[:12]}): 3 earlier run(s); "
        f"candidate 9f00009 (sha256 {'d9' * 6}): no earlier run, a build new to the history: its noise is taken "
        f"as the baseline's; the noise of {len(priors)} assertion(s) is known from 3 earlier run(s) in the history")


def test_a_name_does_not_pool_across_digests_and_a_build_without_one_is_known_by_name_and_ref(
        tmp_path: Path) -> None:
    """main's old name with the moved bits finds only p4 (one run: too few df, nothing pooled), and a
    re-run candidate with p2's bits under a new name finds p2; without a digest, a name and ref find their
    run whatever digest it recorded for others."""
    url = _history(tmp_path / "reports")
    moved = BuildRecord("main-0a1b2c3", "baseline", ref="main@0", source="artifact", digest=MOVED)
    rerun = BuildRecord("retry-2", "candidate", ref="mr-7@1", source="artifact", digest="c2" * 32)
    found = _pool(url, moved, rerun)
    assert found.priors["retry-2"] == {}
    assert found.said["retry-2"] == (
        f"history of lab {LAB!r}, scenario {SCENARIO}: baseline main-0a1b2c3 (sha256 {MOVED[:12]}): 1 earlier run(s); "
        f"candidate retry-2 (sha256 {'c2' * 6}): 1 earlier run(s); the noise is measured as usual")
    by_name = BuildRecord("main-4d5e6f7", "baseline", ref="main@1")     # a path build without sha256
    said = _pool(url, by_name, BuildRecord("9f00002", "candidate", ref="mr-7@1")).said["9f00002"]
    assert said == (f"history of lab {LAB!r}, scenario {SCENARIO}: baseline main-4d5e6f7 (name 'main-4d5e6f7', "
                    f"ref main@1): 1 earlier run(s); candidate 9f00002 (name '9f00002', ref mr-7@1): 1 earlier run(s); "
                    f"the noise is measured as usual"), said
