"""The shipped default corpus: real text, the RowCache study's regime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cache_qualify.workload.data

from cache_qualify.sim.capacity import capacity_rows
from cache_qualify.units import parse_size
from cache_qualify.workload.corpus import default_corpus
from cache_qualify.sim.emulate import sequence_gathers
from cache_qualify.workload.requests import study_sequence


def test_shape_range_and_cache() -> None:
    corpus = default_corpus()
    assert corpus.dtype == np.uint32 and corpus.ndim == 1
    assert corpus.size >= 130_000
    assert corpus.min() >= 3 and corpus.max() <= 127_999
    assert default_corpus() is corpus
    assert not corpus.flags.writeable


def test_shipped_data_is_small() -> None:
    data = Path(cache_qualify.workload.data.__file__).parent
    total = sum(f.stat().st_size for f in data.iterdir() if f.is_file())
    assert total < 2 << 20


def test_tokens_look_like_text_not_noise() -> None:
    """Natural text is Zipfian: few tokens carry much of the stream and bigrams repeat."""
    corpus = default_corpus().astype(np.int64)
    counts = np.sort(np.bincount(corpus))[::-1]
    assert counts[:50].sum() > 0.25 * corpus.size
    bigrams = corpus[:-1] * 200_000 + corpus[1:]
    assert np.unique(bigrams).size < 0.7 * bigrams.size


@pytest.mark.slow
def test_study_sequence_reads_the_reports_regime() -> None:
    """2.2 to 3.0 M distinct rows over both tables, 60 to 80 % of the 1 GiB cache's slots."""
    gathers = sequence_gathers(study_sequence(default_corpus()))
    distinct = sum(np.unique(np.concatenate([g for request in gathers for g in request[table]])).size
                   for table in range(2))
    assert 2_200_000 <= distinct <= 3_000_000
    assert 0.60 <= distinct / capacity_rows(parse_size("1G")) <= 0.80
