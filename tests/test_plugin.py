"""The pytest plugin: options, usage errors, preflight, and living beside pytest-testinfra."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.labfixtures import REPO, run_cli, run_qualify, write_inventory


def pytest_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_testinfra_is_installed_here() -> None:
    """The coexistence tests below mean something only with testinfra loaded."""
    help_text = pytest_cli("--help").stdout
    assert "--ssh-identity-file" in help_text  # a testinfra option
    assert "--inventory=HOSTS_YAML" in help_text


@pytest.mark.slow
@pytest.mark.parametrize("testinfra", ["loaded", "blocked"])
def test_hosts_option_works_with_and_without_testinfra(tmp_path: Path, testinfra: str) -> None:
    """testinfra defines its own --hosts; the plugin reuses it, or defines it when testinfra is off."""
    inventory = write_inventory(tmp_path)
    extra = ("-p", "no:pytest11.testinfra") if testinfra == "blocked" else ()
    run = run_qualify(inventory, tmp_path / "reports", "--preflight-only", *extra)
    assert run.returncode == 0, run.output
    assert "17 passed" in run.output
    # a check of the lab is no run: no folder kept, nothing to continue
    assert run.run_folders() == [] and "--resume" not in run.output, run.output
    assert run.tail() == ["preflight only: every check passed; no run folder kept"], run.output
    if testinfra == "blocked":
        assert "--ssh-identity-file" not in pytest_cli("--help", *extra).stdout


@pytest.mark.slow
def test_inventory_alias(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path)
    proc = pytest_cli("qualify", "--inventory", str(inventory), "--reports-dir", str(tmp_path / "r"),
                      "--preflight-only", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "17 passed" in proc.stdout


@pytest.mark.slow
def test_malformed_inventory_is_a_usage_error_naming_file_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "hosts.yaml"
    bad.write_text((REPO / "hosts.yaml").read_text().replace("rank: 2", "rank: two"))
    proc = pytest_cli("qualify", "--hosts", str(bad), "--reports-dir", str(tmp_path / "r"))
    assert proc.returncode == 4
    assert f"{bad}:" in proc.stderr and "hosts[2].rank" in proc.stderr and "expected" in proc.stderr


@pytest.mark.slow
def test_unknown_candidate_lists_the_builds(tmp_path: Path) -> None:
    proc = pytest_cli("qualify", "--hosts", "hosts.yaml", "--candidate", "set5", "--reports-dir", str(tmp_path))
    assert proc.returncode == 4
    # the inventory has set4 and set8, as close to set5 as each other: either is a fair suggestion
    assert re.search(r"unknown build 'set5' \(did you mean 'set[48]'\?\); known builds: ", proc.stderr), proc.stderr
    assert "two_choice" in proc.stderr


@pytest.mark.slow
def test_unknown_scenario_lists_the_scenarios(tmp_path: Path) -> None:
    proc = pytest_cli("qualify", "--hosts", "hosts.yaml", "--scenario", "reread-2g", "--reports-dir", str(tmp_path))
    assert proc.returncode == 4
    assert ("unknown scenario 'reread-2g' (did you mean 'reread-4g'?); available: long-prompt, reread-1g, "
            "reread-4g, trace-replay") in proc.stderr


@pytest.mark.slow
def test_a_run_without_pytest_s_junit_plugin_is_refused_in_one_line(tmp_path: Path) -> None:
    """`-p no:junitxml` takes away the record_property every verdict test writes its figures with: one usage
    line (exit 4) before any lab time and no run folder, not nine fixture errors after a whole run."""
    proc = pytest_cli("qualify", "--hosts", "hosts.yaml", "-p", "no:junitxml", "--reports-dir", str(tmp_path / "r"))
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert proc.stderr.strip() == ("ERROR: -p no:junitxml: a qualification writes its verdicts into JUnit "
                                   "(record_property); leave pytest's junitxml plugin on (--junitxml=PATH puts "
                                   "the file elsewhere)")
    assert not (tmp_path / "r").exists()


def test_resume_of_an_unknown_run_is_a_usage_error(tmp_path: Path) -> None:
    proc = pytest_cli("qualify", "--hosts", "hosts.yaml", "--resume", "no-such-run", "--reports-dir", str(tmp_path))
    assert proc.returncode == 4
    assert "--resume:" in proc.stderr and "plan.json does not exist" in proc.stderr


@pytest.mark.slow
def test_preflight_names_the_host_whose_drop_needs_a_password(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path, server={
        "drop_caches": "echo 'sudo: a password is required' >&2; exit 1"})
    run = run_qualify(inventory, tmp_path / "reports", "--preflight-only")
    assert run.returncode == 6   # the lab's: not a verdict
    assert "test_drop_caches[gb10-a]" in run.output
    assert "host gb10-a: the page-cache drop command failed with status 1: sudo: a password is required" \
        in run.output
    assert "NOPASSWD" in run.output


@pytest.mark.slow
def test_preflight_names_a_missing_build(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path, builds={"ghost": {"path": "/nonexistent/flare-server", "flags": []}},
                                candidate="ghost")
    run = run_qualify(inventory, tmp_path / "reports", "--preflight-only")
    assert run.returncode == 6   # a build the hosts lack is the lab's to stage
    assert "build executable not found: build 'ghost': /nonexistent/flare-server" in run.output


@pytest.mark.slow
def test_plugin_loads_without_xdist(tmp_path: Path) -> None:
    """The xdist hooks are optional: `-p no:xdist` (or no xdist installed) still qualifies."""
    inventory = write_inventory(tmp_path)
    run = run_qualify(inventory, tmp_path / "reports", "--preflight-only", "-p", "no:xdist")
    assert run.returncode == 0, run.output
    assert "17 passed" in run.output


HEAVY = ("numpy", "pandas", "scipy", "matplotlib")


def test_importing_the_plugin_loads_no_numpy_pandas_scipy_or_matplotlib() -> None:
    """Every pytest process on a machine with cache-qualify installed loads the plugin: its import must
    not pull in the statistics (166 ms of numpy alone); they load when a qualification runs."""
    probe = ("import cache_qualify.plugin, sys; "
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in {set(HEAVY)!r}))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=True)
    assert proc.stdout.strip() == "[]", proc.stdout[:500]


def test_the_test_option_offers_every_registered_method() -> None:
    """`--test`'s choices are the names the plugin knows without importing the methods: each is the name its
    module registers, and the registry holds no other."""
    from cache_qualify.methods import DEFAULT, METHODS, NAMES

    assert [m.name for m in METHODS.values()] == list(NAMES) and DEFAULT in NAMES
    help_text = pytest_cli("--help").stdout
    assert re.search(r"--test=\{" + ",".join(NAMES) + r"\}", help_text), help_text


def test_the_plugin_import_benchmark_prints_its_cost_against_pytest() -> None:
    proc = run_cli("bench-plugin-import", "--repeat", "1", timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"bench-plugin-import: `import cache_qualify.plugin` \d+ ms, `import pytest` \d+ ms "
                        r"\(median of 1 fresh interpreters each, alternated\): ratio \d+\.\d\d, "
                        r"the plugin's own [+-]\d+ ms\n", proc.stdout), proc.stdout
