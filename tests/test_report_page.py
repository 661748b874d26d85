"""`cache_qualify.report.page`: summary.html, the summary for a browser."""

from __future__ import annotations

from cache_qualify.report.page import summary_page


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
