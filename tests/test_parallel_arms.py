"""Both arms at once on two host groups (`--parallel-arms`): the crossover, its analysis, and the gate on it.

The emulated servers really sleep their modelled time (scaled down), as in the
xdist scale-out test, so the two arms' trials overlap in time as on real hosts.
The speed-up itself is a benchmark, not a test: `python -m tests.test_parallel_arms`.
"""

from __future__ import annotations

import csv
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from cache_qualify.config.inventory import HostGroup, load_inventory
from cache_qualify.errors import PlanError
from cache_qualify.methods import method
from cache_qualify.stats.compare import crossover_fit
from cache_qualify.stats.sequential import plan_looks
from cache_qualify.validation.simulate import LAB_BAD_STARTS, SHAPES, draw
from cache_qualify.stats.verdict import Trials, Verdict, carry, decided, evaluate
from cache_qualify.trials.crossover import check_arms, crossover, equal_groups
from cache_qualify.trials.runner import interleave
from tests.support.labfixtures import REPO, inventory_port, run_qualify, small_scenario, wait_no_sim_processes, write_inventory

TEST_SLEEP_SCALE = 0.01   # loading weights: 120 s -> 1.2 s a start, so a block's two starts overlap
BENCH_SLEEP_SCALE = 0.2   # 24 s a start: the servers' time dominates, as on real hosts
SLOW = 1.1                # the second group's waits 10 % longer


def two_groups(tmp_path: Path, sleep_scale: float = TEST_SLEEP_SCALE, *, slow: float = 1.0,
               noise: str | None = "quiet") -> Path:
    """Six simulated hosts as two TP3 groups, tp-1 and tp-2; the servers sleep their modelled time at
    `sleep_scale`, and tp-2's waits are `slow` times tp-1's."""
    hosts = [{"name": f"gb10-{c}", "address": f"127.0.0.{11 + i}", "rank": i % 3, "transport": "local"}
             for i, c in enumerate("abcdef")]
    groups = [{"name": "tp-1", "hosts": ["gb10-a", "gb10-b", "gb10-c"]},
              {"name": "tp-2", "hosts": ["gb10-d", "gb10-e", "gb10-f"]}]
    flags = ["--sim-sleep-scale", str(sleep_scale)]
    if slow != 1.0:
        flags += [f for h in hosts[3:] for f in ("--sim-host-wait-factor", f"{h['address']}={slow}")]
    return write_inventory(tmp_path, hosts=hosts, groups=groups, noise=noise, sim_flags=flags)


def trial_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "trials.csv").open() as f:
        return list(csv.DictReader(f))


# --- the crossover plan ---------------------------------------------------------------------------

def test_each_block_runs_the_builds_on_opposite_groups_swapping_block_by_block() -> None:
    slots = interleave(("set4", "two_choice"), trials=6, block_size=1, seed=5)
    waves = crossover(slots, "set4")
    assert [len(w) for w in waves] == [2] * 6
    for k, wave in enumerate(waves):
        where = {p.slot.build: p.group for p in wave}
        assert {p.slot.block for p in wave} == {k}
        assert where == {"set4": k % 2, "two_choice": 1 - k % 2}
    # a block whose baseline trial finished before a resume runs its candidate alone, on its group
    rest = crossover([s for s in slots if (s.build, s.block) != ("set4", 3)], "set4")
    assert [[(p.slot.build, p.group) for p in w] for w in rest if w[0].slot.block == 3] == [[("two_choice", 0)]]


def test_blocks_of_two_pair_the_builds_trials_in_order() -> None:
    waves = crossover(interleave(("set4", "two_choice"), trials=4, block_size=2, seed=1), "set4")
    assert [sorted((p.slot.build, p.slot.block, p.group) for p in w) for w in waves] == [
        [("set4", 0, 0), ("two_choice", 0, 1)]] * 2 + [[("set4", 1, 1), ("two_choice", 1, 0)]] * 2


def test_fewer_than_two_equal_groups_is_refused_naming_the_groups() -> None:
    committed = load_inventory(REPO / "hosts.yaml").groups_resolved()
    with pytest.raises(PlanError, match=r"needs two groups with as many hosts.*give default \(3 hosts\)"):
        equal_groups(committed, None)
    a, b = committed[0].hosts[:2], committed[0].hosts[2:]
    with pytest.raises(PlanError, match=r"give g2 \(2 hosts\), g1 \(1 host\)"):
        equal_groups([HostGroup("g2", a), HostGroup("g1", b)], None)
    assert [g.name for g in equal_groups([HostGroup("g1", b), HostGroup("x", a), HostGroup("y", a)], None)] == ["x", "y"]
    with pytest.raises(PlanError, match="one baseline and one candidate.*2 candidates"):
        check_arms(("set8", "set16"), method("welch"))
    with pytest.raises(PlanError, match="only the t test does.*permutation"):
        check_arms(("two_choice",), method("permutation"))


# --- the analysis with the group as a factor ------------------------------------------------------

def test_the_intercept_cancels_a_group_effect_and_its_spread_is_the_noise_alone() -> None:
    rng = np.random.default_rng(3)
    for n in (4, 5, 9):
        sides = [1 if k % 2 == 0 else -1 for k in range(n)]
        noise = rng.normal(0, 0.1, n)
        fit = crossover_fit(2.0 + 5.0 * np.asarray(sides, float) + noise, sides)
        plain = crossover_fit(2.0 + noise, sides)
        # the group effect (5, fifty times the noise) moves neither the estimate nor the spread
        assert fit.improvement == pytest.approx(plain.improvement, abs=1e-9)
        assert fit.sd == pytest.approx(plain.sd, abs=1e-9) and fit.df == n - 2
        assert abs(fit.improvement - 2.0) < 0.2
    one_side = crossover_fit(np.array([1.0, 2.0, 3.0]), [1, 1, 1])
    assert math.isnan(one_side.improvement)   # with no swap, the groups cannot be told from the builds


def _aa_runs(runs: int, *, crossed: bool, seed: int) -> list[list[Verdict]]:
    """The default gate's whole sequential decision on simulated A/A blocks (the reread-1g shape, the
    lab's bad starts) where the second group's waits are 10 % longer: crossed over as --parallel-arms
    runs them (block k's baseline on group k mod 2), or not (the baseline always on the slow group,
    analysed as one group's would be)."""
    # the waits' start-to-start SD as the calibrated lab's, 9 % of the wait (the scenario's sizing note)
    shape = [replace(item, sd=0.09 * item.mean) if item.slow else item for item in SHAPES["reread-1g"]]
    looks = plan_looks(initial=4, block=1, max_trials=12)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(runs):
        raw = draw(shape, [0.0] * len(shape), LAB_BAD_STARTS, looks[-1], rng, 0.0)
        samples = {}
        for item in shape:
            a = item.assertion(0.0)
            base, cand = raw[a.id]
            groups = [(k % 2, 1 - k % 2) if crossed else (1, 0) for k in base.blocks]
            sides = [[g[i] for g in groups] for i in (0, 1)]
            values = [[v * (SLOW if item.slow and s else 1.0) for v, s in zip(t.values, side)]
                      for t, side in zip((base, cand), sides)]
            # not crossed: one group assignment throughout, analysed as one group's (nothing recorded)
            samples[a.id] = tuple(Trials(tuple(v), t.starts, t.blocks,
                                         tuple(f"tp-{s + 1}" for s in side) if crossed else ())
                                  for v, t, side in zip(values, (base, cand), sides))
        assertions = [item.assertion(0.0) for item in shape]
        verdicts: list[Verdict] | None = None
        for k, n in enumerate(looks, start=1):
            cut = {key: tuple(Trials(t.values[:n], t.starts[:n], t.blocks[:n], t.groups[:n]) for t in pair)
                   for key, pair in samples.items()}
            verdicts = carry(verdicts, evaluate(assertions, cut, alpha=0.01, look=k, looks=looks))  # type: ignore[arg-type]
            if decided(verdicts):
                break
        assert verdicts is not None
        out.append(verdicts)
    return out


@pytest.mark.slow
def test_aa_false_pass_rate_is_within_the_binomial_bound_when_one_group_is_slower() -> None:
    """Seeded: a slower group never buys a build a pass when the arms cross over (each wait gain,
    tested at its null of no improvement, the hardest A/A case, passes at most at alpha's binomial bound);
    without the crossover the same group effect passes the waits far more often, so the check can fail."""
    runs, alpha = 400, 0.01
    bound = scipy_stats.binom.ppf(0.999, runs, alpha)
    crossed = _aa_runs(runs, crossed=True, seed=25)
    waits = [a.id for a in (i.assertion(0.0) for i in SHAPES["reread-1g"]) if a.metric == "readiness_wait_ns"]
    for aid in waits:
        passes = sum(next(v for v in vs if v.assertion.id == aid).outcome == "pass" for vs in crossed)
        assert passes <= bound, (aid, passes, bound)
    assert all("host group as a factor" in v.reason for vs in crossed[:5] for v in vs
               if v.assertion.metric == "readiness_wait_ns")
    uncrossed = _aa_runs(60, crossed=False, seed=25)
    passes = sum(next(v for v in vs if v.assertion.id == waits[0]).outcome == "pass" for vs in uncrossed)
    assert passes > 2 * scipy_stats.binom.ppf(0.999, 60, alpha), passes   # 13 of 60 when written


# --- the gate on two groups -----------------------------------------------------------------------

@pytest.mark.slow
def test_parallel_arms_run_each_block_on_both_groups_at_once_crossing_over(tmp_path: Path) -> None:
    inventory = two_groups(tmp_path, slow=SLOW)
    scenario = small_scenario(tmp_path, "small-4", trials=4)
    run = run_qualify(inventory, tmp_path / "reports", "--scenario", str(scenario), "--parallel-arms",
                      "--seed", "11", "--no-plots")
    assert run.returncode == 0, run.output
    assert wait_no_sim_processes(inventory_port(inventory)) == []
    run_dir = run.run_dir()
    rows = trial_rows(run_dir)
    assert len(rows) == 8 and all(r["outcome"] == "ok" for r in rows)
    for block in range(4):
        base, cand = (next(r for r in rows if r["block"] == str(block) and r["build"] == b)
                      for b in ("set4", "two_choice"))
        # crossover: block k's baseline on group k mod 2, the candidate on the other
        assert (base["group"], cand["group"]) == (("tp-1", "tp-2") if block % 2 == 0 else ("tp-2", "tp-1"))
        # the two arms' trials ran at the same time
        spans = [(datetime.fromisoformat(r["started_at"]), datetime.fromisoformat(r["finished_at"]))
                 for r in (base, cand)]
        assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans
    summary = (run_dir / "summary.md").read_text()
    assert "### Per host group" in summary and "| A | tp-2 |" in summary
    logs = "".join(p.read_text() for p in (run_dir / "logs").rglob("*gb10-d*"))
    assert "this host's waits 1.1 times longer" in logs


def test_parallel_arms_on_one_group_are_refused_before_any_folder_or_host(tmp_path: Path) -> None:
    """It failed inside test_all_ranks_started with a PlanError and kept a run folder: now the setup refuses
    it in one line, exit status 4, as any option that cannot take effect."""
    inventory = write_inventory(tmp_path)
    run = run_qualify(inventory, tmp_path / "reports", "--scenario", str(small_scenario(tmp_path, "small")),
                      "--parallel-arms", "--no-plots")
    assert run.returncode == 4, run.output
    assert [line for line in run.output.splitlines() if line.strip()] == [
        "ERROR: --parallel-arms runs the baseline and the candidate at once, each on a host group of its own: it "
        "needs two groups with as many hosts, and the inventory's `groups:` give default (3 hosts)"], run.output
    assert run.run_folders() == []


def main() -> None:
    """Benchmark: the default gate's wall time with --parallel-arms on two groups against one group at a
    time (the sequential design), servers sleeping their modelled time; same seed, same samples."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # wall time, not statistics: the quiet lab (as the xdist benchmark), so both designs decide at the
        # first look; with the calibrated noise the group factor's lost degree of freedom can cost a block
        inventory = two_groups(root, BENCH_SLEEP_SCALE, noise=os.environ.get("BENCH_NOISE", "quiet"))
        times: dict[str, float] = {}
        for label, extra in (("sequential", []), ("--parallel-arms", ["--parallel-arms"])):
            started = time.monotonic()
            run = run_qualify(inventory, root / label.strip("-"), "--seed", "7", "--no-plots", "-p", "no:xdist",
                              *extra, timeout_s=1800)
            times[label] = time.monotonic() - started
            if run.returncode != 0:
                raise SystemExit(f"{label}: the qualification failed:\n{run.output}")
            starts = len(trial_rows(run.run_dir()))
            print(f"{label:>16}: {times[label]:6.1f} s  ({starts} server starts)")
        ratio = times["--parallel-arms"] / times["sequential"]
        print(f"{'ratio':>16}: {ratio:6.2f}  (target <= 0.60)")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
