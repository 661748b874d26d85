"""The history page a lab engineer reads, in a real headless Chromium (tests/support/chromium.py).

A lab's history written by the suite's own writers (tests/support/history_sim.py): eight
qualifications of two_choice against set4, the first from before plans recorded
units, set4's ref and re-read hit rate stepping at the fifth, one bad start of
set4 in the sixth (every wait about four times longer, flagged and set aside by
the suite's own rule), each run with its summary, then two runs of llama-server
(prompt time in s, KV cells). The page is written into the reports folder, as
CI publishes it. Read from the page itself: the axis labels, the tick labels and
the SVG coordinates of the points, the links and the filter, and what a laptop's first screen shows.
"""

from __future__ import annotations

import re
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest
from selenium.webdriver.support.ui import Select

from cache_qualify.cli import main
from cache_qualify.history.store import History, default_url
from tests.support import history_sim
from tests.support.chromium import browser_problems, chromium

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("history-page")]  # one worker writes the lab's history once

RUNS, BAD_RUN = 8, 5
BAD_TRIAL = 2  # the start history_sim makes bad (0-based)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reports = tmp_path_factory.mktemp("lab") / "reports"
    folders = history_sim.write_lab_history(reports, RUNS, seed=3, bad_run=BAD_RUN)
    assert main(["history", "import", "--reports-dir", str(reports), *map(str, folders)]) == 0
    assert main(["history", "html", "--reports-dir", str(reports), str(reports / "history")]) == 0
    return reports


@pytest.fixture(scope="module")
def browser(reports: Path) -> Iterator[Any]:
    driver = chromium()
    driver.set_window_size(1300, 1000)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser: Any, reports: Path) -> Iterator[Any]:
    """The page freshly loaded (no filter), and no console warning by the end of the test."""
    browser.get((reports / "history" / "index.html").as_uri() + "#")
    browser.refresh()
    yield browser
    assert browser_problems(browser) == []


# One trend's SVG as plain data: its texts by role, the points of each build's parts in SVG coordinates.
TREND = """
const figure = document.querySelector(`figure.trend[data-scenario="${arguments[0]}"][data-metric="${arguments[1]}"]`
                                      + `[data-request="${arguments[2]}"]`);
const texts = selector => [...figure.querySelectorAll(selector)].map(t => t.textContent.trim());
const centre = element => { const r = element.getBoundingClientRect(); return r.left + r.width / 2; };
const link = element => { const a = element.closest('a');
  return a && new URL(a.getAttribute('xlink:href') || a.getAttribute('href'), document.baseURI).href; };
const points = selector => [...figure.querySelectorAll(`${selector} use`)].map(u => [+u.getAttribute('x'),
                                                                                    +u.getAttribute('y')]);
const builds = {};
for (const option of document.querySelectorAll('#build option[data-index]:not([data-index=""])')) {
  const k = option.dataset.index, parts = `[id^="${figure.id}-b${k}-"]`;
  const refs = [...figure.querySelectorAll(`g${parts}[id*="-ref"]:not([id$="-ref-label"]) text`)];
  builds[option.value] = {trend: points(`g[id="${figure.id}-b${k}-trend"]`),
                          starts: points(`g[id="${figure.id}-b${k}-starts"]`),
                          aside: points(`g[id="${figure.id}-b${k}-set-aside"]`),
                          refs: refs.map(t => [t.textContent, centre(t), link(t)])};
}
const ticks = axis => [...figure.querySelectorAll(`g[id*="-${axis}tick_"]`)].map(g => {
  const text = g.querySelector('text'), mark = g.querySelector('use');
  return [text.textContent.replace('\u2212', '-'), +mark.getAttribute(axis), centre(text), link(text)]; });
return {texts: texts('svg text'), xticks: ticks('x'), yticks: ticks('y'), builds: builds,
        caption: figure.querySelector('figcaption').textContent};
"""


def trend(driver: Any, scenario: str, metric: str, request: str) -> dict[str, Any]:
    found: dict[str, Any] = driver.execute_script(TREND, scenario, metric, request)
    return found


def shown(trend: dict[str, Any], y: float) -> float:
    """The value an SVG y coordinate stands for, by the y axis' ticks (a linear axis)."""
    (v0, y0), (v1, y1) = [(float(label), at) for label, at, _, _ in (trend["yticks"][0], trend["yticks"][-1])]
    return float(v0 + (y - y0) * (v1 - v0) / (y1 - y0))


def summary_uri(reports: Path, run_id: str) -> str:
    return (reports / run_id / "summary.html").resolve().as_uri()


def test_waits_in_seconds_refs_on_the_axis_and_links_to_summaries(page: Any, reports: Path) -> None:
    wait = trend(page, history_sim.SCENARIO, "readiness_wait_ns", "B-new-start")
    assert "Readiness wait (s)" in wait["texts"]
    ticks = [float(label) for label, *_ in wait["yticks"]]
    assert 0 <= min(ticks) < 0.3 and 2.0 < max(ticks) < 10, ticks  # seconds, not nanoseconds
    assert not [t for t in wait["texts"] if re.fullmatch(r"[-+]?[\d.]*e[-+]?\d+|.*×10.*", t)], wait["texts"]  # no offset
    set4_mean, two_choice_mean = (history_sim.LAB_MEANS[b]["B-new-start"][1] / 1e9 for b in ("set4", "two_choice"))
    assert all(abs(shown(wait, y) - set4_mean) < 0.05 for _, y in wait["builds"]["set4"]["trend"])
    assert all(abs(shown(wait, y) - two_choice_mean) < 0.05 for _, y in wait["builds"]["two_choice"]["trend"])

    run_ids = [f"lab{i:03d}" for i in range(RUNS)]
    assert [label for label, *_ in wait["xticks"]] == [f"03-{2 + i:02d} {9 + i % 3:02d}:30" for i in range(RUNS)]
    assert "run started (UTC, 2026)" in wait["texts"]
    # a ref where it changed, not again at every run of it: set4's at its first run and at its step
    step = history_sim.LAB_STEP_RUN
    for build, expected in (("set4", {0: history_sim.SET4_REFS[0], step: history_sim.SET4_REFS[1]}),
                            ("two_choice", {i: f"{(i * 2654435761) % 16**8:08x}" for i in range(RUNS)})):
        refs = wait["builds"][build]["refs"]
        assert [ref for ref, _, _ in refs] == list(expected.values()), build
        # each ref under its run's tick, and a link to that run's summary, as the tick's date is
        assert all(abs(at - wait["xticks"][i][2]) < 3 for (_, at, _), i in zip(refs, expected)), (refs, wait["xticks"])
        assert [url for _, _, url in refs] == [summary_uri(reports, run_ids[i]) for i in expected]
    assert [tick[3] for tick in wait["xticks"]] == [summary_uri(reports, r) for r in run_ids]
    assert "set4 ref" in wait["texts"] and "two_choice ref" in wait["texts"]

    rows = page.execute_script("return [...document.querySelectorAll('#runs tr[data-run]')]"
                               ".map(r => [r.dataset.run, r.querySelector('a.summary').href])")
    every = [*run_ids, "llama000", "llama001"][::-1]   # newest first
    assert rows == [[r, summary_uri(reports, r)] for r in every]
    page.find_element("css selector", f'#runs tr[data-run="lab{BAD_RUN:03d}"] a.summary').click()
    assert unquote(urlparse(page.current_url).path) == str((reports / f"lab{BAD_RUN:03d}" / "summary.html").resolve())
    assert f"cache-qualify run lab{BAD_RUN:03d}: " in page.find_element("tag name", "h1").text


def test_every_metric_in_its_unit_whatever_the_runtime(page: Any) -> None:
    """Hit rates in %, KV pages and llama-server's KV cells as whole counts, its prompt time in s: the
    units the runs recorded, not a table of metric names (the first run recorded none: its study's)."""
    for scenario, metric, request, label, low, high, whole in (
            (history_sim.SCENARIO, "hit_rate", "B-new-start", "Hit rate (%)", 80, 100, False),
            (history_sim.SCENARIO, "kv_pages", "startup", "KV pages (pages)", 41_000, 41_600, True),
            (history_sim.LLAMA_SCENARIO, "prompt_time_s", history_sim.LLAMA_REQUEST, "Prompt time (s)", 0, 1, False),
            (history_sim.LLAMA_SCENARIO, "kv_pages", "startup", "KV cells per slot (cells)", 7_000, 9_000, True)):
        found = trend(page, scenario, metric, request)
        assert label in found["texts"], (metric, found["texts"])
        ticks = [label for label, *_ in found["yticks"]]
        assert all(low <= float(t.replace(",", "")) <= high for t in ticks), (metric, ticks)
        if whole:
            assert all("." not in t for t in ticks), (metric, ticks)
    hit = trend(page, history_sim.SCENARIO, "hit_rate", "B-new-start")
    assert "in % (recorded in fraction)" in hit["caption"]
    assert "set4 changed between lab003 (3f9c2e1a) and lab004 (8b1d7a40)" in hit["caption"]


def test_bad_starts_marked_and_left_out_of_the_line(page: Any, reports: Path) -> None:
    bad = f"lab{BAD_RUN:03d}"
    with History(default_url(reports)) as history:
        values = history.values(scenario=history_sim.SCENARIO, build="set4", metric="readiness_wait_ns",
                                request="B-new-start")
    mine = values[values["run_id"] == bad]
    kept, aside = mine[mine["flag"] == ""], mine[mine["flag"] == "set aside"]
    assert list(aside["trial"]) == [BAD_TRIAL], mine  # the suite's own rule found the bad start
    wait = trend(page, history_sim.SCENARIO, "readiness_wait_ns", "B-new-start")
    set4 = wait["builds"]["set4"]
    (cross_x, cross_y), = set4["aside"]
    vertex_x, vertex_y = set4["trend"][BAD_RUN]
    assert cross_x == pytest.approx(vertex_x, abs=0.5)  # marked at its run
    assert shown(wait, cross_y) == pytest.approx(float(aside["value"].iloc[0]) / 1e9, abs=0.03)
    assert shown(wait, vertex_y) == pytest.approx(float(kept["value"].mean()) / 1e9, abs=0.02)  # out of the line
    assert abs(shown(wait, vertex_y) - float(mine["value"].mean()) / 1e9) > 0.5
    assert len(set4["starts"]) == RUNS * history_sim.LAB_STARTS - 1  # the others are dots
    assert wait["builds"]["two_choice"]["aside"] == []
    assert f"set aside as bad starts by their run's verdicts, so out of the line: set4 {bad} trial {BAD_TRIAL + 1}" \
        in wait["caption"]
    cell = page.execute_script(f"return document.querySelector('#runs tr[data-run=\"{bad}\"]').cells[7].textContent")
    assert int(cell) >= 1


def visible(driver: Any) -> dict[str, list[str]]:
    """The trends, runs and count the filter leaves in view."""
    found: dict[str, list[str]] = driver.execute_script(
        "const seen = e => !e.closest('[hidden]') && getComputedStyle(e).display !== 'none';"
        "return {figures: [...document.querySelectorAll('figure.trend')].filter(seen).map(f => f.dataset.scenario"
        " + ' ' + f.dataset.metric + ' ' + f.dataset.request), runs: [...document.querySelectorAll("
        "'#runs tr[data-run]')].filter(seen).map(r => r.dataset.run), shown: [document.getElementById('shown')"
        ".textContent]}")
    return found


def parts_shown(driver: Any, figure: str, build: str) -> list[bool]:
    """Whether each part of `build` in the SVG of `figure` is drawn."""
    found: list[bool] = driver.execute_script(
        "const k = document.querySelector(`#build option[value=\"${arguments[1]}\"]`).dataset.index;"
        "return [...document.querySelectorAll(`#${arguments[0]} svg g[id^=\"${arguments[0]}-b${k}-\"]`)]"
        ".map(g => getComputedStyle(g).display !== 'none')", figure, build)
    return found


def test_filter_by_scenario_and_build(page: Any, reports: Path) -> None:
    everything = visible(page)
    assert len(everything["figures"]) == 7 and everything["shown"] == ["7 of 7 trends shown"]
    assert len(everything["runs"]) == RUNS + 2
    Select(page.find_element("id", "scenario")).select_by_value(history_sim.LLAMA_SCENARIO)
    llama = visible(page)
    assert llama["runs"] == ["llama001", "llama000"] and llama["shown"] == ["2 of 7 trends shown"]
    assert all(f.startswith(history_sim.LLAMA_SCENARIO + " ") for f in llama["figures"]), llama
    assert page.current_url.endswith(f"#scenario={history_sim.LLAMA_SCENARIO}")

    Select(page.find_element("id", "scenario")).select_by_value("")
    Select(page.find_element("id", "build")).select_by_value("two_choice")
    two_choice = visible(page)
    assert two_choice["runs"] == [f"lab{i:03d}" for i in range(RUNS)][::-1]
    assert len(two_choice["figures"]) == 5 and all(f.startswith(history_sim.SCENARIO) for f in two_choice["figures"])
    figure = page.execute_script("return document.querySelector('figure.trend:not([hidden])').id")
    assert parts_shown(page, figure, "two_choice") and all(parts_shown(page, figure, "two_choice"))
    assert parts_shown(page, figure, "set4") and not any(parts_shown(page, figure, "set4"))

    # a filtered view is an address: opened again, the page shows the same
    page.get((reports / "history" / "index.html").as_uri() + "#scenario=reread-1g&build=set4")
    page.refresh()
    assert Select(page.find_element("id", "build")).first_selected_option.get_attribute("value") == "set4"
    again = visible(page)
    assert again["runs"] == two_choice["runs"] and again["shown"] == ["5 of 7 trends shown"]
    assert all(parts_shown(page, figure, "set4")) and not any(parts_shown(page, figure, "two_choice"))


def test_page_outside_the_reports_links_where_the_runs_recorded_their_summaries(reports: Path, tmp_path: Path,
                                                                                 capsys: pytest.CaptureFixture[str]) \
        -> None:
    assert main(["history", "html", "--reports-dir", str(reports), str(tmp_path)]) == 0
    capsys.readouterr()
    text = (tmp_path / "index.html").read_text(encoding="utf-8")
    for run in ("lab000", "llama001"):
        recorded = (reports / run / "summary.md").resolve().as_uri()
        assert f'<a class="summary" href="{recorded}">{run}</a>' in text
    assert "../lab000/summary" not in text


def test_a_page_in_the_reports_folder_survives_publishing_it(reports: Path, tmp_path: Path) -> None:
    """Every link of the page is relative and still resolves once the reports folder is copied elsewhere
    (served by a web server, say): summaries as HTML, folders, each file readable by others."""
    published = tmp_path / "published"
    shutil.copytree(reports, published)
    text = (published / "history" / "index.html").read_text(encoding="utf-8")
    links = re.findall(r'<a class="(summary|folder)" href="([^"]*)"', text)
    assert {kind for kind, _ in links} == {"summary", "folder"} and len(links) == 2 * (RUNS + 2), links
    for kind, href in links:
        assert "://" not in href and not href.startswith("/"), href
        target = (published / "history" / unquote(href)).resolve()
        assert target.is_relative_to(published.resolve()), href
        assert target.is_file() and target.name == "summary.html" if kind == "summary" else target.is_dir(), href
    for path in [published / "history" / "index.html", *published.glob("*/summary.*"), *published.glob("*/plan.json")]:
        assert stat.S_IMODE(path.stat().st_mode) & stat.S_IROTH, path


FIRST_SCREEN = """
const row = document.querySelector('#runs tr[data-run]'), box = e => e.getBoundingClientRect();
const outcome = row.querySelector('td.outcome'), verdicts = row.querySelector('td.verdicts');
return {run: row.dataset.run, outcome: outcome.textContent, verdicts: verdicts.textContent,
        bottom: Math.max(box(outcome).bottom, box(verdicts).bottom), height: window.innerHeight,
        summary: row.querySelector('a.summary').href, trends: box(document.querySelector('figure.trend')).top,
        table: document.querySelector('#runs th:nth-child(3)').textContent};
"""


def test_the_first_screen_of_a_laptop_shows_the_newest_runs_outcome_and_verdicts(browser: Any, reports: Path) -> None:
    """At 1400x900 the newest run's row (its outcome, its candidate's verdicts and the assertions that
    kept it from passing, its summary's link) is on the first screen, above every trend."""
    browser.set_window_size(1400, 900)
    try:
        browser.get((reports / "history" / "index.html").as_uri() + "#")
        browser.refresh()
        first = browser.execute_script(FIRST_SCREEN)
    finally:
        browser.set_window_size(1300, 1000)
    with History(default_url(reports)) as history:
        newest = history.runs()[-1]
    assert first["run"] == newest["run_id"] == "llama001" and first["summary"] == summary_uri(reports, "llama001")
    assert first["outcome"] == newest["outcome"] and first["table"] == "outcome", first
    (arm, counts), = newest["verdicts"].items()
    assert first["verdicts"].startswith(f"{arm}: ") and all(f"{n} {o}" in first["verdicts"] for o, n in counts.items())
    for assertion, outcome in newest["assertions"][arm]:
        assert (f"{assertion} {outcome}" in first["verdicts"]) == (outcome != "pass"), (assertion, first)
    assert 0 < first["bottom"] <= min(first["height"], 900), first
    assert first["trends"] > first["bottom"], first


def test_the_whole_page_with_its_trends_fits_a_laptop(browser: Any, reports: Path) -> None:
    """At 1400x900 the trends sit two a row, a ref only where it changed, the dates along the axis: the
    page stays under 2,500 px tall with an eighth trend (this history has seven: one more row of trends,
    at worst, is added to its height; a band of rotated refs under each made eight 5,000 px); a y axis spans
    at least 2 % of its values (hit rates 0.004 points apart do not fill it as if they were far apart)."""
    browser.set_window_size(1400, 900)
    try:
        browser.get((reports / "history" / "index.html").as_uri() + "#")
        browser.refresh()
        height, trends, tallest = browser.execute_script(
            "const f = [...document.querySelectorAll('figure.trend')];"
            "return [document.documentElement.scrollHeight, f.length,"
            " Math.max(...f.map(e => e.getBoundingClientRect().height))]")
        spans = browser.execute_script(
            "return [...document.querySelectorAll('figure.trend')].map(f => [f.dataset.metric, "
            "[...f.querySelectorAll('g[id*=\"-ytick_\"] text')].map(t => +t.textContent.replace('\u2212', '-'))])")
    finally:
        browser.set_window_size(1300, 1000)
    assert trends == 7 and height + tallest < 2500, (trends, height, tallest)
    for metric, ticks in spans:   # the axis reaches at most a tick's step past its outer ticks
        low, high, step = min(ticks), max(ticks), ticks[1] - ticks[0]
        assert high - low + step >= 0.019 * abs(low + high) / 2, (metric, ticks)
