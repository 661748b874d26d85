"""Workload primitives: corpora, excerpts, new starts, the RowCache study's sequence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

from cache_qualify.errors import CorpusError
from cache_qualify.workload.requests import Request, load_corpus, replace_start, study_sequence, token_range


def test_npy_and_json_token_files_keep_ids_in_range(tmp_path: Path) -> None:
    ids = [1, 3, 500, 127_999, 128_000, 7]
    np.save(tmp_path / "c.npy", np.array(ids, dtype=np.int64))
    (tmp_path / "c.json").write_text(json.dumps(ids))
    (tmp_path / "d.json").write_text(json.dumps({"tokens": ids}))
    for name in ("c.npy", "c.json", "d.json"):
        corpus = load_corpus(tmp_path / name)
        assert corpus.tolist() == [3, 500, 127_999, 7] and corpus.dtype == np.uint32
    assert load_corpus(tmp_path / "c.npy", id_range=(0, 10)).tolist() == [1, 3, 7]


@pytest.fixture()
def tokenizer_file(tmp_path: Path) -> Path:
    vocab = {w: i for i, w in enumerate(["[UNK]", "x", "y", "the", "cache", "row", "set"])}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_text_is_tokenized_with_a_tokenizer_json(tmp_path: Path, tokenizer_file: Path) -> None:
    (tmp_path / "c.txt").write_text("the row cache\nset the row unknown")
    corpus = load_corpus(tmp_path / "c.txt", tokenizer_path=tokenizer_file)
    assert corpus.tolist() == [3, 5, 4, 6, 3, 5]  # [UNK] (0) falls outside 3..127,999


@pytest.mark.parametrize(("name", "content", "message"), [
    ("bad.npy", b"not numpy", r"bad\.npy: not a readable \.npy token file"),
    ("bad.json", b"{", r"bad\.json: not valid JSON"),
    ("words.json", b'["a", "b"]', r"words\.json: expected a JSON list of integer token IDs"),
    ("text.txt", b"hello", r"text\.txt: a text corpus needs a tokenizer\.json"),
])
def test_unusable_files_say_why(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(CorpusError, match=message):
        load_corpus(tmp_path / name)


def test_more_unusable_corpora(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match=r"missing\.npy: corpus file not found"):
        load_corpus(tmp_path / "missing.npy")
    np.save(tmp_path / "two_d.npy", np.zeros((2, 3), dtype=np.int32))
    with pytest.raises(CorpusError, match=r"expected a 1-D integer array .* found shape \(2, 3\)"):
        load_corpus(tmp_path / "two_d.npy")
    np.save(tmp_path / "low.npy", np.array([0, 1, 2]))
    with pytest.raises(CorpusError, match=r"low\.npy: expected token IDs in 3\.\.127999, found 0\.\.2"):
        load_corpus(tmp_path / "low.npy")
    (tmp_path / "c.txt").write_text("x y")
    (tmp_path / "broken.json").write_text('{"model": 5}')
    with pytest.raises(CorpusError, match=r"broken\.json: tokenizer failed to load"):
        load_corpus(tmp_path / "c.txt", tokenizer_path=tmp_path / "broken.json")
    with pytest.raises(ValueError, match=r"`id_range` must be \(low, high\)"):
        load_corpus(tmp_path / "low.npy", id_range=(5, 2))


def test_excerpt_bounds() -> None:
    corpus = np.arange(100, dtype=np.uint32)
    part = token_range(corpus, 10, 20)
    assert part.tolist() == list(range(10, 20))
    part[0] = 0
    assert corpus[10] == 10  # a copy
    with pytest.raises(CorpusError, match=r"excerpt 90\.\.101 must lie within the corpus's 100 tokens"):
        token_range(corpus, 90, 101)
    with pytest.raises(CorpusError, match=r"excerpt 5\.\.5"):
        token_range(corpus, 5, 5)


def test_new_starts_are_deterministic_distinct_and_never_the_original() -> None:
    tokens = np.random.default_rng(0).integers(3, 128_000, 1000).astype(np.uint32)
    starts = [replace_start(tokens, v) for v in range(1, 6)]
    assert np.array_equal(starts[0], replace_start(tokens, 1))
    assert len({s[:16].tobytes() for s in starts}) == 5
    for s in starts:
        assert np.all(s[:16] != tokens[:16])
        assert np.array_equal(s[16:], tokens[16:])
        assert s.min() >= 3 and s.max() <= 127_999 and s.dtype == tokens.dtype
    assert not np.array_equal(replace_start(tokens, 1, seed=1), starts[0])


def test_a_start_never_equals_the_original_even_in_a_tiny_range() -> None:
    tokens = np.full(40, 3, dtype=np.uint32)
    for variant in range(20):
        assert np.all(replace_start(tokens, variant, id_range=(3, 4))[:16] == 4)
    with pytest.raises(CorpusError, match=r"`count` = 16 tokens, which must be between 1 and the prompt's 8"):
        replace_start(tokens[:8], 1)


def test_study_sequence() -> None:
    corpus = np.arange(130_000, dtype=np.uint32) + 3
    seq = study_sequence(corpus)
    assert [r.name for r in seq] == ["A", "A-new-start", "B", "B-new-start", "A-third-read"]
    assert [r.tokens.size for r in seq] == [20_000, 20_000, 60_000, 60_000, 20_000]
    assert seq[0].tokens[0] == 1_003 and seq[2].tokens[0] == 60_003
    assert np.array_equal(seq[1].tokens[16:], seq[0].tokens[16:])
    assert len({r.tokens[:16].tobytes() for r in (seq[0], seq[1], seq[4])}) == 3
    assert "20000 tokens" in repr(seq[0]) and isinstance(seq[0], Request)
    with pytest.raises(CorpusError, match=r"excerpt 60000\.\.120000 must lie within the corpus's 100000"):
        study_sequence(corpus[:100_000])
