"""`cache_qualify.files`: a file written whole is as readable as one pytest writes (junit.xml)."""

from __future__ import annotations

import stat
from pathlib import Path

from cache_qualify.files import write_whole


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_file_written_whole_has_the_mode_of_an_ordinary_file(tmp_path: Path) -> None:
    ordinary = tmp_path / "junit.xml"
    ordinary.write_text("<testsuites/>", encoding="utf-8")   # as pytest writes its JUnit file
    write_whole(tmp_path / "summary.md", "# run\n")
    write_whole(tmp_path / "plan.json", b"{}", durable=True)
    assert mode(tmp_path / "summary.md") == mode(tmp_path / "plan.json") == mode(ordinary)
    assert mode(ordinary) & stat.S_IRGRP and mode(ordinary) & stat.S_IROTH   # under the usual umask 022
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
