"""A server version whose rules may differ from the one an emulator follows is never silently predicted: the
vLLM profile pins 0.32.0 and reads the version a start logs (vllm/entrypoints/serve/utils/api_utils.py:325 of
0.32.0, `log_version_and_model`: the plain line or the logo's); a start of another version is not predicted, in
one line naming both, and a start that logs none is predicted as 0.32.0, saying so in its origins. The llama-cpp
profile pins the llama.cpp commit llama-cpp-python 0.3.36 vendors (0c1e57098) and reads the commit a start prints
at -lv 4 (common/common.cpp:402); a build without git (build 0, unknown) is taken as the pinned one, saying so."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cache_qualify.config.command import command_words
from cache_qualify.config.emulated import VersionPlaces
from cache_qualify.config.inventory import load_inventory
from cache_qualify.config.profiles import load_profile
from cache_qualify.config.scenario import load_scenario
from cache_qualify.emulation.predicted import predict_start
from cache_qualify.emulation.sources import VERSION, BuildCache, StartFacts, Unreadable, read_build
from cache_qualify.trials.runner import scenario_requests
from tests.support.labfixtures import REPO
from tests.support.recorded_vllm import EXAMPLE, body, vllm_bodies

RESEND = REPO / "examples" / "vllm-resend.yaml"
# vLLM's two forms of the line (api_utils.py:327 and its logo template, colours as a terminal formatter adds them)
PLAIN = "(APIServer pid=30401) INFO 12-01 23:35:20 [api_utils.py:346] vLLM server version %s, serving model tiny\n"
LOGO = ("(APIServer pid=30401) INFO 12-01 23:35:20 [api_utils.py:346] \n"
        " \x1b[33m▄▄\x1b[0m \x1b[34m▄█\x1b[0m \x1b[97m█     █     █ ▀▄▀ █\x1b[0m  version \x1b[97m%s\x1b[0m\n")


def predicted(line: str) -> tuple[str, dict[str, str]]:
    """The prediction of examples/vllm.yaml's prefix-caching build from the recorded start's log with `line`
    before it: (the not-predicted line or "", the origins)."""
    inventory = load_inventory(EXAMPLE)
    spec = inventory.measurement.emulator
    assert spec is not None and spec.version is not None and spec.version.follows == "0.32.0"
    argv = command_words(inventory.server.command, list(inventory.build("prefix-caching").flags))
    facts = StartFacts(tuple(argv), vllm_bodies("vllm-metrics.txt")[0], line + body("vllm-start.log"))
    record = predict_start(spec, facts, scenario_requests(load_scenario(RESEND)), build="prefix-caching", trial=0,
                           attempt="a")
    return record.unreadable or "", dict(record.origins)


@pytest.mark.parametrize("form", [PLAIN, LOGO], ids=["plain", "logo"])
def test_a_start_of_another_vllm_version_is_not_predicted_naming_both(form: str) -> None:
    line, origins = predicted(form % "0.34.0")
    assert line == ("build prefix-caching: not predicted: vLLM 0.34.0 is not the version its emulator follows "
                    "(0.32.0)") and origins == {}


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu"])
def test_a_start_of_the_pinned_version_is_predicted_and_says_so(version: str) -> None:
    line, origins = predicted(PLAIN % version)
    assert line == "" and origins[VERSION].startswith(f"vLLM {version} (the log's 'vLLM server version {version}"), \
        origins


def test_a_start_that_logs_no_version_is_predicted_as_the_pinned_one_saying_so() -> None:
    line, origins = predicted("")
    assert line == "" and origins[VERSION].startswith("nothing the start states (the start's log (") and \
        origins[VERSION].endswith("): taken as vLLM 0.32.0, the version its emulator follows"), origins
    assert origins["num_gpu_blocks"] == "vllm:cache_config_info{num_gpu_blocks=16384}"   # the rest as before


def test_a_version_place_is_what_a_start_states_never_a_flag() -> None:
    with pytest.raises(ValidationError, match=r"a version is what a start states \(a log line or a metric\), "
                                              r"found the flag --version"):
        VersionPlaces(server="vLLM", follows="0.32.0", read=[{"flag": "--version"}])


# llama.cpp: the llama-cpp profile pins the commit llama-cpp-python 0.3.36 vendors (0c1e57098, its CHANGELOG.md)
# and reads the one a start prints at -lv 4 (common/common.cpp:402, as the real llama-server 0.3.36 build prints
# it); a build without git prints "build 0 (unknown)"
LLAMA_BUILD = "0.00.032.014 I cmn  common_param: common_params_print_info: build %s with GNU 12.2.0 for Linux x86_64\n"
LLAMA_SLOTS = "0.00.987.500 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 8192, kv_unified = 'false'\n"


def llama_read(build: str) -> Unreadable | BuildCache:
    spec = load_profile("llama-cpp").emulator
    assert spec is not None and spec.version is not None and spec.version.follows == "0c1e57098"
    return read_build("b", spec, StartFacts(("llama-server", "--cache-ram", "0"), log=LLAMA_BUILD % build +
                                            LLAMA_SLOTS))


@pytest.mark.parametrize("build", ["7350 (0c1e57098)", "7350 (0c1e570981f2)"], ids=["short", "longer-hash"])
def test_a_llama_server_of_the_pinned_commit_is_predicted(build: str) -> None:
    cache = llama_read(build)
    assert isinstance(cache, BuildCache) and cache.origins[VERSION].startswith(
        f"llama.cpp {build.split('(')[1][:-1]} (the log's"), cache


def test_a_llama_server_of_another_commit_is_not_predicted_naming_both() -> None:
    cache = llama_read("7400 (4df29be4f)")   # llama-cpp-python 0.3.35's llama.cpp
    assert isinstance(cache, Unreadable) and cache.line == (
        "build b: not predicted: llama.cpp 4df29be4f is not the version its emulator follows (0c1e57098)"), cache


def test_a_llama_server_built_without_git_is_taken_as_the_pinned_commit_saying_so() -> None:
    cache = llama_read("0 (unknown)")
    assert isinstance(cache, BuildCache) and cache.origins[VERSION].endswith(
        "taken as llama.cpp 0c1e57098, the version its emulator follows"), cache


# SGLang: no log line states the version; /server_info does (entrypoints/http_server.py:863-889 of 0.5.23), asked
# once the start is ready and kept beside its log (StartFacts.reply)
SGLANG_LOG = ("[2026-12-01 10:00:00] server_args={'schedule': {'page_size': 16}, 'memory': {'radix_eviction_policy': "
              "'lru', 'disable_radix_cache': False}}\n[2026-12-01 10:00:09 TP0] max_total_num_tokens=123456, "
              "chunked_prefill_size=8192, max_prefill_tokens=16384\n")


def sglang_read(reply: str) -> Unreadable | BuildCache:
    spec = load_profile("sglang").emulator
    assert spec is not None and spec.version is not None and spec.version.follows == "0.5.23"
    return read_build("b", spec, StartFacts(("sglang", "serve"), log=SGLANG_LOG, reply=reply))


def test_an_sglang_start_of_another_version_is_not_predicted_naming_both() -> None:
    cache = sglang_read("0.5.18")
    assert isinstance(cache, Unreadable) and cache.line == (
        "build b: not predicted: SGLang 0.5.18 is not the version its emulator follows (0.5.23)"), cache


def test_an_sglang_start_of_the_pinned_version_is_predicted_saying_where_it_was_read() -> None:
    cache = sglang_read("0.5.23\n")
    assert isinstance(cache, BuildCache) and cache.origins[VERSION] == "SGLang 0.5.23 (GET /server_info version)"


def test_an_sglang_start_that_answered_no_version_is_taken_as_the_pinned_one_saying_so() -> None:
    cache = sglang_read("")
    assert isinstance(cache, BuildCache) and cache.origins[VERSION] == (
        "nothing the start states (GET /server_info version): taken as SGLang 0.5.23, the version its emulator "
        "follows"), cache


def test_a_version_needs_a_place_a_start_states_it_in() -> None:
    with pytest.raises(ValidationError, match=r"a version needs a place a start states it in: `read` \(a log "
                                              r"line or a metric\) or `reply` \(a GET and its field\)"):
        VersionPlaces(server="SGLang", follows="0.5.23")
