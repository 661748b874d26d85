"""A build's emulator parameters read from its flags and its start's facts (cache_qualify.emulation.sources)
and its predicted hit rate held against the measured one (cache_qualify.emulation.check), on vLLM's
recorded /metrics body and the example P, Q, P-again of docs/emulation.md."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cache_qualify.config.emulated import EmulatorSource
from cache_qualify.config.profiles import available_runtimes, load_profile
from cache_qualify.emulation import Prompts, parameters, predict
from cache_qualify.emulation.check import check
from cache_qualify.emulation.sources import BuildCache, StartFacts, Unreadable, read_build
from cache_qualify.errors import EmulationError

DATA = Path(__file__).resolve().parent / "data"
KV_LINE = "INFO 12-01 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum concurrency 256.00x"


def vllm_spec() -> EmulatorSource:
    spec = load_profile("vllm").emulator
    assert spec is not None
    return spec


def recorded_metrics() -> str:
    """The first scrape of a real vLLM 0.32.0 (CPU build), caching on, blocks of 128, 16,384 blocks."""
    return (DATA / "vllm-metrics.txt").read_text().split("# --- next scrape ---")[0]


def read(argv: tuple[str, ...], metrics: str = "", log: str = "") -> BuildCache:
    cache = read_build("pc-on", vllm_spec(), StartFacts(argv, metrics, log))
    assert isinstance(cache, BuildCache), cache
    return cache


def test_every_shipped_profile_names_parameters_its_emulator_takes() -> None:
    named = {r: load_profile(r).emulator for r in available_runtimes()}
    for runtime, spec in named.items():
        if spec is not None:
            assert set(spec.parameters) <= set(parameters(spec.name)), runtime
    assert named["vllm"] is not None and set(named["vllm"].parameters) == set(parameters("vllm-block"))


def test_the_pool_and_block_size_are_read_from_cache_config_info() -> None:
    cache = read(("--enable-prefix-caching",), recorded_metrics())
    assert dict(cache.params) == {"prefix_caching": True, "block_size": 128, "num_gpu_blocks": 16384}
    assert cache.origins["num_gpu_blocks"] == "vllm:cache_config_info{num_gpu_blocks=16384}"
    assert cache.origins["prefix_caching"] == "--enable-prefix-caching"


def test_a_flag_comes_before_the_metric_and_the_kv_line_is_divided_into_blocks() -> None:
    cache = read(("--no-enable-prefix-caching", "--block-size=32"), log=KV_LINE)
    assert dict(cache.params) == {"prefix_caching": False, "block_size": 32, "num_gpu_blocks": 65536}
    assert cache.origins["num_gpu_blocks"].endswith("/ block_size")
    # the last of the two switches is the one in effect, as the server's argument parser has it
    assert read(("--no-enable-prefix-caching", "--enable-prefix-caching", "--block-size", "16"), log=KV_LINE).params["prefix_caching"]


def test_what_no_place_gives_is_one_preflight_line_naming_the_build() -> None:
    missing = read_build("pc-on", vllm_spec(), StartFacts(("--block-size", "32"), "", "no KV line here"))
    assert isinstance(missing, Unreadable) and missing.parameter == "num_gpu_blocks"
    assert missing.line.startswith("build pc-on: not predicted: the vllm-block emulator's `num_gpu_blocks` is "
                                   "stated by none of its places (vllm:cache_config_info{num_gpu_blocks}; the "
                                   "start's log")
    assert missing.line.endswith(": declare it as builds.pc-on.cache.num_gpu_blocks in the inventory")
    assert "\n" not in missing.line


def test_a_profile_naming_a_parameter_the_emulator_lacks_is_refused() -> None:
    spec = EmulatorSource.model_validate({"name": "vllm-block", "parameters": {"page_size": ({"flag": "--p"},)}})
    with pytest.raises(EmulationError, match=r"vllm-block has no parameter page_size; it takes block_size"):
        read_build("b", spec, StartFacts(()))


def test_a_source_gives_one_place() -> None:
    with pytest.raises(ValueError, match=r"exactly one of flag, switch, metric, log, found flag, log"):
        EmulatorSource.model_validate({"name": "vllm-block", "parameters": {
            "block_size": ({"flag": "--block-size", "log": "(x)"},)}})


def test_a_candidate_silently_without_its_cache_fails_the_check_with_the_likely_cause() -> None:
    cache = read(("--enable-prefix-caching",), recorded_metrics())
    prediction = predict(cache.emulator, cache.params, Prompts.of(
        [np.arange(4000) % 997, np.arange(4000) % 991 + 5, np.arange(4000) % 997]))
    assert prediction.cached_tokens.tolist() == [0, 0, 3968]  # 31 whole blocks of 128, as the real vLLM served
    lacking = check(cache, prediction, [2], on="P-again", measured_hits=0, measured_prompt_tokens=4000)
    assert not lacking.within and lacking.outcome == "failed"
    assert lacking.line() == ("build pc-on measured 0.0 % on P-again where prefix caching with blocks of 128 and "
                              "2,097,152 tokens gives 99.2 %: is --enable-prefix-caching in effect (read from "
                              "--enable-prefix-caching)?")
    served = check(cache, prediction, [2], on="P-again", measured_hits=3968, measured_prompt_tokens=4000)
    assert served.within and served.properties()["prediction_outcome"] == "passed"
    # exact one at a time: one block short is outside
    assert not check(cache, prediction, [2], on="P-again", measured_hits=3840, measured_prompt_tokens=4000).within


def test_a_smaller_cache_is_named_and_a_scenario_can_make_it_a_warning() -> None:
    cache = read(("--enable-prefix-caching",), recorded_metrics())
    prediction = predict(cache.emulator, cache.params, Prompts.of([np.arange(600), np.arange(600)]))
    whole = slice(None)
    drifted = check(cache, prediction, whole, on="the trace", measured_hits=256, measured_prompt_tokens=1200,
                    mode="warn")
    assert drifted.outcome == "warning" and drifted.predicted == pytest.approx(512 / 1200)
    assert "is the cache smaller than its parameters say" in drifted.line()
    assert "num_gpu_blocks from vllm:cache_config_info{num_gpu_blocks=16384}" in drifted.line()
    # with concurrency the replay is a band's centre: within the profile's band passes
    banded = check(cache, prediction, whole, on="the trace", measured_hits=500, measured_prompt_tokens=1200,
                   concurrency=4, band=vllm_spec().band)
    assert banded.within and not banded.exact and banded.line().endswith("± 2.0 pp")
