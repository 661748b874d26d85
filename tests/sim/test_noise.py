"""The noise model against the RowCache study's figures, by seeded simulation of many starts (no servers)."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import numpy as np
import pytest

from cache_qualify.calibration import (KV_STUDY, STUDY_FIRST_WAIT_DIFFERENCE_S, TOLERANCE, expected_range,
                                           mean_difference, typical_difference)
from cache_qualify.sim.memory import GIB, MemoryModel
from cache_qualify.sim.noise import PROFILES, Latency, NoiseModel, draw_start, rank_kv_pages, start_budget
from cache_qualify.sim.server import parse_args

CALIBRATED = PROFILES["calibrated"]
QUIET = PROFILES["quiet"]
RANKS = 3
STARTS = 600
EMULATED_FIRST_WAIT_S = 5.3   # request A's readiness wait on the emulated lab (`cache-qualify noise`)


def start_pages(model: NoiseModel, share: int, cache_gib: int, starts: int = STARTS) -> list[int]:
    """KV pages per start as the gate reads them: the smallest of the ranks'."""
    budget = start_budget(model, MemoryModel(host_system_share=share, row_cache_bytes=cache_gib * GIB))
    return [min(rank_kv_pages(draw_start(model, seed), budget, seed, rank) for rank in range(RANKS))
            for seed in range(starts)]


def within(model: float, study: float) -> bool:
    return study / TOLERANCE <= model <= study * TOLERANCE


@pytest.mark.parametrize("key", sorted(KV_STUDY))
def test_calibrated_kv_spread_is_the_studys_within_a_factor_of_two(key: tuple[int, int]) -> None:
    reference = KV_STUDY[key]
    drawn = start_pages(CALIBRATED, *key)
    assert within(reference.model(drawn), reference.apart), (reference.label, reference.model(drawn))


def test_quiet_kv_spread_is_the_memory_models_independent_ranks() -> None:
    # before the noise model, the smallest of three independent ranks halved the study's 4 GiB spread
    drawn = start_pages(QUIET, 40, 4)
    assert KV_STUDY[(40, 4)].model(drawn) < KV_STUDY[(40, 4)].apart / TOLERANCE


def test_start_factor_makes_first_requests_differ_by_the_studys_half_second() -> None:
    factors = [draw_start(replace(CALIBRATED, bad_start_rate=0.0), seed).wait_factor for seed in range(STARTS)]
    assert within(typical_difference(factors) * EMULATED_FIRST_WAIT_S, STUDY_FIRST_WAIT_DIFFERENCE_S)
    assert 0.97 < float(np.median(factors)) < 1.03   # the miss cost keeps its meaning: 6.4 us per miss


def test_a_start_is_drawn_from_its_seed_alone_the_same_on_every_rank() -> None:
    # the rank is no input: every rank of a start computes the same factor and KV deviate
    assert draw_start(CALIBRATED, 7) == draw_start(CALIBRATED, 7)
    assert len({draw_start(CALIBRATED, seed).wait_factor for seed in range(20)}) == 20
    budget = start_budget(CALIBRATED, MemoryModel(host_system_share=40, row_cache_bytes=4 * GIB))
    ranks = [rank_kv_pages(draw_start(CALIBRATED, 7), budget, 7, rank) for rank in range(RANKS)]
    assert max(ranks) - min(ranks) < 0.5 * budget.noise_sd_pages  # mostly the start's noise, a little the rank's


def test_bad_starts_are_a_few_per_hundred_and_several_times_slower() -> None:
    starts = [draw_start(CALIBRATED, seed) for seed in range(5000)]
    bad = [s for s in starts if s.bad]
    assert 0.02 <= len(bad) / len(starts) <= 0.04
    good = np.median([s.wait_factor for s in starts if not s.bad])
    assert min(s.wait_factor for s in bad) > 2.5 * good
    assert 3.5 < np.median([s.wait_factor for s in bad]) / good < 4.5


def test_quiet_profile_has_no_start_noise_bad_starts_or_latency() -> None:
    for seed in range(50):
        start = draw_start(QUIET, seed)
        assert (start.wait_factor, start.bad) == (1.0, False)
    latency = Latency(QUIET, 1)
    assert [latency.next_s() for _ in range(5)] == [0.0] * 5


def test_latency_is_positive_and_its_differences_are_the_studys() -> None:
    latency = Latency(CALIBRATED, 3)
    draws = np.array([latency.next_s() for _ in range(2000)])
    assert draws.min() >= 0
    assert abs(draws.mean() - CALIBRATED.latency_s) < 0.01
    # the study: requests with similar miss counts 0.01 s and 0.15 s apart on two servers
    assert 0.01 < typical_difference(draws[:300]) < 0.15
    again = Latency(CALIBRATED, 3)
    assert [again.next_s() for _ in range(3)] == list(draws[:3])


def test_drift_moves_the_wait_scale_with_the_wall_clock() -> None:
    model = replace(QUIET, drift=0.5, drift_period_s=100.0)
    start = draw_start(model, 0)
    assert start.wait_scale(0.0) == pytest.approx(1.0)
    assert start.wait_scale(25.0) == pytest.approx(1.5)
    assert start.wait_scale(75.0) == pytest.approx(0.5)
    assert draw_start(QUIET, 0).wait_scale(25.0) == 1.0   # off by default


def test_noise_flags_pick_a_profile_and_override_its_parameters() -> None:
    base = ["--rank", "0", "--port", "1"]
    assert parse_args(base).noise == CALIBRATED
    assert parse_args([*base, "--sim-noise", "quiet"]).noise == QUIET
    args = parse_args([*base, "--sim-noise", "quiet", "--sim-bad-start-rate", "0.5", "--sim-drift", "0.2"])
    assert args.noise == replace(QUIET, bad_start_rate=0.5, drift=0.2)


@pytest.mark.parametrize(("flags", "message"), [
    (["--sim-bad-start-rate", "1.5"], r"--sim-bad-start-rate: `bad_start_rate` must be in 0..1, got 1.5"),
    (["--sim-drift", "1"], r"--sim-drift: `drift` must be below 1"),
    (["--sim-wait-factor-sd", "-0.1"], r"--sim-wait-factor-sd: `wait_factor_sd` must be >= 0"),
    (["--sim-bad-start-factor", "0.5"], r"--sim-bad-start-factor: `bad_start_factor` must be >= 1"),
])
def test_a_bad_noise_flag_is_refused_naming_it(flags: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match=r"^2$") as exc:   # argparse's usage error
        parse_args(["--rank", "0", "--port", "1", *flags])
    assert exc.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_typical_difference_and_expected_range_match_brute_force() -> None:
    values = list(np.random.default_rng(5).normal(size=11))
    pairs = [abs(a - b) for a, b in itertools.combinations(values, 2)]
    assert typical_difference(values) == pytest.approx(float(np.median(pairs)))
    assert mean_difference(values) == pytest.approx(float(np.mean(pairs)))
    ranges = [max(c) - min(c) for c in itertools.combinations(values, 8)]
    assert expected_range(values, 8) == pytest.approx(float(np.mean(ranges)))
    assert expected_range(values[:8], 8) == pytest.approx(max(values[:8]) - min(values[:8]))
    assert np.isnan(expected_range(values[:5], 8)) and np.isnan(typical_difference(values[:1]))
    assert np.isnan(mean_difference(values[:1]))
