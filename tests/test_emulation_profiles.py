"""The `emulator:` sections of the llama-cpp and sglang profiles read each parameter from the places their
runtime really gives it (cache_qualify.emulation.sources), on log lines as llama-server 0.3.36 printed them
(tests/test_llama_emulator.py reads a live one) and as SGLang 0.5.23's source formats them; and what the
preflight can say of a build from its command line alone (`read_before_start`)."""

from __future__ import annotations

import numpy as np
import pytest

from cache_qualify.config.emulated import EmulatorSource
from cache_qualify.config.profiles import load_profile
from cache_qualify.emulation.predicted import predict_start
from cache_qualify.emulation.sources import (BuildCache, StartFacts, Unreadable, read_before_start, read_build,
                                             read_some)
from cache_qualify.workload.requests import Request

# llama-server at -lv 4: the slot's context at start, the first prompt saved to the host cache
LLAMA_LOG = ("0.00.987.500 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 8192, kv_unified = 'false'\n"
             "0.01.566.782 I srv   prompt_save:  - saving prompt with length 5000, total state size = 0.668 MiB "
             "(draft: 0.000 MiB)\n")
# SGLang: entrypoints/engine.py:311 (ServerArgs.resolved_dict) and managers/scheduler.py:1269
SGLANG_LOG = ("[2026-12-01 10:00:00] server_args={'model_path': 'm', 'schedule': {'page_size': 16, 'c128_page_size': "
              "16, 'max_total_tokens': None}, 'memory': {'radix_eviction_policy': 'lfu', 'disable_radix_cache': "
              "False}}\n[2026-12-01 10:00:09 TP0] max_total_num_tokens=123456, chunked_prefill_size=8192, "
              "max_prefill_tokens=16384, max_running_requests=2048, context_len=32768, available_gpu_mem=10.00 GB\n")


def spec(runtime: str) -> EmulatorSource:
    found = load_profile(runtime).emulator
    assert found is not None
    return found


def read(runtime: str, argv: tuple[str, ...], log: str) -> BuildCache:
    cache = read_build("b", spec(runtime), StartFacts(argv, log=log))
    assert isinstance(cache, BuildCache), cache
    return cache


def test_llama_server_s_defaults_fill_what_its_flags_leave_out_and_the_log_gives_the_rest() -> None:
    cache = read("llama-cpp", ("llama-server", "-np", "1"), LLAMA_LOG)
    assert cache.params == {"n_ctx": 8192, "cache_ram_mib": 8192, "slot_prompt_similarity": 0.1,
                            "cache_prompt": True, "n_slots": 1, "kv_unified": False, "cache_idle_slots": True,
                            "state_bytes_per_token": 140, "n_ctx_total": 0}
    assert cache.origins["cache_ram_mib"] == "the runtime's default 8192 (no --cache-ram)"
    assert cache.origins["state_bytes_per_token"] == ("the log's 'saving prompt with length 5000, total state "
                                                      "size = 0.668 MiB'")


@pytest.mark.parametrize(("argv", "log", "slots"), [
    (("llama-server",), "", 4),                                   # auto: 4 (tools/server/server.cpp:156)
    (("llama-server", "--parallel", "2"), "", 2),
    (("llama-server", "-np", "1"), LLAMA_LOG.replace("n_slots = 1", "n_slots = 4"), 4),   # what the start says
])
def test_several_slots_are_read_from_the_start_else_the_flags_else_the_default_4(argv: tuple[str, ...], log: str,
                                                                                  slots: int) -> None:
    """llama-server's default is 4 slots (tools/server/server.cpp:156): the slots the start prints, else -np or
    --parallel, else 4, each modelled (tests/test_llama_emulator.py holds 4 and 2 to the real server)."""
    record = predict_start(spec("llama-cpp"), StartFacts(argv, log=log or LLAMA_LOG.replace("n_slots = 1, ", "")),
                           [Request("A", tokens=np.arange(3, 103))], build="b", trial=0, attempt="a")
    assert not record.unreadable and record.params["n_slots"] == slots, record


def test_llama_server_s_flags_win_over_its_defaults() -> None:
    cache = read("llama-cpp", ("-cram", "2", "-sps", "0.5", "--no-cache-prompt"), LLAMA_LOG)
    assert (cache.params["cache_ram_mib"], cache.params["slot_prompt_similarity"], cache.params["cache_prompt"]) \
        == (2, 0.5, False)
    assert read("llama-cpp", ("--cache-ram=-1",), LLAMA_LOG).params["cache_ram_mib"] == -1   # no limit


def test_a_host_cache_without_a_saved_state_in_the_log_is_not_predicted_naming_the_parameter() -> None:
    """At the default verbosity llama-server never prints a state's size: 0, which the emulator refuses
    where the host cache is on (no guessed size); with the cache off it is not needed."""
    plain = LLAMA_LOG.splitlines()[0]
    request = Request("A", tokens=np.arange(3, 103))
    record = predict_start(spec("llama-cpp"), StartFacts(("--cache-ram", "8192"), log=plain), [request],
                           build="ram-cache", trial=0, attempt="a")
    assert record.cached_tokens == () and "state_bytes_per_token" in record.unreadable, record
    off = predict_start(spec("llama-cpp"), StartFacts(("--cache-ram", "0"), log=plain), [request],
                        build="no-ram-cache", trial=0, attempt="a")
    assert off.unreadable == "" and off.cached_tokens == (0,)


def test_sglang_reads_its_resolved_arguments_before_its_flags() -> None:
    cache = read("sglang", ("--page-size", "32", "--radix-eviction-policy", "lru"), SGLANG_LOG)
    assert cache.params == {"page_size": 16, "max_total_num_tokens": 123456, "eviction_policy": "lfu",
                            "chunked_prefill_size": 8192, "radix_cache": True, "slru_protected_threshold": 2}
    assert cache.origins["radix_cache"] == "not the log's \"'disable_radix_cache': False\""
    off = read("sglang", (), SGLANG_LOG.replace("'disable_radix_cache': False", "'disable_radix_cache': True"))
    assert off.params["radix_cache"] is False


def test_sglang_s_flags_serve_where_the_arguments_line_is_missing() -> None:
    pool = SGLANG_LOG.splitlines()[1] + "\n'disable_radix_cache': False"
    cache = read("sglang", ("--page-size", "32"), pool)
    assert (cache.params["page_size"], cache.params["eviction_policy"]) == (32, "lru")
    missing = read_build("b", spec("sglang"), StartFacts((), log=pool))
    assert isinstance(missing, Unreadable) and missing.parameter == "page_size", missing


@pytest.mark.parametrize(("argv", "log", "threshold"), [
    ((), "", 2),
    (("--radix-eviction-policy-config", '{"protected_threshold": 4}'), "", 4),
    (("--radix-eviction-policy-config={\"protected_threshold\": 5}",), "", 5),
    # the resolved dict logs the object (entrypoints/engine.py:311), read before the flag
    (("--radix-eviction-policy-config", '{"protected_threshold": 4}'),
     "'radix_eviction_policy_config': {'protected_threshold': 3}", 3),
])
def test_sglang_s_slru_threshold_is_read_from_its_policy_config(argv: tuple[str, ...], log: str,
                                                                threshold: int) -> None:
    pool = SGLANG_LOG + log
    cache = read("sglang", ("--radix-eviction-policy", "slru", *argv), pool)
    assert cache.params["slru_protected_threshold"] == threshold, cache.origins


@pytest.mark.parametrize("policy", ["priority", "tlru"])
def test_an_sglang_policy_the_emulator_does_not_model_is_not_predicted_in_one_line(policy: str) -> None:
    """Before any start from the flag, and at a start whose resolved arguments name it (a model's override)."""
    seen = read_before_start("b", spec("sglang"), ("--radix-eviction-policy", policy))
    assert seen.not_predicted is not None and seen.not_predicted.startswith(
        "build b: not predicted: --radix-eviction-policy is not modelled (the priority and tlru"), seen
    log = SGLANG_LOG.replace("'radix_eviction_policy': 'lfu'", f"'radix_eviction_policy': '{policy}'")
    record = predict_start(spec("sglang"), StartFacts((), log=log), [Request("A", tokens=np.arange(3, 103))],
                           build="b", trial=0, attempt="a")
    assert record.cached_tokens == () and record.unreadable.startswith(
        f"build b: not predicted: --radix-eviction-policy {policy} is not modelled ("), record.unreadable
    assert "\n" not in record.unreadable


@pytest.mark.parametrize(("runtime", "argv", "after"), [
    ("llama-cpp", ("--cache-ram", "0"), ["n_ctx", "n_slots", "kv_unified", "n_ctx_total",
                                             "state_bytes_per_token"]),
    # the resolved arguments' line comes before the flags: what the server resolved is what is read
    ("sglang", ("--page-size", "16"), ["page_size", "max_total_num_tokens", "eviction_policy",
                                       "slru_protected_threshold", "chunked_prefill_size", "radix_cache"]),
    ("vllm", ("--block-size", "16"), ["num_gpu_blocks"]),
])
def test_the_preflight_lists_what_only_a_start_gives(runtime: str, argv: tuple[str, ...], after: list[str]) -> None:
    seen = read_before_start("b", spec(runtime), argv)
    assert seen.refused is seen.not_predicted is None, seen
    assert [line.split("`")[1] for line in seen.after] == after, seen.after


FLAG_ONLY = EmulatorSource.model_validate({"name": "llama-slot", "parameters": {
    "n_ctx": [{"log": r"n_ctx_slot = (\d+)"}], "cache_ram_mib": [{"flag": "-cram"}, {"flag": "--cache-ram"}]}})


def test_a_flag_only_parameter_whose_flag_is_absent_is_not_predicted_naming_the_field_to_declare() -> None:
    """A parameter nobody states is never a refusal (the build may be correct): the build is not predicted, in
    one line naming the inventory field that would state it."""
    seen = read_before_start("one-slot", FLAG_ONLY, ("llama-server", "-np", "1"))
    assert seen.refused is None and seen.not_predicted == (
        "build one-slot: not predicted: the llama-slot emulator's `cache_ram_mib` is stated by none of its places "
        "(the flag -cram; the flag --cache-ram): declare it as builds.one-slot.cache.cache_ram_mib in the inventory")
    assert read_before_start("b", FLAG_ONLY, ("--cache-ram", "0")).not_predicted is None
    declared = read_before_start("one-slot", FLAG_ONLY, ("llama-server",), {"cache_ram_mib": 0})
    assert declared.not_predicted is None and [a.split("`")[1] for a in declared.after] == ["n_ctx"], declared


def test_a_declaration_its_command_line_contradicts_is_refused_naming_both() -> None:
    seen = read_before_start("one-slot", FLAG_ONLY, ("--cache-ram", "8192"), {"cache_ram_mib": 0})
    assert (seen.refused, seen.parameter) == ("build one-slot: `cache_ram_mib` is declared 0 "
                                              "(builds.one-slot.cache.cache_ram_mib) but --cache-ram 8192 states "
                                              "8192", "cache_ram_mib")


def test_a_declaration_the_start_contradicts_is_refused_at_that_start_and_an_agreeing_one_predicts() -> None:
    """What only a start reports (its log) checked against the declaration: a refusal naming both."""
    log = "n_ctx_slot = 4096\n"
    refused = read_build("b", FLAG_ONLY, StartFacts(("--cache-ram", "0"), log=log), {"n_ctx": 2048})
    assert isinstance(refused, Unreadable) and refused.refused and refused.line == (
        "build b: refused: `n_ctx` is declared 2048 (builds.b.cache.n_ctx) but the log's 'n_ctx_slot = 4096' "
        "states 4096"), refused
    agreed = read_build("b", FLAG_ONLY, StartFacts(("--cache-ram", "0"), log=log), {"n_ctx": 4096})
    assert isinstance(agreed, BuildCache) and agreed.origins["n_ctx"] == "builds.b.cache.n_ctx: 4096", agreed


def test_a_default_on_a_metric_is_refused() -> None:
    with pytest.raises(ValueError, match=r"`default` belongs to a `switch`, `flag` or `log`"):
        EmulatorSource.model_validate({"name": "vllm-block", "parameters": {
            "block_size": [{"metric": "vllm:cache_config_info", "label": "block_size", "default": 16}]}})


def test_a_build_reusing_chunks_by_kv_shifting_is_not_predicted_saying_why() -> None:
    record = predict_start(spec("llama-cpp"), StartFacts(("--cache-reuse", "256"), log=LLAMA_LOG),
                           [Request("A", tokens=np.arange(3, 103))], build="cache-reuse", trial=0, attempt="a")
    assert record.cached_tokens == () and record.unreadable == (
        "build cache-reuse: not predicted: --cache-reuse is not modelled (the reuse of cached chunks by KV "
        "shifting)"), record.unreadable
    off = predict_start(spec("llama-cpp"), StartFacts(("--cache-reuse", "0"), log=LLAMA_LOG),
                        [Request("A", tokens=np.arange(3, 103))], build="off", trial=0, attempt="a")
    assert off.unreadable == "" and off.cached_tokens == (0,), off


@pytest.mark.parametrize(("runtime", "argv", "flag"), [
    ("vllm", ("--kv-offloading-size", "8"), "--kv-offloading-size"),
    ("vllm", ("--kv-offloading-backend", "native"), "--kv-offloading-backend"),
    ("vllm", ("--kv-transfer-config", '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}'),
     "--kv-transfer-config"),
    ("vllm", ("--kv-transfer-config.kv_connector=LMCacheConnectorV1",), "--kv-transfer-config"),
    ("sglang", ("--enable-hierarchical-cache",), "--enable-hierarchical-cache"),
    ("sglang", ("--hicache-storage-backend", "file"), "--hicache-storage-backend"),
    ("sglang", ("--enable-lmcache",), "--enable-lmcache"),
    ("sglang", ("--enable-flexkv",), "--enable-flexkv"),
    ("llama-cpp", ("--slot-save-path", "/tmp/slots"), "--slot-save-path"),
])
def test_a_cache_no_emulator_models_is_not_predicted_in_one_line(runtime: str, argv: tuple[str, ...],
                                                                  flag: str) -> None:
    """Never a band of zero around a prediction that leaves the tier out: the build is not predicted, before
    any start and at each, naming the flag."""
    seen = read_before_start("b", spec(runtime), ("server", *argv))
    assert seen.not_predicted is not None and seen.not_predicted.startswith(f"build b: not predicted: {flag} is "
                                                                            "not modelled ("), seen
    cache = read_build("b", spec(runtime), StartFacts(("server", *argv)))
    assert isinstance(cache, Unreadable) and cache.line == seen.not_predicted and not cache.refused


def test_before_any_start_a_log_s_default_is_not_taken() -> None:
    """Without a start's log the state size is unknown, not 0: plan --predict asks for it."""
    reading = read_some(spec("llama-cpp"), StartFacts(("--cache-ram", "8192")))
    assert reading.params["cache_ram_mib"] == 8192, reading
    assert set(reading.missing) == {"n_ctx", "kv_unified", "n_ctx_total", "state_bytes_per_token"}, \
        reading.missing
