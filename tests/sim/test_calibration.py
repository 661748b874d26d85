"""`cache-qualify noise` and the noise model on the running simulated lab: real ranks, real trials."""

from __future__ import annotations

import contextlib
import io
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from cache_qualify.cli import main as cli_main
from cache_qualify.config.inventory import load_inventory
from cache_qualify.config.scenario import find_scenario, load_scenario
from cache_qualify.calibration import measure
from cache_qualify.sim.noise import PROFILES, draw_start
from cache_qualify.trials.seeds import start_seed
from tests.support.labfixtures import REPO, inventory_port, wait_no_sim_processes, write_inventory

STARTS = 6   # per build in the drift test
LOWERED = ["--sim-policy", "set4", "--host-system-share", "40"]


def short_scenario(tmp_path: Path, *, cache: str = "1G", requests: tuple[str, ...] = ("A", "A-new-start")) -> Path:
    """`reread-1g` cut to its first requests (a start then takes seconds), at `cache`."""
    data: dict[str, Any] = yaml.safe_load(find_scenario("reread-1g").read_text(encoding="utf-8"))
    data.update(name=f"short-{cache.lower()}", server_flags=["--embedding-table-cache-size", cache,
                                                              "--prefix-cache-memory", "0"],
                requests=[r for r in data["requests"] if r["name"] in requests],
                expectations=[e for e in data["expectations"] if e["request"] in (*requests, "*")])
    path = tmp_path / f"short-{cache.lower()}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def noise(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli_main(["noise", *args])
    return status, out.getvalue()


def check_lines(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if line.startswith("  ok ") or line.startswith("  OFF")]


@pytest.mark.slow
@pytest.mark.parametrize(("build", "cache", "kv_check"), [
    ("set4", None, "KV pages at 1 GiB, lowered reserve"),
    ("set4", "4G", "KV pages at 4 GiB, lowered reserve"),
    ("set4-default-reserve", "1G", "KV pages at 1 GiB, default reserve: eight starts"),
])
def test_noise_command_reproduces_the_studys_spreads(tmp_path: Path, build: str, cache: str | None,
                                                     kv_check: str) -> None:
    """Issue 10's figures: first-request wait difference, KV spreads, hit-rate spread, over 8 starts each."""
    inventory = write_inventory(tmp_path, client_latency=True)   # the calibrated noise whole
    scenario = [] if cache is None else ["--scenario", str(short_scenario(tmp_path, cache=cache))]
    status, output = noise("--hosts", str(inventory), "--build", build, "--starts", "8", "--seed", "7", *scenario)
    checks = check_lines(output)
    assert status == 0 and len(checks) == 3 and all(c.startswith("ok") for c in checks), output
    assert any(kv_check in c for c in checks), output
    assert "first request's readiness wait" in checks[0] and "study 0.48 s" in checks[0]
    assert "hit-rate spread" in checks[2]
    assert "median |diff|" in output and "RowCache study" in output
    assert wait_no_sim_processes(inventory_port(inventory)) == []


@pytest.mark.slow
def test_a_bad_start_is_one_outlying_trial_with_all_its_waits_high(tmp_path: Path) -> None:
    """Bad starts drawn at 30 % over 8 starts: the trials the model marks bad, and only they, wait ~4x
    on every request."""
    rate = "0.3"
    path = write_inventory(tmp_path, client_latency=True, builds={"set4-flaky-disk": {
        "path": "fixtures/cache_qualify/sim/server.py", "flags": [*LOWERED, "--sim-bad-start-rate", rate]}})
    scenario = load_scenario(short_scenario(tmp_path, requests=("A", "A-new-start", "A-third-read")))
    report = measure(load_inventory(path), build="set4-flaky-disk", scenario=scenario, starts=8, seed=11)
    model = replace(PROFILES["calibrated"], bad_start_rate=float(rate))
    bad = [draw_start(model, start_seed(11, scenario=scenario.name, arm="set4-flaky-disk", trial=t)).bad
           for t in range(8)]
    assert 0 < sum(bad) < 4, bad   # the seed gives a run with a bad start among good ones
    waits = np.array([report.spread(r, "readiness_wait_ns").values for r in ("A", "A-new-start", "A-third-read")])
    relative = waits / np.median(waits[:, [not b for b in bad]], axis=1, keepdims=True)
    assert (relative[:, bad] > 2.5).all(), relative       # every wait of a bad start is high ...
    assert (relative[:, [not b for b in bad]] < 1.6).all(), relative   # ... and no wait of a good one
    hits = np.array(report.spread("A-third-read", "hit_rate").values)
    assert np.ptp(hits) < 0.002                           # a slow disk changes no hit rate
    assert wait_no_sim_processes(inventory_port(path)) == []


def period_with_trough_at(t_s: float, *, about_s: float) -> float:
    """A period near `about_s` at which the drift's sine, sin(2 pi t / period) of the wall clock's t, is at
    its trough at `t_s` (`t_s` over the period ends in .75)."""
    return t_s / (round(t_s / about_s - 0.75) + 0.75)


@pytest.mark.slow
def test_drift_moves_the_wait_level_between_blocks(tmp_path: Path) -> None:
    """A drift of +-50 % spreads the blocks' waits; without it (quiet) they stay level.

    The drift follows the wall clock (the sine of the epoch's seconds), so its period and phase are
    set from this machine's pace: the quiet build's six starts are timed first, and the period is set
    so that six drifting starts of the same pace span half of it, the first at the sine's trough
    (factor 0.5) and the last at its crest (1.5): max/min 3 in theory. The pace of the drifting
    starts is the machine's load's, which moves while the suite runs; from the trough, starts 3.4
    times faster still reach max/min 1.4 (a sixth of the period), and slower ones span more of it
    (all of it from 2 times slower, until ten times slower, when every start would fall on a trough).
    A fixed period either fits a fast machine or a slow one: at 9 s, starts quicker than 1 s spanned
    a third of it, and the ratio fell to 1.38 in a run of the suite; a phase left to chance held only
    while the pace stayed within 40 % of the quiet starts'."""
    quiet = [*LOWERED, "--sim-noise", "quiet"]
    scenario = load_scenario(short_scenario(tmp_path, requests=("A", "A-third-read")))

    def first_and_third(build: str, flags: list[str]) -> tuple[np.ndarray, np.ndarray, float]:
        """The first and third reads' waits of each start, and the seconds a start took."""
        path = write_inventory(tmp_path, builds={build: {"path": "fixtures/cache_qualify/sim/server.py",
                                                         "flags": flags}})
        began = time.monotonic()
        report = measure(load_inventory(path), build=build, scenario=scenario, starts=STARTS, seed=5)
        start_s = (time.monotonic() - began) / STARTS
        assert wait_no_sim_processes(inventory_port(path)) == []
        first, third = (np.array(report.spread(r, "readiness_wait_ns").values) for r in ("A", "A-third-read"))
        return first, third, start_s

    first, _, start_s = first_and_third("set4-quiet", quiet)
    # the first drifting start's first read comes about half a start from now (the lab opens, a rank starts)
    period_s = period_with_trough_at(time.time() + start_s / 2, about_s=2 * (STARTS - 1) * start_s)
    level = {"set4-quiet": first.max() / first.min()}
    first, third, _ = first_and_third("set4-drifting", [*quiet, "--sim-drift", "0.5", "--sim-drift-period-s",
                                                      repr(period_s)])   # every digit: the phase is t / period
    level["set4-drifting"] = first.max() / first.min()
    # a start's requests share its level: the third read moves with the first
    assert np.corrcoef(first, third)[0, 1] > 0.8, (first, third)
    assert level["set4-quiet"] < 1.1, level
    assert level["set4-drifting"] > 1.4, (level, f"period {period_s:.2f} s for starts of {start_s:.2f} s")


def test_noise_command_refuses_a_real_lab(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli_main(["noise", "--hosts", str(REPO / "examples" / "gb10-lab.yaml"), "--starts", "8"])
    assert status == 2
    assert "`cache-qualify noise` measures the simulated lab, whose hosts use the local transport (found gb10-a: ssh" \
        in capsys.readouterr().err
