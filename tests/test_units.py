"""Units of measured quantities: declared in the source's unit, shown in the natural one."""

from __future__ import annotations

import math

import pytest

from cache_qualify.units import UNITS, unit


def test_times_are_shown_in_seconds_whatever_they_are_declared_in() -> None:
    assert unit("ns").describe(1.92775e9) == "1.928 s"
    assert unit("ms").describe(152.5) == "0.1525 s"
    assert unit("us").format(6.4) == "0.000 s"
    assert unit("ns").format(2.14e9) == "2.140 s"
    assert unit("s").describe(12345.6) == "12,346 s"


def test_differences_carry_their_sign_and_fractions_become_percentage_points() -> None:
    assert unit("ns").describe(-6.735e8, signed=True) == "-0.6735 s"
    assert unit("fraction").describe(0.8631) == "86.31 %"
    assert unit("fraction").describe(0.02, signed=True) == "+2 pp"
    assert unit("fraction").format(0.1123, signed=True) == "+11.23 pp"


def test_counts_are_whole_numbers_of_their_thing() -> None:
    assert unit("pages").describe(41301) == "41,301 pages"
    assert unit("pages").describe(-830.4, signed=True) == "-830.4 pages"
    assert unit("tokens").format(4999) == "4,999 tokens"
    assert unit("rows").format(175506, suffix=False) == "175,506"


def test_conversion_round_trips_and_missing_values_read_n_a() -> None:
    for u in UNITS.values():
        assert math.isclose(u.from_shown(u.to_shown(123.25)), 123.25)
        assert u.format(math.nan) == "n/a" and u.describe(None) == "n/a"


def test_an_unknown_unit_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown unit 'furlongs'; known units: ns, us, ms, s"):
        unit("furlongs")
