"""The run's option table (`cache_qualify.config.options`): each option declared once, checked by one model."""

from __future__ import annotations

import dataclasses

import pytest

from cache_qualify.config.options import OVERRIDES, RESTORED, TABLE, checked
from cache_qualify.config.scenario import Scenario
from cache_qualify.errors import ConfigError
from cache_qualify.qualification import RunOptions


def test_every_flag_and_name_is_declared_once() -> None:
    assert len({o.flag for o in TABLE}) == len({o.name for o in TABLE}) == len(TABLE)


def test_the_qualification_s_options_are_the_table_s_and_the_run_s_own() -> None:
    """RunOptions holds the table's options the qualification reads, and what the setup decides (the id,
    folder, seed, session, the history's URL however it was named, the mode) — nothing written by hand."""
    fields = {f.name for f in dataclasses.fields(RunOptions)}
    from_table = {o.qualifier_field for o in TABLE if o.qualifier_field}
    assert from_table <= fields
    assert fields - from_table == {"run_id", "run_dir", "seed", "history", "tournament", "session"}


def test_an_option_that_overrides_a_scenario_field_has_the_field_s_bounds() -> None:
    """One rule per value: `--alpha` allows what a scenario's `alpha` allows (0 < alpha < 0.5), which the
    decision does not check again (it checked 0 < alpha < 1 twice)."""
    assert set(OVERRIDES) <= set(Scenario.model_fields)
    assert checked({"cq_alpha": 0.49}.get)["alpha"] == 0.49
    with pytest.raises(ConfigError, match=r"^--alpha: expected 0 < value < 0.5, found 0.5$"):
        checked({"cq_alpha": 0.5}.get)
    assert all(RESTORED[o.dest] == o.flag for o in TABLE if o.scenario_field)   # --resume restores them


@pytest.mark.parametrize(("dest", "value", "message"), [
    ("cq_seed", -1, "--seed: expected value >= 0, found -1"),
    ("cq_lock_wait", -0.5, "--lock-wait: expected value >= 0, found -0.5"),
    ("cq_test", "ttest", "--test: expected one of welch, mannwhitney, permutation, yuen, found 'ttest'"),
])
def test_a_bad_value_is_one_line_naming_the_option(dest: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{message}$"):
        checked({dest: value}.get)


def test_defaults_and_switches() -> None:
    values = checked({}.get)
    assert (values["reports_dir"], values["lock_wait"], values["seed"]) == ("reports", 0.0, None)
    assert values.qualifier_fields()["parallel_arms"] is False and values.overrides()["alpha"] == ("--alpha", None)
