"""The real servers' builds made beside the tests (`tests.support.builds_ahead`): a test waits for the
session's build and fails, never skips, with its exit status and log when it failed; the scheduler
hands out the tests that need no running build first; every test file that starts a real server is
known to the build it needs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support import builds_ahead, llama_build, vllm_build
from tests.support.builds_ahead import LLAMA_SERVER, VLLM

REPO = Path(__file__).resolve().parents[1]


def test_a_build_that_fails_fails_the_waiting_test_with_its_exit_status_and_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(builds_ahead.FOLDER_ENV, str(tmp_path))
    monkeypatch.setenv(llama_build.BUILD_DIR_ENV, str(tmp_path / "cache"))
    # pip with no index and no configuration: the download fails at once, offline
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    process = builds_ahead.start(LLAMA_SERVER, tmp_path)
    with pytest.raises(pytest.fail.Exception,
                       match=r"(?s)llama-server build .* failed, exit status 1; its log .*No matching distribution"):
        builds_ahead.wait(LLAMA_SERVER.name)
    assert process.wait() == 1
    assert (tmp_path / "llama-server.log").read_text().splitlines()[-1].startswith("exit 1 after ")
    # the test did not build it again: one attempt's files in the cache, nothing built
    assert sorted(p.name for p in (tmp_path / "cache" / "llama-server").iterdir()) == ["0.3.36.lock", "0.3.36.log"]


def test_a_build_that_is_done_lets_the_test_go_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(builds_ahead.FOLDER_ENV, str(tmp_path))
    monkeypatch.setenv(vllm_build.DIR_ENV, str(tmp_path / "cache"))
    folder = vllm_build.install_dir()   # an install already made: the build finds it and ends
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").write_text("")
    (folder / "install.json").write_text(json.dumps(vllm_build._record(vllm_build.VERSION)))
    process = builds_ahead.start(VLLM, tmp_path)
    builds_ahead.wait(VLLM.name)
    assert process.poll() == 0   # waited for: it had ended
    assert (tmp_path / "vllm.exit").read_text() == "0\n"


def test_a_session_that_started_no_build_does_not_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(builds_ahead.FOLDER_ENV, str(tmp_path))
    builds_ahead.wait(VLLM.name)   # no lock in the folder: returns, the fixture builds as before
    assert list(tmp_path.iterdir()) == []


def test_the_scheduler_hands_out_what_needs_no_running_build_first() -> None:
    queue = {
        "vllm": ["tests/test_vllm_server.py::test_a@vllm"],
        "llama-qualify": ["tests/test_containers.py::test_b@llama-qualify"],
        "tests/test_llama_server.py::test_c": ["tests/test_llama_server.py::test_c"],
        "tests/test_decide.py::test_d@decide-run": ["tests/test_decide.py::test_d@decide-run"],
    }
    assert builds_ahead.first_ready(queue, [VLLM, LLAMA_SERVER]) == "tests/test_decide.py::test_d@decide-run"
    assert builds_ahead.first_ready(queue, [VLLM]) == "llama-qualify"
    assert builds_ahead.first_ready(queue, []) is None   # nothing runs: the queue's order stands
    assert builds_ahead.first_ready({"vllm": queue["vllm"]}, [VLLM]) is None   # only that left: it waits


def test_the_scheduler_hands_out_the_longest_units_first_unless_they_wait_for_a_build() -> None:
    """The longest units go first, so none of them is the run's tail; one that waits for a running build
    does not hold the others back."""
    readme = "tests/test_readme_commands.py::test_every_readme_command_runs_as_written"
    queue = {
        "tests/test_decide.py::test_d@decide-run": ["tests/test_decide.py::test_d@decide-run"],
        readme: [readme],
        "vllm": ["tests/test_vllm_server.py::test_a@vllm"],
    }
    assert builds_ahead.next_unit(queue, []) == "vllm"
    assert builds_ahead.next_unit(queue, [VLLM]) == readme     # vLLM's build still runs: the next longest
    assert builds_ahead.next_unit({k: v for k, v in queue.items() if k != readme}, [VLLM]) == (
        "tests/test_decide.py::test_d@decide-run")
    assert builds_ahead.next_unit({"tests/test_decide.py::test_d@decide-run": ["x"]}, []) is None   # as it stands


def test_every_test_file_that_starts_a_real_server_names_its_build() -> None:
    """A test file that reaches llama-server or vLLM must be known to its build, or the scheduler could
    hand it out while the build runs (a worker idle on the wait)."""
    uses = {LLAMA_SERVER: re.compile(r"\bllama_server_binary\b"),
            VLLM: re.compile(r"\bvllm_python\b|from tests\.support\.vllm_server import")}
    for build, use in uses.items():
        reaching = {f"tests/{path.name}" for path in REPO.glob("tests/test_*.py")
                    if path.name != "test_builds_ahead.py" and use.search(path.read_text(encoding="utf-8"))}
        assert reaching, build.name
        assert reaching <= set(build.files), (build.name, sorted(reaching - set(build.files)))
