"""A pytest plugin loaded into a run under test (`-p tests.support.countparses`): counts how often the run's end
parses a run folder's trials.csv, and how often the run reads its predictions file before its end (the
qualification and its tests), and writes the counts to the files `CQ_TEST_PARSES` and
`CQ_TEST_PREDICTION_READS` name."""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pandas as pd
import pytest

import cache_qualify.samples.runfolder as runfolder
import cache_qualify.samples.store as store
from cache_qualify.samples.records import PredictionRecord
from cache_qualify.samples.runfolder import TRIALS_FILE

PARSES_ENV = "CQ_TEST_PARSES"
PREDICTION_READS_ENV = "CQ_TEST_PREDICTION_READS"
_read: list[Path] = []
_real_read = runfolder.read_predictions


def _counted_read(run_dir: Path) -> dict[str, tuple[PredictionRecord, ...]]:
    _read.append(run_dir)
    return _real_read(run_dir)


def pytest_configure(config: pytest.Config) -> None:
    runfolder.read_predictions = _counted_read   # the recorder and the gate look it up on the module


def pytest_unconfigure(config: pytest.Config) -> None:
    runfolder.read_predictions = _real_read


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, None, None]:
    Path(os.environ[PREDICTION_READS_ENV]).write_text(str(len(_read)), encoding="utf-8")
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
