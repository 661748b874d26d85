"""The history reads every run the suite writes: one qualification of every shipped scenario on the
simulated lab (a trace replay among them), recorded as it ran, drawn on the history page and read by
`history changes` and `history trend`, each figure in the unit its quantity declares.

Two trials per build and no plots keep the run short (about 150 s on a loaded two-core machine): the history reads what the run recorded,
whatever its verdicts decided.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cache_qualify.cli import main
from cache_qualify.config.measurement import REPLAY_AGGREGATES
from cache_qualify.config.scenario import available_scenarios
from cache_qualify.history.series import asserted_only, series_of
from cache_qualify.history.store import History, default_url
from tests.support.labfixtures import run_qualify, write_inventory

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("every-scenario")
    inventory = write_inventory(tmp_path, builds={})
    scenarios = [arg for name in available_scenarios() for arg in ("--scenario", name)]
    run = run_qualify(inventory, tmp_path / "reports", *scenarios, "--trials", "2", "--max-trials", "2",
                      "--no-plots", timeout_s=500)
    assert run.returncode in (0, 1), run.output   # decided either way: the history is what is read here
    return tmp_path / "reports"


def test_every_shipped_scenario_is_drawn_on_the_page(reports: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = reports / "history"
    assert main(["history", "html", "--reports-dir", str(reports), str(page)]) == 0, capsys.readouterr().err
    text = (page / "index.html").read_text(encoding="utf-8")
    for name in available_scenarios():
        assert f'data-scenario="{name}"' in text, name
    # the replay's TTFT, read once per start, is a time on its axis, not a count
    assert 'data-metric="ttft_p50_s"' in text
    # the replay's figure, read once per start, named the replay's as its verdict is (ttft_p50[replay])
    assert "trace-replay: TTFT p50 on replay, in s" in text


def test_changes_and_trend_read_the_replay_in_its_units(reports: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", "changes", "--reports-dir", str(reports), "--build", "set4", "--json"]) == 0
    changes = json.loads(capsys.readouterr().out)
    assert isinstance(changes, list)
    assert main(["history", "trend", "--reports-dir", str(reports), "--build", "set4", "--scenario",
                 "trace-replay", "--metric", "ttft_p50_s", "--json"]) == 0
    trend = json.loads(capsys.readouterr().out)
    assert trend and {row["unit"] for row in trend} == {"s"}, trend
    assert {row["request"] for row in trend} == {"replay"}, trend   # the aggregate's own kind, as summary.md
    assert main(["history", "trend", "--reports-dir", str(reports), "--build", "set4", "--scenario",
                 "trace-replay", "--metric", "ttft_p50_s"]) == 0
    out = capsys.readouterr().out
    assert " s " in out and " count" not in out, out


def test_the_history_s_series_carry_the_replay_s_own_request(reports: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`history trend` and `history changes` read these series: a replay's figures are the replay's
    (`ttft_p50_s[replay]`), never the start's, though the samples hold them once per start."""
    with History(default_url(reports)) as history:
        frame, asserted = history.values(), history.asserted()
    replay = [s for s in series_of(asserted_only(frame, asserted)) if s.scenario == "trace-replay"]
    assert replay and {s.request for s in replay if s.metric in REPLAY_AGGREGATES} == {"replay"}, replay
    # the other scenarios' per-start quantities stay the start's
    assert any(s.request == "startup" for s in series_of(frame) if s.scenario != "trace-replay")
    assert main(["history", "trend", "--reports-dir", str(reports), "--build", "set4", "--request", "replay",
                 "--metric", "ttft_p50_s"]) == 0
    out = capsys.readouterr().out
    assert "replay" in out and "startup" not in out, out
