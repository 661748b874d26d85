"""Engram row IDs and the compressed vocabulary."""

from __future__ import annotations

import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

from cache_qualify.sim.engram import COMPRESSED_VOCAB, EngramHasher, compress_vocabulary


@pytest.fixture(scope="module")
def hasher() -> EngramHasher:
    return EngramHasher()


def test_24_rows_per_token_per_table(hasher: EngramHasher) -> None:
    tokens = np.arange(100, 150)
    rows = hasher.row_ids(tokens, 0)
    assert rows.shape == (50, 24) and rows.dtype == np.uint64
    assert hasher.rows_per_token == 24


def test_heads_own_disjoint_ranges_above_the_head_size(hasher: EngramHasher) -> None:
    rows = hasher.row_ids(np.random.default_rng(0).integers(0, COMPRESSED_VOCAB, 5000), 1)
    lows, highs = rows.min(axis=0), rows.max(axis=0)
    assert np.all(highs[:-1] < lows[1:])  # head k's IDs all lie below head k+1's
    widths = np.diff(np.append(hasher._offsets[1], hasher._offsets[1][-1] + hasher._primes[1][-1]))
    assert np.all(widths > 16_000_000) and len(set(hasher._primes.ravel().tolist())) == 48


def test_an_ngram_has_the_same_rows_wherever_it_occurs(hasher: EngramHasher) -> None:
    tokens = np.array([9, 8, 1, 2, 3, 4, 7, 7, 1, 2, 3, 4, 5])
    rows = hasher.row_ids(tokens, 0)
    # positions 5 and 11 end the same 4-gram (1, 2, 3, 4): every order agrees
    assert np.array_equal(rows[5], rows[11])
    # positions 4 and 10 share the 3-gram and bigram, but not the 4-gram (8 vs 7 before it)
    assert np.array_equal(rows[4, :16], rows[10, :16])
    assert not np.array_equal(rows[4, 16:], rows[10, 16:])


def test_rows_depend_on_seed_and_table_but_are_deterministic() -> None:
    tokens = np.arange(20, 60)
    a = EngramHasher(seed=1).row_ids(tokens, 0)
    assert np.array_equal(a, EngramHasher(seed=1).row_ids(tokens, 0))
    assert not np.array_equal(a, EngramHasher(seed=2).row_ids(tokens, 0))
    assert not np.array_equal(a, EngramHasher(seed=1).row_ids(tokens, 1))


def test_the_start_is_padded(hasher: EngramHasher) -> None:
    single = hasher.row_ids(np.array([42]), 0)
    assert single.shape == (1, 24)
    assert np.array_equal(hasher.row_ids(np.array([42, 43]), 0)[0], single[0])
    assert hasher.row_ids(np.array([], dtype=np.int64), 0).shape == (0, 24)


def test_bad_input_is_named(hasher: EngramHasher) -> None:
    with pytest.raises(ValueError, match=r"`table` must be in 0\.\.1, found 2"):
        hasher.row_ids(np.arange(4), 2)
    with pytest.raises(ValueError, match=r"compressed token IDs must lie in 0\.\.99091, found 5\.\.99092"):
        hasher.row_ids(np.array([5, 99_092]), 0)
    with pytest.raises(ValueError, match=r"`orders` must be n-gram orders >= 1"):
        EngramHasher(orders=())


def test_fallback_compression_folds_ids() -> None:
    ids = np.array([3, 99_091, 99_092, 127_999])
    assert compress_vocabulary(ids).tolist() == [3, 99_091, 0, 28_907]


def test_tokenizer_compression_merges_spellings() -> None:
    vocab = {"[UNK]": 0, "Hello": 1, "hello": 2, "HÉLLO": 3, "world": 4, "  world": 5}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    compressed = compress_vocabulary(np.array([1, 2, 3, 4, 5, 0]), tok)
    assert compressed[0] == compressed[1] == compressed[2]  # case and accents fold
    assert compressed[3] == compressed[4] != compressed[0]  # whitespace collapses
    assert compressed.tolist() == [1, 1, 1, 2, 2, 0]  # numbered by first appearance
    with pytest.raises(ValueError, match=r"token IDs must lie in 0\.\.5"):
        compress_vocabulary(np.array([6]), tok)
