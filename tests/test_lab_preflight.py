"""`cache_qualify.lab.preflight.check_builds`: every file a build's command line names is on the host;
`check_flags`: every build's command line has the flags its runtime's cached-tokens field needs."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from cache_qualify.config.inventory import load_inventory
from cache_qualify.config.scenario import find_scenario, load_scenario
from cache_qualify.errors import CommandFailed, ConfigError
from cache_qualify.lab.preflight import check_builds, check_flags
from cache_qualify.lab.transport import LocalTransport
from tests.support.examples import adapt_example
from tests.support.labfaults import failed, failures
from tests.support.labfixtures import REPO, committed_inventory, run_qualify, write_inventory


def test_a_model_file_the_server_command_names_must_exist(tmp_path: Path) -> None:
    model = tmp_path / "models" / "model.gguf"
    command = committed_inventory()["server"]["command"] + f" --model-file {model}"
    inventory = load_inventory(write_inventory(tmp_path, server={"command": command},
                                               builds={"two_choice": {"path": "fixtures/cache_qualify/sim/server.py",
                                                                      "flags": ["--lora", str(tmp_path / "a.lora")]}}))
    host = inventory.hosts[0]
    with LocalTransport(host.name) as transport:
        with pytest.raises(CommandFailed, match=rf"^host {host.name}: file named by the server command not found: "
                                                rf"{model}, {tmp_path / 'a.lora'}$"):
            check_builds(inventory, host, transport)
        model.parent.mkdir()
        model.write_bytes(b"GGUF")
        (tmp_path / "a.lora").write_bytes(b"")
        check_builds(inventory, host, transport)   # every file there: the check passes


# --- the flags a runtime's cached-tokens field needs (`prefix_cached.needs_flag`) ------------------

FLAG = "--enable-prompt-tokens-details"
VLLM_RESEND = REPO / "examples" / "vllm-resend.yaml"


def vllm_example(folder: Path, **edits: Any) -> Path:
    """examples/vllm.yaml adapted as a lab runner would: this python as vLLM's, a model folder of the test's."""
    model = folder / "tiny-llama"
    model.mkdir(parents=True, exist_ok=True)
    return adapt_example(REPO / "examples" / "vllm.yaml", folder, program=("/opt/vllm/bin/python", Path(sys.executable)),
                         model=("/srv/models/tiny-llama", model), **edits)


def missing_flag_line(inventory: Path, builds: str = "builds 'no-prefix-caching', 'prefix-caching' start") -> str:
    return (f"{inventory}: server.command: {builds} without {FLAG}, which scenario 'vllm-resend' (prefix_reuse: "
            f"measure) needs: without it vllm leaves usage.prompt_tokens_details.cached_tokens out of its responses, "
            f"which the profile reads as 0 cached tokens (absent: zero), so every cached token measured would read 0; "
            f"add it to server.command or the build's flags")


def test_a_vllm_build_started_without_prompt_tokens_details_is_refused(tmp_path: Path) -> None:
    path = vllm_example(tmp_path, drop=[FLAG])
    with pytest.raises(ConfigError, match=f"^{re.escape(missing_flag_line(path))}$"):
        check_flags(load_inventory(path), [load_scenario(VLLM_RESEND)])


@pytest.mark.parametrize("where", ["server.command", "the build's flags", "the scenario's server_flags"])
def test_the_flag_counts_wherever_the_resolved_command_line_gets_it(tmp_path: Path, where: str) -> None:
    """server.command, the build's flags and the scenario's server_flags make one command line."""
    scenario = load_scenario(VLLM_RESEND)
    edits: dict[str, Any] = {}
    if where == "server.command":
        edits = {"command_suffix": f" {FLAG}=true"}
    elif where == "the build's flags":
        edits = {"builds": {name: {"description": "with the flag", "flags": [FLAG]}
                            for name in ("no-prefix-caching", "prefix-caching")}}
    else:
        scenario = scenario.model_copy(update={"server_flags": (FLAG,)})
    inventory = load_inventory(vllm_example(tmp_path, drop=[FLAG], **edits))
    assert inventory.measurement.prefix_cached_flags == (FLAG,)   # checked, and found
    check_flags(inventory, [scenario])


def test_only_the_build_without_the_flag_is_named(tmp_path: Path) -> None:
    path = vllm_example(tmp_path, drop=[FLAG], builds={"no-prefix-caching": {
        "description": "the baseline, with the flag", "flags": ["--no-enable-prefix-caching", FLAG]}})
    line = missing_flag_line(path, "build 'prefix-caching' starts")
    with pytest.raises(ConfigError, match=f"^{re.escape(line)}$"):
        check_flags(load_inventory(path), [load_scenario(VLLM_RESEND)])


def test_runtimes_whose_field_needs_no_flag_are_not_checked(tmp_path: Path) -> None:
    """llama-server reports its cached tokens always, the simulated lab has no such field: nothing to refuse
    in the shipped examples, nor in examples/vllm.yaml as shipped (it has the flag)."""
    flare, llama = load_inventory(REPO / "hosts.yaml"), load_inventory(REPO / "examples" / "llama-cpp.yaml")
    assert flare.measurement.prefix_cached_flags == llama.measurement.prefix_cached_flags == ()
    check_flags(flare, [load_scenario(find_scenario("reread-1g"))])
    check_flags(llama, [load_scenario(REPO / "examples" / "llama-cpp-resend.yaml")])
    check_flags(load_inventory(vllm_example(tmp_path)), [load_scenario(VLLM_RESEND)])


@pytest.mark.slow
def test_the_real_preflight_names_the_build_and_the_flag_in_one_line(tmp_path: Path) -> None:
    """`pytest qualify --preflight-only` on examples/vllm.yaml without the flag: test_build_flags fails with
    the one line, before any server starts (no vLLM is needed to see it); the host checks pass."""
    path = vllm_example(tmp_path, drop=[FLAG])
    run = run_qualify(path, tmp_path / "reports", "--scenario", str(VLLM_RESEND), "--preflight-only",
                      "--junitxml", str(tmp_path / "junit.xml"))
    assert run.returncode == 6, run.output[-4000:]   # a failed preflight check: the lab's status
    assert sorted(failures(run)) == ["test_build_flags"], run.output[-4000:]
    # JUnit's message attribute is cut at a length (pytest adds "[truncated; full report in element
    # text]"), which a long inventory path passes: the whole line stands in the element's text
    report = failed(run, "test_build_flags").splitlines()
    # a lab error is reported as pytest reports an error: `failed on setup with "<the message>"`
    assert report[0].removeprefix('failed on setup with "').startswith(
        f"Failed: ConfigError: {path}: server.command: builds "), report[0]
    assert f"ConfigError: {missing_flag_line(path)}" in report, report


# --- the parameters of the runtime's cache emulator (`emulator:` of the profile) --------------------

LLAMA_EXAMPLE, LLAMA_RESEND = REPO / "examples" / "llama-cpp.yaml", REPO / "examples" / "llama-cpp-resend.yaml"
LLAMA_PROFILE = REPO / "fixtures" / "cache_qualify" / "config" / "runtimes" / "llama-cpp.yaml"


def llama_example(folder: Path, **edits: Any) -> Path:
    """examples/llama-cpp.yaml adapted as a lab runner would (no server starts in a preflight: this python
    stands for the binary, an empty file for the model)."""
    model = folder / "model.gguf"
    model.write_bytes(b"GGUF")
    return adapt_example(LLAMA_EXAMPLE, folder, program=("/opt/llama.cpp/build/bin/llama-server", Path(sys.executable)),
                         model=("/srv/models/model.gguf", model), **edits)


def preflight(inventory: Path, folder: Path, *args: str) -> Any:
    return run_qualify(inventory, folder / "reports", "--scenario", str(LLAMA_RESEND), "--preflight-only",
                       "--junitxml", str(folder / "junit.xml"), *args)


@pytest.mark.slow
def test_the_real_preflight_says_once_that_a_build_whose_parameter_nobody_states_is_not_predicted(
        tmp_path: Path) -> None:
    """A lab's own llama-server profile that reads --cache-ram from the flag alone (no default: a release whose
    default it does not know): a candidate started without the flag may be correct, so test_build_flags passes
    and records, in one line, that it is not predicted and the inventory field that would state it; the
    baseline, which gives it, is read after its start."""
    profile = tmp_path / "llama-lab.yaml"
    shipped = LLAMA_PROFILE.read_text(encoding="utf-8").replace("runtime: llama-cpp", "runtime: llama-lab")
    assert "{flag: --cache-ram, default: 8192}" in shipped
    profile.write_text(shipped.replace("{flag: --cache-ram, default: 8192}", "{flag: --cache-ram}"), encoding="utf-8")
    path = llama_example(tmp_path)
    path.write_text(path.read_text(encoding="utf-8").replace("runtime: llama-cpp", f"runtime: {profile}"),
                    encoding="utf-8")
    run = preflight(path, tmp_path, "--baseline", "no-ram-cache", "--candidate", "one-slot")
    assert run.returncode == 0, run.output[-4000:]
    case = run.testcases()["test_build_flags"]
    listed = [p.get("value") for p in case.iter("property") if p.get("name") == "emulator_not_predicted"]
    assert listed == ["build one-slot: not predicted: the llama-slot emulator's `cache_ram_mib` is stated by none "
                      "of its places (the flag -cram; the flag --cache-ram): declare it as "
                      "builds.one-slot.cache.cache_ram_mib in the inventory"], listed


@pytest.mark.slow
def test_the_real_preflight_lists_the_parameters_only_a_start_gives(tmp_path: Path) -> None:
    """The shipped llama-cpp profile on examples/llama-cpp.yaml: every flag-read parameter is given (the flag or
    llama.cpp's default), so test_build_flags passes and records, per build, what is read after the start."""
    run = preflight(llama_example(tmp_path), tmp_path)
    assert run.returncode == 0, run.output[-4000:]
    case = run.testcases()["test_build_flags"]
    listed = [p.get("value") for p in case.iter("property") if p.get("name") == "emulator_after_start"]
    later = ("read after the start: `n_ctx` from the start's log ('n_ctx_slot = (\\\\d+)'), `n_slots` from the "
             "start's log ('initializing, n_slots = (\\\\d+)'), `kv_unified` from the start's log (\"kv_unified = "
             "'(true|false)'\"), `n_ctx_total` from the start's log ('llama_context: n_ctx += *(\\\\d+)'), "
             "`state_bytes_per_token` from the start's log ('saving prompt with length "
             "(?P<per>\\\\d+), total state size = (?P<value>[\\\\d.]+) MiB')")
    assert listed == [f"build no-ram-cache: {later}", f"build ram-cache: {later}"], listed
