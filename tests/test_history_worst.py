"""The history's worst case (its SD half the truth) within 1.75 x alpha in the designs `plan --history` prints
(`cache_qualify.validation.history_worst`): the two worst cells of docs/statistics.md's table re-simulated,
vectorized over the runs (the slow tier: most of a cell's time is sizing its design)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from cache_qualify.stats.known_noise import POOLED_DF
from cache_qualify.validation import history_worst as hw
from cache_qualify.validation.simulate import binomial_bound

DOCS = Path(__file__).resolve().parents[1] / "docs" / "statistics.md"
ORDER = list(itertools.product(hw.SHAPES, hw.ALPHAS, hw.EFFECTS, hw.HISTORY_RUNS))
# the two worst cells of the table (docs/statistics.md): reread-1g at 0.01, 6 and 5 SD, 30 df (1.29 and 1.26 x)
WORST = [("reread-1g", 0.01, 6.0, 10), ("reread-1g", 0.01, 5.0, 10)]


@pytest.mark.slow
@pytest.mark.parametrize("shape, alpha, effect, history_runs", WORST, ids=["6 SD, 30 df", "5 SD, 30 df"])
def test_the_worst_cells_stay_within_their_bound_and_read_as_documented(shape: str, alpha: float, effect: float,
                                                                        history_runs: int) -> None:
    """The cell's passes, with the table's runs and seed, are the row docs/statistics.md prints, and the
    rate's 95 % upper limit is below 1.75 x alpha."""
    c = hw.cell(shape, effect, alpha, history_runs, seed=hw.SEED + ORDER.index((shape, alpha, effect, history_runs)))
    assert hw.row(c) in DOCS.read_text(encoding="utf-8").splitlines()
    assert c.interval()[1] < hw.BOUND * alpha, c
    assert c.worst <= binomial_bound(c.runs, hw.BOUND * alpha)


@pytest.mark.slow
def test_the_cap_is_what_bounds_the_worst_case() -> None:
    """The bound comes from the history's weight: counted as 4 df (the cap before) the 6 SD cell's
    design (2..5 for reread-1g, 15 df) passes more than 1.75 x alpha in the same simulation (1.79 x), so
    the bound above is the cap's."""
    assert POOLED_DF == 2
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("cache_qualify.stats.known_noise.POOLED_DF", 4)
        c = hw.cell("reread-1g", 6.0, 0.01, 5, seed=hw.SEED)
    assert c.rate > hw.BOUND * 0.01, c


def test_the_command_prints_one_row_per_cell(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m cache_qualify.validation.history_worst` prints the table's header and a row per cell."""
    cells = hw.table(runs=200, shapes=("two-gain",), effects=(6.0,), alphas=(0.05,))
    lines = capsys.readouterr().out.splitlines()
    assert [hw.row(c) for c in cells] == [line for line in lines if line.startswith("| two-gain |")]
    assert len(cells) == len(hw.HISTORY_RUNS) and {c.df for c in cells} == {15, 30}
