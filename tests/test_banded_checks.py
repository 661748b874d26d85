"""How the real-server trace tests hold a banded prediction check (`tests.support.examples.banded_checks`),
on a run folder written from recorded real-vLLM starts of examples/vllm-trace.yaml: every start within
passes, a start outside fails its build's check alone, and a check that disagrees with its starts is
caught. Those tests assert this whatever the machine's load did to the starts (tests/README.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from cache_qualify.report.render import render_run
from tests.support.examples import banded_checks
from tests.support.recorded_trace import TRACE_SCENARIO, TraceStart, trace_starts, write_recorded_trace_run

BAND = 0.02   # the vllm profile's emulator band


def listed_and_warm(root: Path, starts: list[TraceStart]) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    run = write_recorded_trace_run(root, starts)
    render_run(run, plots=False)
    listed = json.loads((run / "verdicts.json").read_text(encoding="utf-8"))["predictions"][TRACE_SCENARIO]
    warm: dict[str, list[float]] = {}
    for start in starts:
        warm.setdefault(start.build, []).append(start.hit_rate)
    return listed, warm


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """The recorded starts' checks (every start within the band) and their hit rates."""
    return listed_and_warm(tmp_path_factory.mktemp("recorded"), trace_starts())


def test_starts_within_the_band_pass_and_one_outside_fails_its_build_alone(
        recorded: tuple[list[dict[str, Any]], dict[str, list[float]]], tmp_path: Path) -> None:
    assert banded_checks(*recorded, BAND) == set()
    starts = trace_starts()
    # a prefix-caching start that measured 3 points under its prediction: its build fails, 2 of 3 within
    first = next(s for s in starts if s.build == "prefix-caching")
    under = dataclasses.replace(first, hits=first.hits - int(0.03 * first.prompt_tokens))
    listed, warm = listed_and_warm(tmp_path, [under if s is first else s for s in starts])
    assert banded_checks(listed, warm, BAND) == {"prefix-caching"}
    assert {c["build"]: c["starts_within"] for c in listed}["prefix-caching"] == 2


def test_a_check_that_disagrees_with_its_starts_is_caught(
        recorded: tuple[list[dict[str, Any]], dict[str, list[float]]]) -> None:
    listed, warm = recorded
    for field, wrong in (("starts_within", 2), ("outcome", "failed"), ("tolerance", 0.0)):
        tampered = [{**c, field: wrong} if c["build"] == "prefix-caching" else c for c in listed]
        with pytest.raises(AssertionError, match=f"'{field}'"):
            banded_checks(tampered, warm, BAND)
    elsewhere = {**warm, "prefix-caching": [rate + 0.001 for rate in warm["prefix-caching"]]}
    with pytest.raises(AssertionError, match="'measured'"):
        banded_checks(listed, elsewhere, BAND)
