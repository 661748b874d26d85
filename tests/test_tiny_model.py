"""`python -m tests.support.tiny_model PATH`: the documented command that makes the llama example's model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf

from tests.support.labfixtures import REPO
from tests.support.tiny_model import N_VOCAB, make_tiny_model


def test_the_command_writes_the_seeded_model_where_the_example_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "srv" / "models" / "model.gguf"
    done = subprocess.run([sys.executable, "-m", "tests.support.tiny_model", str(path), "--seed", "3"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{path}: tiny llama model, seed 3, 32000 pieces, context 8192\n"
    reader = gguf.GGUFReader(path)
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == N_VOCAB
    assert path.read_bytes() == make_tiny_model(tmp_path, seed=3).path.read_bytes()   # the seed's file, byte for byte
