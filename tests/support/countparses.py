"""A pytest plugin loaded into a run under test (`-p tests.support.countparses`): counts how often the run's end
parses a run folder's trials.csv and writes the count to the file `CQ_TEST_PARSES` names."""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pandas as pd
import pytest

import cache_qualify.samples.store as store
from cache_qualify.samples.runfolder import TRIALS_FILE

PARSES_ENV = "CQ_TEST_PARSES"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, None, None]:
    parsed: list[Path] = []
    real = store._parse

    def counted(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
        if path.name == TRIALS_FILE:
            parsed.append(path)
        return real(path, columns)

    store._parse = counted   # every reader of the end (outcome, report, history, terminal) goes through it
    try:
        yield
    finally:
        store._parse = real
        Path(os.environ[PARSES_ENV]).write_text(str(len(parsed)), encoding="utf-8")
