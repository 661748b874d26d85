"""Every shell command README.md shows runs, as a newcomer types it, in a clean copy of this checkout on the
simulated lab, and says what the README says beside it (its exit status, and the words of its claim).

The commands run in order in one copy, so the runs of the first commands are the folders the later ones
read (`report`, `plan --samples`, `decide`, `history ...`, `--resume`). What stands in for the newcomer's
machine, and only that: the quick start's `pip install -e .` finds the suite's own third-party packages
(linked, no download: `tests.support.installed`) and gets pytest's console script; the reader's real lab
(`lab.yaml`) is the simulated lab's inventory; a placeholder (`<run-id>`, `RUN_DIR`, `FILE`, `[pytest
options]`) is filled in. A command that needs what this test has not (a real llama-server or vLLM and its
model, two host groups) is listed in `ELSEWHERE` with the reason and the test that runs it, which must name
it: none is dropped silently (`test_every_readme_command_is_run_here_or_elsewhere`).

It is slow: ten qualifications of the simulated lab, two emulated plans and the benchmarks: 678 s in the
last clean-clone run on two cores. `plan --history` is its costliest command on a cold cache (the history
holds set8, whose history design is hundreds of starts: about 6 minutes at a load of 2 to 4).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.installed import link_dependencies
from tests.support.labfixtures import REPO
from tests.support.readme import commands

README = (REPO / "README.md").read_text(encoding="utf-8")
QUICK_START = "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && pytest qualify --hosts hosts.yaml"
DEFAULT_RUN = "pytest qualify --hosts hosts.yaml"
SEVERAL = "pytest qualify --hosts hosts.yaml --candidate set8,set16,two_choice,lru4"


@dataclass(frozen=True)
class Step:
    """One README command as this test runs it: the exit statuses the README allows and a pattern its
    output must hold (the claim beside it); `run_of` is the command whose run folder `<run-id>` is."""

    command: str
    exits: tuple[int, ...] = (0,)
    says: str = ""
    run_of: str = DEFAULT_RUN
    typed: str = ""                 # the command with its placeholder filled in ("": as shown)


@dataclass(frozen=True)
class Elsewhere:
    """A README command this test does not run: what it needs, and the test that runs it (which names it)."""

    needs: str
    test: str
    names: str


ELSEWHERE = {
    "pytest qualify --hosts lab.yaml --parallel-arms": Elsewhere(
        "a lab of two equal host groups (the simulated lab's crossover runs about 3 minutes per arm order)",
        "tests/test_parallel_arms.py", "--parallel-arms"),
    "pytest qualify --hosts examples/llama-cpp.yaml --scenario examples/llama-cpp-resend.yaml": Elsewhere(
        "a real llama-server build and a model at the example's paths", "tests/test_llama_qualify.py",
        "llama-cpp-resend.yaml"),
    "python -m tests.support.vllm_build": Elsewhere(
        "a vLLM build (minutes; the suite's tests build it once into their cache)", "tests/test_vllm_qualify.py",
        "vllm_build"),
    "pytest qualify --hosts examples/vllm.yaml --scenario examples/vllm-resend.yaml": Elsewhere(
        "a real vLLM and its model at the example's paths", "tests/test_vllm_qualify.py", "vllm-resend.yaml"),
    "pytest qualify --hosts examples/vllm.yaml --scenario examples/vllm-trace.yaml": Elsewhere(
        "a real vLLM and its model at the example's paths", "tests/test_vllm_qualify.py", "vllm-trace.yaml"),
    "pytest qualify --hosts examples/llama-cpp.yaml --scenario examples/llama-cpp-trace.yaml --baseline "
    "small-ram-cache --candidate ram-cache": Elsewhere(
        "a real llama-server build and a model at the example's paths", "tests/test_llama_qualify.py",
        "llama-cpp-trace.yaml"),
}

STEPS = (
    Step(QUICK_START, says=r"reports/\S+"),
    Step("pytest qualify --hosts hosts.yaml --candidate lru4", (1,), r"hit_rate-gain\[A-third-read\]"),
    Step("pytest qualify --hosts hosts.yaml --candidate set4", (1,), r"gain"),
    Step("pytest qualify --hosts hosts.yaml --candidate set4-fat-cache", (1,), r"kv_pages"),
    Step("pytest qualify --hosts hosts.yaml --candidate rank1-exits", (1,), r"rank 1[\s\S]*exit"),
    Step("cache-qualify noise", typed="cache-qualify noise --help"),              # named in a sentence
    # the README: it exits 1 when a check is off by more than a factor of two; the readiness waits' spread is
    # wall time, which a loaded machine widens (2.2 x the study's at a load of 4), so either status, checks said
    Step("cache-qualify noise --starts 8 --seed 7", (0, 1), r"checks \(the model against the study"),
    Step("cache-qualify noise --build set4-default-reserve --starts 8", (0, 1),
         r"checks \(the model against the study"),
    Step(SEVERAL, (1,), r"lru4"),   # gate mode: exits 0 only when every candidate passes, and lru4 fails
    Step("cache-qualify decide reports/<run-id> --baseline set8 --candidate two_choice [--json FILE]", (0, 1),
         r"two_choice", SEVERAL,
         "cache-qualify decide reports/<run-id> --baseline set8 --candidate two_choice --json decided.json"),
    Step("cache-qualify emulate --policy set4,set8,set16,two_choice,lru4 --cache-size 1G", says=r"two_choice"),
    Step("cache-qualify bench-emulator", says=r"M/s|/s"),
    Step("pytest qualify --hosts hosts.yaml --scenario trace-replay", (0, 1), r"trace-replay"),
    Step("cache-qualify history import reports/*"),
    Step("cache-qualify history runs --json", says=r"^\s*\["),
    Step("cache-qualify history trend --build set4 --metric hit_rate --request B-new-start", says=r"B-new-start"),
    Step("cache-qualify history changes --build set4", says=r"series"),
    Step("cache-qualify history html reports/history", says=r"index\.html"),
    # calibrated on the quick start's baseline: the later runs' correct candidates still pass their predictions
    Step("cache-qualify history calibrate reports/<run-id>", says=r"calibrated on build set4 of run"),
    Step("cache-qualify plan --history sqlite:///reports/history.sqlite --scenario reread-1g --hosts hosts.yaml"),
    Step("pytest qualify --hosts hosts.yaml --history-noise", (0, 1)),
    Step("cache-qualify plan --samples reports/<run-id>", says=r"trials per build"),
    Step("cache-qualify plan --emulate --baseline set4 --candidate two_choice --alpha 0.01"),
    Step("cache-qualify plan --min-effect 0.02 --sd 0.004 --alpha 0.01 --family-size 4 --runtime flare"),
    Step("cache-qualify plan --predict --hosts examples/vllm.yaml --scenario examples/vllm-resend.yaml "
         "--candidate prefix-caching-32"),
    Step("pytest qualify --hosts hosts.yaml --seed 7"),
    Step("cache-qualify report", typed="cache-qualify report --help"),            # named in a sentence
    Step("cache-qualify report reports/<run-id>"),
    # the reader's lab.yaml: the simulated lab's inventory; a check of the lab alone keeps no run folder
    Step("pytest qualify --hosts lab.yaml --preflight-only"),
    Step("cache-qualify schema", says=r"^\s*\{"),
    # from a folder holding only an inventory, as a CI job runs it; the options: collecting only
    Step("cache-qualify run --hosts hosts.yaml [pytest options]",
         typed="cd lab && cache-qualify run --hosts hosts.yaml --collect-only -q"),
    Step("cache-qualify schema --scenario", says=r"^\s*\{"),
    Step("cache-qualify plan", typed="cache-qualify plan --help"),                # named in a sentence
    Step("cache-qualify plan --emulate --baseline set4 --candidate set8,set16,two_choice"),
    Step("cache-qualify plan --samples RUN_DIR", typed="cache-qualify plan --samples reports/<run-id>"),
    # validate's tables default to 2,000 simulated qualifications a cell: here the same tables from 100 a
    # cell (the command's code path whole, its figures coarser), a stand-in for the time, listed as one
    Step("cache-qualify validate --check history", typed="cache-qualify validate --check history --runs 100"),
    Step("pytest qualify --hosts hosts.yaml --resume <run-id>", (0,)),
    Step("cache-qualify bench-prefix-emulator"),
    # named in a table: a tenth of its 20 M-row trace timed once (the whole took 36 s of this test's 11 minutes)
    Step("cache-qualify bench-trace", typed="cache-qualify bench-trace --lookups 2000000 --repeat 1",
         says=r"set4\s+4096"),
    Step("cache-qualify bench-harness"),
    # named in a table: its four default tables at one alpha from 20 a cell (tests/test_validation.py
    # holds their figures; at 100 a cell and both alphas it took 128 s, its design searches and bounds)
    Step("cache-qualify validate", typed="cache-qualify validate --runs 20 --alpha 0.05", says=r"known-SD bound"),
    Step("cache-qualify bench-lifecycle"),
    Step("cache-qualify bench-plugin-import"),
)


def test_every_readme_command_is_run_here_or_elsewhere() -> None:
    shown = set(commands(README)) - {DEFAULT_RUN}   # the quick start's last command, run there
    covered = {step.command for step in STEPS} | set(ELSEWHERE)
    assert not shown - covered, f"README commands neither run here nor listed in ELSEWHERE: {shown - covered}"
    assert not covered - shown - {QUICK_START}, f"no longer in README.md: {covered - shown}"
    for command, where in ELSEWHERE.items():
        assert where.names in command and where.names in (REPO / where.test).read_text(encoding="utf-8"), \
            f"{where.test} does not run `{command}`"


def _clean_copy(folder: Path) -> Path:
    """The checkout's files as a fresh clone has them (tracked, or new and not ignored), nothing built."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    copy = folder / "cache-qualify"
    for name in filter(None, listed):
        if (REPO / name).is_symlink():   # as git keeps it (the package's `qualify` is a link to the tests)
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).symlink_to(os.readlink(REPO / name))
        elif (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    return copy


def _newcomer_env() -> dict[str, str]:
    """The environment as a newcomer's shell has it: none of the suite's virtual environment, no package
    index (the dependencies are linked), no build isolation (its setuptools would come from an index)."""
    keep = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    own_bin = str(Path(sys.prefix) / "bin")
    path = os.pathsep.join(p for p in keep.get("PATH", "").split(os.pathsep) if p != own_bin)
    return {**keep, "PATH": path, "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _run(shell: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The command's exit status and output; one still running after 25 minutes is stopped with everything
    it started (exit 124, as `timeout` says it), and the next command runs."""
    with subprocess.Popen(["bash", "-c", f"set -e; {shell}"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=1500)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)   # Ctrl-C: a qualification stops its servers and keeps its samples
            out, err = proc.communicate(timeout=120)
            return subprocess.CompletedProcess(proc.args, 124, out, err + "\nstill running after 1500 s")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _runs(reports: Path) -> set[str]:
    return {p.name for p in reports.iterdir() if p.is_dir() and (p / "plan.json").is_file()} \
        if reports.is_dir() else set()


@pytest.mark.slow
def test_every_readme_command_runs_as_written(tmp_path: Path) -> None:
    copy, env = _clean_copy(tmp_path), _newcomer_env()
    # the quick start's first command as typed; then its `pip install -e .` finds the dependencies linked
    venv = _run("python3 -m venv .venv", copy, env)
    assert venv.returncode == 0, venv.stderr
    link_dependencies(copy / ".venv", tmp_path / "dependencies")
    shim = copy / ".venv" / "bin" / "pytest"   # the console script pip writes when it installs pytest
    shim.write_text(f"#!{copy / '.venv' / 'bin' / 'python'}\nimport sys, pytest\nsys.exit(pytest.console_main())\n")
    shim.chmod(0o755)
    shutil.copy(copy / "hosts.yaml", copy / "lab.yaml")   # the reader's real lab: the simulated one
    (copy / "lab").mkdir()
    shutil.copy(copy / "hosts.yaml", copy / "lab" / "hosts.yaml")
    reports, failed = copy / "reports", []
    run_of: dict[str, str] = {}   # each qualification's command: its run folder
    for step in STEPS:
        before, rows = _runs(reports), _trial_rows(reports, run_of.get(step.run_of))
        typed = (step.typed or step.command).replace("<run-id>", run_of.get(step.run_of, "none"))
        if step.command == QUICK_START:   # its virtual environment is made above, and activated here
            typed = typed.split(" && . .venv/bin/activate && ", 1)[1]
        if step.command.startswith("cache-qualify report reports/"):   # the plots it says it draws again
            shutil.rmtree(reports / run_of[DEFAULT_RUN] / "plots", ignore_errors=True)
        done = _run(f". .venv/bin/activate && {typed}", copy, env)
        out = done.stdout + done.stderr
        made = sorted(_runs(reports) - before)
        if made:
            run_of[DEFAULT_RUN if step.command == QUICK_START else step.command] = made[-1]
        why = []
        if done.returncode not in step.exits:
            why.append(f"exit {done.returncode}, the README says {step.exits}")
        if step.says and not re.search(step.says, out, re.M):
            why.append(f"no /{step.says}/ in its output")
        why += _claims(step, copy, made, run_of)
        if "--resume" in step.command and _trial_rows(reports, run_of.get(step.run_of)) != rows:
            why.append(f"trials.csv went from {rows} rows to {_trial_rows(reports, run_of.get(step.run_of))}")
        if why:
            failed.append(f"`{step.command}`: {'; '.join(why)}\n{out[-1500:]}")
    assert not failed, "\n\n".join(failed)


def _claims(step: Step, copy: Path, made: list[str], run_of: dict[str, str]) -> list[str]:
    """What the README says beside a command that its exit status and words do not show."""
    reports = copy / "reports"
    if step.command == QUICK_START:
        return [] if made and (reports / made[-1] / "summary.md").is_file() else ["no summary.md in a run folder"]
    if "--preflight-only" in step.command or "--collect-only" in step.typed:
        return [f"left run folder(s) {made}"] if made else []
    if step.command.startswith("cache-qualify decide"):
        return [] if (copy / "decided.json").is_file() else ["no --json file written"]
    if step.command.startswith("cache-qualify history html"):
        return [] if (reports / "history" / "index.html").is_file() else ["no reports/history/index.html"]
    if "--resume" in step.command:
        return [f"a new run folder {made}"] if made else []
    if step.command.startswith("cache-qualify report reports/"):
        return [] if list((reports / run_of[DEFAULT_RUN]).glob("plots/*.png")) else ["no plots drawn again"]
    return []


def _trial_rows(reports: Path, run: str | None) -> int:
    if run is None or not (reports / run / "trials.csv").is_file():
        return 0
    with (reports / run / "trials.csv").open(encoding="utf-8") as f:
        return sum(1 for _ in csv.DictReader(f))
