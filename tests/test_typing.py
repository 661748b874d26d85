"""The type hints are checked, not decoration: mypy --strict over the suite's code."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.labfixtures import REPO


@pytest.mark.slow
def test_mypy_strict_passes_on_the_library_and_qualify() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", "--strict", "fixtures/cache_qualify", "qualify"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
