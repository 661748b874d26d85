"""`cache_qualify.report.page`: summary.html, the summary for a browser."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache_qualify.report.page import summary_page
from cache_qualify.report.tables import verdict_rows
from cache_qualify.samples.records import VerdictRecord
from tests.support.chromium import browser_problems, chromium


def test_the_page_renders_the_summarys_tables_and_relative_links_and_escapes_html() -> None:
    page = summary_page("# run `r1`: PASS\n\n| Build | Trials |\n|:---|---:|\n| set4 | 4 |\n\n"
                        "Files: [verdicts.json](verdicts.json). <script>alert(1)</script>\n\n"
                        "![plot](plots/reread-1g-requests.png)\n", "cache-qualify run r1")
    assert "<title>cache-qualify run r1</title>" in page
    assert "<h1>run <code>r1</code>: PASS</h1>" in page
    assert '<th style="text-align:left">Build</th>' in page and '<td style="text-align:right">4</td>' in page
    assert '<a href="verdicts.json">verdicts.json</a>' in page
    assert '<img src="plots/reread-1g-requests.png" alt="plot">' in page or \
        '<img src="plots/reread-1g-requests.png" alt="plot" />' in page
    assert "<script>" not in page and "&lt;script&gt;" in page


def _verdict(n: int, p: float) -> VerdictRecord:
    return VerdictRecord(id=f"readiness_wait_ns-no_regression[B-new-start-and-a-long-request-name-{n}]", arm="c",
                         metric="readiness_wait_ns", request="B-new-start", kind="no_regression",
                         higher_is_better=False, unit="ns", outcome="fail" if n else "pass",
                         baseline_mean=2_064_000_000.0, candidate_mean=1_928_000_000.0, difference=-136_000_000.0,
                         null_boundary=412_800_000.0, ci_low=-180_123_456.0, ci_high=-91_876_543.0, ci_level=0.9978,
                         p_value=p, p_adjusted=p * 3, trials_baseline=8, trials_candidate=8, trials_needed=24,
                         reason=f"Fail: a regression is shown (one-sided p {p:.3g} < 0.0022).")


# Every right-aligned cell: how many lines its text takes (its line boxes' distinct tops); the page's width.
LAYOUT = """
const lines = e => { const r = document.createRange(); r.selectNodeContents(e);
  return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size; };
return {cells: [...document.querySelectorAll('td[style*=right]')].map(td => [td.textContent, lines(td)]),
        exponents: [...document.querySelectorAll('li .num')].map(n => [n.textContent, lines(n)]),
        page: document.documentElement.scrollWidth, window: window.innerWidth,
        boxes: [...document.querySelectorAll('.wide')].map(b => [b.scrollWidth > b.clientWidth,
                                                                getComputedStyle(b).overflowX])};
"""


@pytest.mark.slow
def test_summary_html_on_a_laptop_screen_wraps_no_number_and_scrolls_a_wide_table(tmp_path: Path) -> None:
    """The verdicts table summary.md writes, wider than a 1400 px screen, in headless Chromium: each number
    on one line (p 2.18e-10 not broken at its sign, nor 2,064,000,000 over three lines), the table
    scrolling in its own box while the page keeps the screen's width; a reason's p on one line too."""
    markdown = "# run `r1`: FAIL\n\n" + "\n".join(verdict_rows([_verdict(n, 2.18e-10 * (n + 1)) for n in range(3)]))
    page = tmp_path / "summary.html"
    page.write_text(summary_page(markdown, "cache-qualify run r1"), encoding="utf-8")
    driver = chromium()
    try:
        driver.set_window_size(1400, 900)
        driver.get(page.as_uri())
        layout = driver.execute_script(LAYOUT)
        assert browser_problems(driver) == []
    finally:
        driver.quit()
    assert any("e-10" in text for text, _ in layout["cells"]), layout["cells"]
    assert [(text, n) for text, n in layout["cells"] if n != 1] == [], layout["cells"]
    assert len(layout["exponents"]) == 2 and all(n == 1 for _, n in layout["exponents"]), layout["exponents"]
    assert layout["boxes"] == [[True, "auto"]], layout["boxes"]   # wider than the screen, so it scrolls
    assert layout["page"] <= layout["window"], layout
