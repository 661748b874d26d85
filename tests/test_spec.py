"""`qualify/` reads as a specification: test functions and what they assert, with the machinery in the
plugin; the tests are named by the runtime's profile, and `-k` selects assertions as it selects tests."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.labfaults import PREFLIGHT_CHECKS
from tests.support.labfixtures import REPO, run_qualify, write_inventory

QUALIFY = REPO / "qualify"
# what a qualification test may read: the checks, the run's results, the preflight's checks and types
ALLOWED_IMPORTS = ("cache_qualify.gate", "cache_qualify.qualification", "cache_qualify.lab.preflight",
                   "cache_qualify.lab.transport", "cache_qualify.config.inventory", "cache_qualify.errors",
                   "cache_qualify.session.state", "cache_qualify.emulation.readable")


def test_the_qualification_folder_holds_only_test_functions_that_say_what_they_assert() -> None:
    """No conftest, no hook, no fixture, no helper: each module's top level is imports, its markers and
    test functions, each with a docstring; nothing reaches past the gate's checks into the machinery."""
    assert not (QUALIFY / "conftest.py").exists()
    problems = []
    for path in sorted(QUALIFY.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            where = f"{path.name}:{node.lineno}"
            if isinstance(node, ast.FunctionDef):
                if not node.name.startswith("test_"):
                    problems.append(f"{where}: {node.name} is not a test")
                elif not ast.get_docstring(node):
                    problems.append(f"{where}: {node.name} does not say what it asserts")
                elif any("fixture" in ast.unparse(d) for d in node.decorator_list):
                    problems.append(f"{where}: {node.name} is a fixture")
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                for name in (f"{module}.{a.name}" for a in node.names if module.startswith("cache_qualify")):
                    if not name.startswith(tuple(f"{m}." for m in ALLOWED_IMPORTS)) and name not in ALLOWED_IMPORTS:
                        problems.append(f"{where}: imports {name}")
            elif isinstance(node, ast.Assign):
                if [ast.unparse(t) for t in node.targets] != ["pytestmark"]:
                    problems.append(f"{where}: {ast.unparse(node)[:60]}")
            elif not isinstance(node, ast.Import | ast.Expr):
                problems.append(f"{where}: {ast.unparse(node)[:60]}")
    assert problems == []


def collected(*args: str, cwd: Path = REPO) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "qualify", "--collect-only", "-q",
                           *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line]


@pytest.mark.slow
def test_a_prompt_cache_run_reads_as_prompt_cache_tests(tmp_path: Path) -> None:
    """llama-server's profile names its cache: the verdict tests are `test_prompt_cache[...]`; a scenario
    that measures prefix reuse has no `test_no_prefix_cache_reuse`, its voided-trial check is named for
    what it checks there (no counter reset). The row cache's run keeps its names."""
    names = collected("--hosts", "examples/llama-cpp.yaml", "--scenario", "examples/llama-cpp-resend.yaml",
                      "--reports-dir", str(tmp_path / "reports"))
    cache = [n for n in names if n.startswith("test_prompt_cache[")]
    assert cache == ["test_prompt_cache[hit_rate-gain[A-again]]", "test_prompt_cache[hit_rate-gain[B-again]]",
                     "test_prompt_cache[prompt_time-gain[A-again]]", "test_prompt_cache[prompt_time-gain[B-again]]"]
    assert "test_no_counter_reset[llama-cpp-resend]" in names
    assert "test_kv_pages[kv_pages-no_regression[startup]]" in names
    assert not [n for n in names if "row_cache" in n or "prefix_cache_reuse" in n], names
    flare = collected("--hosts", "hosts.yaml", "--reports-dir", str(tmp_path / "reports"))
    assert "test_row_cache[hit_rate-gain[B-new-start]]" in flare and "test_no_prefix_cache_reuse[reread-1g]" in flare
    assert not [n for n in flare if "counter_reset" in n], flare


def test_k_without_a_verdict_test_decides_nothing_and_every_file_agrees(tmp_path: Path) -> None:
    """`-k test_all_ranks_started` selects no verdict test: the run checks its starts at the first look
    (no assertion keeps it going), decides nothing, says so in one line, and JUnit, verdicts.json,
    summary.md and the terminal hold no verdict; it is undecided (exit status 1), never a pass."""
    run = run_qualify(write_inventory(tmp_path), tmp_path / "reports", "-k", "test_all_ranks_started")
    assert run.returncode == 1, run.output
    said = "[cache-qualify] reread-1g: no verdict test selected; its starts are checked at one look, no assertion is decided"
    assert run.output.count(said) == 1, run.output
    assert [n for n in run.testcases() if not n.startswith(PREFLIGHT_CHECKS)] == ["test_all_ranks_started[reread-1g]"]
    assert json.loads((run.run_dir() / "verdicts-reread-1g.json").read_text()) == []
    trials = (run.run_dir() / "trials.csv").read_text().splitlines()[1:]
    assert len(trials) == 2 * 4, trials   # one look: the scenario's 4 trials per build, not its maximum of 12
    summary = (run.run_dir() / "summary.md").read_text()
    assert ("**Undecided**: no assertion was selected (-k, --lf), so none was decided: the run checked its starts "
            "only; rerun without `-k` (or with a verdict test's name) to decide them.") in summary
    assert "0 / 0 / 0" in summary and "p adj" not in run.output
    assert "reread-1g: no verdict  no assertion was selected (-k, --lf)" in run.output


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["one-process", "xdist"])
def test_k_selects_assertions_and_junit_summary_and_verdicts_agree(tmp_path: Path, xdist: tuple[str, ...]) -> None:
    """`-k "row_cache and B-new-start"` decides those two assertions only: the run says so in one line,
    and JUnit, verdicts.json and summary.md hold the same two verdicts (the others are not decided)."""
    chosen = ["hit_rate-gain[B-new-start]", "readiness_wait-gain[B-new-start]"]
    run = run_qualify(write_inventory(tmp_path), tmp_path / "reports", "-k", "row_cache and B-new-start", *xdist)
    assert run.returncode == 0, run.output
    line = f"[cache-qualify] reread-1g: 2 assertion(s) selected ({', '.join(chosen)}); only these are decided"
    assert run.output.count(line) == 1, run.output
    # under xdist a case's name carries its scenario's group (`...]@reread-1g]`), as every qualification's does
    # (and the preflight, which runs under -k as without it)
    assert sorted(re.sub(r"@[^@\]]*\]$", "", name) for name in run.testcases()
                  if not name.startswith(PREFLIGHT_CHECKS)) == [f"test_row_cache[{i}]" for i in chosen]
    verdicts = json.loads((run.run_dir() / "verdicts-reread-1g.json").read_text())
    assert sorted(v["id"] for v in verdicts) == chosen
    summary = (run.run_dir() / "summary.md").read_text()
    listed = [line.split("`")[1] for line in summary.splitlines() if line.startswith("| `") and "-" in line
              and "[" in line.split("`")[1]]
    assert sorted(listed) == chosen, summary
    assert "2 / 0 / 0" in summary
    assert ("**May merge** `two_choice` as far as the selected assertions go: each passed; 7 assertion(s) were "
            "not selected (-k, --lf) and not decided (exit status 0).") in summary
