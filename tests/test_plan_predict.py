"""`cache-qualify plan --predict` (cache_qualify.sizing.predictive): a run sized from the cache emulator's
prediction of each build of examples/vllm.yaml on examples/vllm-resend.yaml's workload, with no pilot, no
history and no server; the parameters a start alone gives are never guessed."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from cache_qualify.cli import main
from cache_qualify.config.command import command_words
from cache_qualify.config.inventory import load_inventory
from cache_qualify.config.scenario import load_scenario
from cache_qualify.emulation.sources import parse_value
from cache_qualify.sizing.predictive import predict_build
from cache_qualify.stats.scenario_assertions import assertions_for
from cache_qualify.stats.starts import Trials
from cache_qualify.stats.verdict import evaluate
from cache_qualify.stats.verdict_data import VerdictWarning
from cache_qualify.trials.schedule import scenario_requests
from tests.support.labfixtures import REPO, edited, write_file, write_inventory

HOSTS = str(REPO / "examples" / "vllm.yaml")
RESEND = str(REPO / "examples" / "vllm-resend.yaml")
PLAN = ["plan", "--hosts", HOSTS, "--scenario", RESEND, "--predict"]
TOKENS = 4090          # each of the example's prompts
BLOCK_128 = "prefix-caching.block_size=128"   # the CPU build's block size, which only a start reports


def planned(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    assert main([*PLAN, *extra, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_plan_sizes_the_vllm_example_from_its_prediction_with_no_pilot_history_or_server(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The re-sends' hit-rate gains are sized from the predicted effect (4,064 of 4,090 tokens with blocks of
    32, none without caching); the prediction is exact, so the smallest design the gate allows, said so; the
    prefill times and the KV cache are listed as not predicted; each parameter names where it came from."""
    assert main([*PLAN, "--candidate", "prefix-caching-32"]) == 0
    out = capsys.readouterr().out
    assert ("| prefix-caching-32 | candidate | prefix_caching=True (--enable-prefix-caching); block_size=32 "
            "(--block-size 32); num_gpu_blocks=256 (not known before a start: the least at which the workload "
            "evicts nothing, so the prediction holds for a pool of at least 256 blocks) | A 0.00 %, B 0.00 %, "
            "A-again 99.36 %, B-again 99.36 % |") in out   # rates, as the verdicts show them
    assert "| no-prefix-caching | baseline | prefix_caching=False (--no-enable-prefix-caching); block_size: not " \
           "needed (prefix_caching off, from --no-enable-prefix-caching)" in out
    assert ("| hit_rate | A-again | gain | 0 % | 99.36 % | +99.36 pp | +50 pp | 0 pp (0.02445 pp) | 3 | "
            "--trials 3 --max-trials 3 | predicted exactly, no spread: sized at the values' resolution "
            "(0.000244), the spread a test takes for one below it; at least 3 blocks, as the gate decides no "
            "gain without spread on fewer |") in out
    assert ("| prefill_time_s | B-again | gain | - | - | - | - | - | - | - | not predicted (the vllm-block "
            "emulator predicts hit_rate only): give a pilot (--samples) or --sd |") in out
    assert "at alpha 0.01," in out and "that all 4 gain(s) pass (2 of them sized here)" in out
    assert ("Recommended: 3 trials per build (fixed), or sequential --trials 3 --max-trials 3: the most that any "
            "of the 2 sized assertion(s) needs. Unsized (3): gain prefill_time_s[A-again], gain "
            "prefill_time_s[B-again], no_regression kv_pages[startup]") in out


def test_a_parameter_only_a_start_gives_refuses_the_plan_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """prefix-caching has no --block-size: vLLM's block size is then the platform's, reported by the started
    server only, so the plan names it and --cache-param rather than guess."""
    assert main(PLAN) == 2
    err = capsys.readouterr().err
    assert err == ("cache-qualify: error: build prefix-caching: not predicted: the vllm-block emulator's "
                   "`block_size` is known only once a server has started, if at all (looked in the flag --block-size; "
                   "vllm:cache_config_info{block_size}; the command line gives none, the inventory declares none): "
                   "declare it as builds.prefix-caching.cache.block_size in the inventory, or give --cache-param "
                   "prefix-caching.block_size=VALUE\n")


@pytest.mark.parametrize(("given", "message"), [
    ("block_size", "--cache-param block_size: expected BUILD.NAME=VALUE or NAME=VALUE, the value a number, "
                   "true/false or a word"),
    ("block_size=1.2.3", "--cache-param block_size=1.2.3: expected BUILD.NAME=VALUE"),
    ("block_size=big", "--cache-param block_size=big: block_size of the vllm-block emulator is a number or "
                       "true/false, not 'big'"),
    ("nightly.block_size=16", "--cache-param nightly.block_size=16: .*vllm.yaml has no build 'nightly'; it has "
                              "no-prefix-caching, prefix-caching, prefix-caching-32"),
    ("prefix-caching.blocks=16", "the vllm-block emulator has no parameter 'blocks'; it takes block_size, "
                                 "num_gpu_blocks, prefix_caching"),
    ("block_size=128", "build prefix-caching-32: --cache-param block_size=128 contradicts its command line "
                       r"\(--block-size 32\)"),
])
def test_bad_cache_params_are_one_line(capsys: pytest.CaptureFixture[str], given: str, message: str) -> None:
    assert main([*PLAN, "--candidate", "prefix-caching-32", "--cache-param", given]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert re.search(message, err)


def test_predict_needs_the_inventory_and_the_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--predict", "--scenario", RESEND]) == 2
    assert "`--predict` needs the inventory (--hosts PATH" in capsys.readouterr().err
    assert main(["plan", "--hosts", HOSTS, "--sd", "0.01", "--min-effect", "0.02", "--cache-param", BLOCK_128]) == 2
    assert (f"--cache-param {BLOCK_128}: emulator parameters are read with --predict only"
            in capsys.readouterr().err)


def test_a_runtime_without_an_emulator_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the simulated lab's flare profile without its `emulator:` section
    profile = (REPO / "fixtures" / "cache_qualify" / "config" / "runtimes" / "flare.yaml").read_text()
    plain = write_file(tmp_path, edited(profile.split("\nemulator:", 1)[0] + "\n", "runtime: flare", "runtime: flare-plain"),
                       "flare-plain.yaml")
    hosts = write_inventory(tmp_path, server={"runtime": str(plain)})
    # where the lab's servers state the emulator's parameters is refused too: there is no emulator to read them
    assert main(["plan", "--predict", "--hosts", str(hosts), "--scenario", "reread-1g"]) == 2
    assert "emulator: the runtime " in capsys.readouterr().err
    data = yaml.safe_load(hosts.read_text(encoding="utf-8"))
    del data["emulator"]
    hosts.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert main(["plan", "--predict", "--hosts", str(hosts), "--scenario", "reread-1g"]) == 2
    assert "profile names no cache emulator (`emulator:`): nothing to predict" in capsys.readouterr().err


def test_caching_off_and_on_give_the_pinned_vllm_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """The predicted cached tokens are those a real vLLM 0.32.0 measured on the example (tests/
    test_vllm_qualify.py): 3,968 of 4,090 with blocks of 128 on the re-sends, 4,064 with blocks of 32, 0
    without caching; the effect sized is the candidate's predicted hit rate minus the baseline's."""
    plan = planned(capsys, "--candidate", "prefix-caching,prefix-caching-32", "--cache-param", BLOCK_128)
    builds = {b["build"]: b for b in plan["builds"]}   # type: ignore[attr-defined]
    assert builds["prefix-caching"]["cached_tokens"] == [0, 0, 3968, 3968]
    assert builds["prefix-caching-32"]["cached_tokens"] == [0, 0, 4064, 4064]
    assert builds["no-prefix-caching"]["cached_tokens"] == [0, 0, 0, 0]
    assert builds["prefix-caching"]["origins"]["block_size"] == "--cache-param prefix-caching.block_size=128"
    assert builds["prefix-caching"]["holds"] == "a pool of at least 64 blocks"
    sizings = plan["sizings"]
    for candidate, cached in (("prefix-caching", 3968), ("prefix-caching-32", 4064)):
        rows = {(s["metric"], s["request"]): s for s in sizings[candidate]}   # type: ignore[index]
        row = rows["hit_rate", "B-again"]
        assert (row["baseline_mean"], row["candidate_mean"], row["effect"]) == (0.0, cached / TOKENS, cached / TOKENS)
        assert row["sd"] == 0.0 and row["trials_per_build"] == 3
        assert rows["kv_pages", "startup"]["trials_per_build"] is None


def test_a_cache_param_is_read_as_a_command_line_s_value(capsys: pytest.CaptureFixture[str]) -> None:
    """--cache-param values go through the parser that reads the command line and the log (a comma
    grouping thousands, a word for a parameter that takes text), so a value means the same in both."""
    plan = planned(capsys, "--cache-param", BLOCK_128, "--cache-param", "prefix-caching.num_gpu_blocks=1,024")
    builds = {b["build"]: b for b in plan["builds"]}   # type: ignore[attr-defined]
    assert builds["prefix-caching"]["params"]["num_gpu_blocks"] == 1024
    assert parse_value("-1") == -1 and parse_value("0.668") == 0.668 and parse_value("LRU") == "lru"
    assert parse_value("1G") is None and parse_value("1G", textual=True) == "1G"


def test_the_prediction_holds_for_every_pool_from_the_bound_it_states() -> None:
    """At the stated least pool and any larger (the CPU build's 1 GiB is 16,384 blocks of 128) the prediction
    is the same; one block fewer and the workload evicts, so the re-sends' figures change."""
    inventory = load_inventory(HOSTS)
    spec = inventory.measurement.emulator
    assert spec is not None
    argv = command_words(inventory.server.command, list(inventory.build("prefix-caching").flags))
    requests = scenario_requests(load_scenario(RESEND))
    bounded = predict_build(spec, "prefix-caching", argv, requests, given={"block_size": 128})
    assert bounded.holds == "a pool of at least 64 blocks" and bounded.cache.params["num_gpu_blocks"] == 64
    for pool in (64, 65, 1000, 16_384):
        assert predict_build(spec, "b", argv, requests, given={"block_size": 128, "num_gpu_blocks": pool}
                             ).cached_tokens == bounded.cached_tokens == (0, 0, 3968, 3968)
    assert predict_build(spec, "b", argv, requests, given={"block_size": 128, "num_gpu_blocks": 63}
                         ).cached_tokens != bounded.cached_tokens


def test_concurrent_copies_are_not_sized_without_a_given_sd(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Two copies at once make the prediction a band's centre: its noise is not predicted, so the hit rates
    are listed as unsized unless --sd gives it."""
    scenario = tmp_path / "vllm-resend.yaml"   # the name inside must be the file's
    scenario.write_text((REPO / "examples" / "vllm-resend.yaml").read_text() + "concurrency: 2\n")
    args = ["plan", "--hosts", HOSTS, "--scenario", str(scenario), "--predict", "--candidate", "prefix-caching-32",
            "--json"]
    assert main(args) == 2   # nothing sized: one line says what sizes it
    said = capsys.readouterr()
    assert said.err.startswith("cache-qualify: error: nothing sized: ") and "--samples" in said.err, said.err
    rows = {(s["metric"], s["request"]): s for s in json.loads(said.out)["sizings"]["prefix-caching-32"]}
    assert rows["hit_rate", "A-again"]["trials_per_build"] is None
    assert rows["hit_rate", "A-again"]["note"].startswith("not predicted: concurrent copies make the prediction")
    assert main([*args, "--sd", "0.2"]) == 0
    rows = {(s["metric"], s["request"]): s for s in json.loads(capsys.readouterr().out)["sizings"]["prefix-caching-32"]}
    assert rows["hit_rate", "A-again"]["sd"] == 0.2 and rows["hit_rate", "A-again"]["trials_per_build"] > 3


def test_the_simulated_lab_is_predicted_on_its_groups_ranks_and_its_band_is_not_sized_without_an_sd(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The flare command's `--tensor-parallel-size {world_size}` is the group's size, as a start fills it (it
    read as the default 1 and refused --cache-param ranks=3), and the row cache's band is no exact value."""
    assert main(["plan", "--hosts", str(REPO / "hosts.yaml"), "--scenario", "reread-1g", "--predict", "--json"]) == 2
    said = capsys.readouterr()
    # nothing sized, and the one line names the command that sizes it (as the run's own policies and cache)
    assert said.err.strip().endswith("`cache-qualify plan --emulate --baseline set4 --candidate two_choice "
                                     "--cache-size 1G --scenario reread-1g` sizes it from emulated starts"), said.err
    out = json.loads(said.out)
    [built] = [b for b in out["builds"] if b["build"] == "set4"]
    assert built["params"]["ranks"] == 3 and built["origins"]["ranks"] == "--tensor-parallel-size 3", built
    rows = {(s["metric"], s["request"]): s for s in out["sizings"]["two_choice"]}
    assert rows["hit_rate", "B-new-start"]["note"].startswith(
        "not predicted: the flare-rowcache emulator predicts a band's centre"), rows


@pytest.mark.slow
def test_the_planned_design_passes_the_gate_with_the_planned_power(capsys: pytest.CaptureFixture[str]) -> None:
    """The figure the plan prints (3 trials per build) checked by a seeded simulation of the gate's own
    decision: each start's cached tokens are the prediction's, moved by a whole token at random (the
    values' resolution, below which the test floors the spread), in interleaved blocks; both re-send gains
    pass in at least 90 % of runs. One block fewer, a run without any spread decides no gain."""
    plan = planned(capsys, "--candidate", "prefix-caching-32")
    rows = [s for s in plan["sizings"]["prefix-caching-32"] if s["metric"] == "hit_rate"]  # type: ignore[index]
    trials = max(r["trials_per_build"] for r in rows)
    assert trials == 3
    inventory = load_inventory(HOSTS)
    wanted = [a for a in assertions_for(load_scenario(RESEND), inventory.measurement) if a.metric == "hit_rate"]
    rng = np.random.default_rng(20261206)

    def arm(cached: int, n: int) -> Trials:
        moved = np.clip(cached + rng.integers(-1, 2, n), 0, TOKENS)
        return Trials(tuple(float(k) / TOKENS for k in moved), blocks=tuple(range(n)))

    def passes(n: int) -> bool:
        verdicts = evaluate(wanted, {a.id: (arm(0, n), arm(4064, n)) for a in wanted}, alpha=0.01)
        return all(v.outcome == "pass" for v in verdicts)

    runs = 100
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VerdictWarning)   # the floor's notes, one per spread-free sample
        assert sum(passes(trials) for _ in range(runs)) / runs >= 0.9
        flat = {a.id: (Trials((0.0,) * 2, blocks=(0, 1)), Trials((4064 / TOKENS,) * 2, blocks=(0, 1))) for a in wanted}
        assert {v.outcome for v in evaluate(wanted, flat, alpha=0.01)} == {"inconclusive"}
