"""The layer contract (pyproject's [tool.importlinter]) holds: data flows one way and the gate never imports sim."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.labfixtures import REPO


def test_import_contracts_are_kept() -> None:
    # beside this interpreter: the environment the test extra was installed into
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.is_file(), f"{lint_imports} is missing: install the test extra (import-linter)"
    proc = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BROKEN" not in proc.stdout and proc.stdout.count("KEPT") == 2, proc.stdout
