"""Capacity model: the RowCache study's capacity rows from cache bytes."""

from __future__ import annotations

import pytest

from cache_qualify.sim.capacity import (
    FIXED_BYTES,
    ROW_BYTES,
    capacity_rows,
    split_rows,
    table_capacities,
)
from cache_qualify.units import parse_size


@pytest.mark.parametrize(("text", "expected"), [
    ("1G", 1 << 30), ("1GiB", 1 << 30), ("4GiB", 4 << 30), ("512M", 512 << 20), ("512mb", 512 << 20),
    ("64K", 65_536), ("1024", 1024), (" 2 G ", 2 << 30), ("1.5G", 3 << 29), (4096, 4096), ("0", 0),
])
def test_parse_size_reads_binary_units(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("1X", r"must be a number with an optional unit K, M, G or T .* found '1X'"),
    ("", r"found ''"),
    ("G", r"found 'G'"),
    ("-1G", r"found '-1G'"),
    ("1.3", r"must be a whole number of bytes, found '1.3'"),
    (-5, r"must be >= 0 bytes, found -5"),
])
def test_parse_size_rejects_what_it_cannot_read(text: str | int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_size(text)


def test_the_reports_capacity_rows() -> None:
    assert capacity_rows(parse_size("1G")) == 3_613_836
    assert capacity_rows(parse_size("4G")) == 15_118_212
    assert capacity_rows(parse_size("1G")) // 4 == 903_459  # the RowCache study's four-way sets


def test_capacity_is_whole_sets_and_never_negative() -> None:
    one_set_short = FIXED_BYTES + ROW_BYTES * 7
    assert capacity_rows(one_set_short) == 4
    assert capacity_rows(one_set_short, ways=8) == 0
    assert capacity_rows(FIXED_BYTES - 1) == 0


@pytest.mark.parametrize("size", ["1G", "4G", "3G", "100M"])
def test_tables_split_whole_sets_summing_to_the_total(size: str) -> None:
    shares = table_capacities(parse_size(size))
    assert len(shares) == 2
    assert sum(shares) == capacity_rows(parse_size(size))
    assert all(share % 4 == 0 for share in shares)
    assert max(shares) - min(shares) <= 4


def test_split_rows() -> None:
    assert table_capacities(1 << 30) == (1_806_920, 1_806_916)
    assert split_rows(23, ways=4, tables=2) == (12, 8)
    assert split_rows(40, ways=4, tables=3) == (16, 12, 12)
    with pytest.raises(ValueError, match=r"`tables` and `ways` must be >= 1, found tables=0"):
        split_rows(40, tables=0)
