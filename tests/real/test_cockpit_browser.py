"""The app as an on-call engineer opens it, in a real Chromium, on the demo (`kneepoint demo`:
the twin fleet, its backfilled week, live traffic, collectors and alert evaluation; its SLO
burn-rate alerts fire on the backfilled week at the first evaluation):

- the Overview shows every alert that `kneepoint alerts list --json` lists as firing;
- no table on any page shows "None" or "NaN" (a dataframe's grid is a canvas: the text it
  draws is recorded as it is drawn, its missing-value placeholder included, while its rows
  are scrolled through; its accessible table and every HTML table are read as well);
- no page has Streamlit's "Deploy" button;
- at a 390 × 844 phone viewport the Overview and Alerts pages do not scroll sideways;
- every chart has a title, and each axis a title, with a unit where it shows numbers.

Pages are read once each (PageReading) and the checks run on what was read. Waits are hang
guards (bench/screenshots.py settle), never timings the tests depend on."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.registry import PAGES, PageSpec
from bench.screenshots import (
    DESKTOP,
    PAINTED_JS,
    PHONE,
    close_view,
    firing,
    open_view,
    page_url,
    running_demo,
    settle,
)
from tests.real.test_browser import ERROR_BOXES, browser  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.real, pytest.mark.timeout(1200)]  # hang guards: the demo may take 600 s

EMPTY_WORDS = re.compile(r"\b(None|NaN|nan)\b")
# An axis title's unit: in brackets, a rate, a sign, or a unit or counted thing named.
UNIT = re.compile(
    r"\(.+\)|\[.+\]|%|×|\$|/\s*\w|\b(s|ms|µs|seconds?|minutes?|hours?|days?|USD|W|watts?|kW|J"
    r"|[KMGT]i?B|bytes?|°C|[KMG]?Hz|tokens?|requests?|sequences?|replicas?|GPUs?|sessions?"
    r"|alerts?|events?|scrapes?|blocks?|runs?|count)\b",
    re.IGNORECASE,
)
NUMERIC_AXES = ("linear", "log")

# Each dataframe's scroller, stepped through a screen at a time down and across, each step
# painted, collecting its accessible table's cells (rows outside the view are not in it).
SCROLL_GRIDS_JS = """async () => {
    const paint = () => new Promise(done =>
        requestAnimationFrame(() => requestAnimationFrame(() => done(true))));
    const cells = [];
    const read = f => f.querySelectorAll('table[role="grid"] th, table[role="grid"] td')
        .forEach(c => cells.push(c.textContent));
    for (const frame of document.querySelectorAll('[data-testid="stDataFrame"]')) {
        const scroller = frame.querySelector('.dvn-scroller');
        read(frame);
        if (!scroller) continue;
        for (let y = 0, rows = 0; rows < 500; y += scroller.clientHeight, rows++) {
            scroller.scrollTop = y;
            for (let x = 0, cols = 0; cols < 50; x += scroller.clientWidth, cols++) {
                scroller.scrollLeft = x;
                await paint();
                read(frame);
                if (x + scroller.clientWidth >= scroller.scrollWidth) break;
            }
            if (y + scroller.clientHeight >= scroller.scrollHeight) break;
        }
    }
    return cells;
}"""
OPEN_EXPANDERS_JS = """() => document
    .querySelectorAll('[data-testid="stExpander"] details:not([open]) > summary')
    .forEach(summary => summary.click())"""
HTML_TABLES_JS = """() => [...document.querySelectorAll('table:not([role="grid"])')]
    .map(t => t.innerText)"""
CHARTS_JS = r"""() => [...document.querySelectorAll('.js-plotly-plot')].map(g => {
    const L = g._fullLayout;
    const text = t => (t && t.text ? t.text.replace(/<[^>]*>/g, '').trim() : '');
    const axes = Object.keys(L).filter(k => /^[xy]axis\d*$/.test(k)).map(k => ({
        name: k, id: k[0] + k.slice(5), visible: L[k].visible !== false,
        ticks: L[k].showticklabels !== false, type: L[k].type, title: text(L[k].title),
        matches: L[k].matches || null}));
    return {title: text(L.title), axes};
})"""
# Streamlit's own button (its test id) or any button named Deploy.
DEPLOY_JS = """() => document.querySelectorAll('[data-testid="stAppDeployButton"]').length
    + [...document.querySelectorAll('button, [role="button"]')]
        .filter(b => /^\\s*deploy\\s*$/i.test(b.innerText || b.getAttribute('aria-label') || ''))
        .length"""
WIDTHS_JS = """() => {
    const main = document.querySelector('[data-testid="stMain"]');
    return {document: document.documentElement.scrollWidth, viewport: window.innerWidth,
            main: main ? main.scrollWidth : 0, mainVisible: main ? main.clientWidth : 0};
}"""
# Lines of the main area's text, each row of columns, each row of every table and grid: the
# units an alert's rule, place and state must share to count as shown together.
ROWS_JS = """() => {
    const main = document.querySelector('[data-testid="stMain"]') || document.body;
    const rows = main.innerText.split('\\n');
    main.querySelectorAll('[data-testid="stHorizontalBlock"], tr')
        .forEach(r => rows.push(r.innerText.replace(/\\s+/g, ' ')));
    return rows;
}"""


@dataclass
class PageReading:
    """What one page shows at desktop size, everything expanded."""

    title: str
    errors: list[str]
    drawn: list[str]  # every text drawn on a canvas: the dataframes' cells and headers
    grid_cells: list[str]  # the dataframes' accessible tables
    html_tables: list[str]
    deploy_buttons: int
    charts: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, browser) -> Iterator[tuple[str, Path]]:  # type: ignore[no-untyped-def]  # noqa: F811
    # `browser` first: without Chromium or Playwright the demo is not started at all.
    with running_demo(tmp_path_factory.mktemp("cockpit")) as (url, config):
        yield url, config


@pytest.fixture(scope="module")
def readings() -> dict[str, PageReading]:
    return {}


def read_page(browser, url: str, spec: PageSpec, cache: dict[str, PageReading]) -> PageReading:  # type: ignore[no-untyped-def]  # noqa: F811
    if spec.url_path in cache:
        return cache[spec.url_path]
    page = open_view(browser, page_url(url, spec), DESKTOP)
    try:
        # Open every expander (a table inside one is on the page too), then settle again.
        page.evaluate(OPEN_EXPANDERS_JS)
        settle(page)
        grid_cells = page.evaluate(SCROLL_GRIDS_JS)
        page.evaluate(PAINTED_JS)
        reading = PageReading(
            title=page.locator("h1").first.inner_text().strip(),
            errors=page.locator(ERROR_BOXES).all_inner_texts(),
            drawn=page.evaluate("() => window.__kneepointDrawn"),
            grid_cells=grid_cells,
            html_tables=page.evaluate(HTML_TABLES_JS),
            deploy_buttons=page.evaluate(DEPLOY_JS),
            charts=page.evaluate(CHARTS_JS),
        )
    finally:
        close_view(page)
    cache[spec.url_path] = reading
    return reading


def shown_together(rows: list[str], *words: str) -> bool:
    """Some row holds every word, each as a whole name (not part of a longer one)."""
    patterns = [re.compile(rf"(?<![\w-]){re.escape(w)}(?![\w-])") for w in words]
    return any(all(p.search(row) for p in patterns) for row in rows)


def test_the_overview_shows_every_firing_alert_the_cli_lists(browser, demo) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    url, config = demo
    before = firing(config)
    page = open_view(browser, page_url(url, PAGES[0]), DESKTOP)
    try:
        rows = page.evaluate(ROWS_JS)
        assert page.locator(ERROR_BOXES).count() == 0, page.locator(ERROR_BOXES).all_inner_texts()
    finally:
        close_view(page)
    after = firing(config)
    # An alert that fired or resolved while the page was read is left out either way.
    listed = before & after
    assert listed, f"the demo has no alert firing throughout (before {before}, after {after})"
    missing = [
        (rule, replica)
        for rule, replica in sorted(listed, key=str)
        if not shown_together(rows, rule, replica or "fleet", "firing")
    ]
    assert not missing, f"firing per the CLI, not shown on the Overview: {missing}\n{rows}"


@pytest.mark.parametrize("spec", PAGES, ids=lambda spec: spec.url_path)
def test_no_table_shows_none_or_nan(browser, demo, readings, spec: PageSpec) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    reading = read_page(browser, demo[0], spec, readings)
    assert reading.title == spec.title and not reading.errors, reading.errors
    found = {
        "drawn in a dataframe": sorted({t for t in reading.drawn if EMPTY_WORDS.search(t)}),
        "in a dataframe's cells": sorted({t for t in reading.grid_cells if EMPTY_WORDS.search(t)}),
        "in an HTML table": [t for t in reading.html_tables if EMPTY_WORDS.search(t)],
    }
    assert not any(found.values()), found


@pytest.mark.parametrize("spec", PAGES, ids=lambda spec: spec.url_path)
def test_no_deploy_button(browser, demo, readings, spec: PageSpec) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    reading = read_page(browser, demo[0], spec, readings)
    assert reading.title == spec.title
    assert reading.deploy_buttons == 0


@pytest.mark.parametrize("spec", PAGES, ids=lambda spec: spec.url_path)
def test_every_chart_has_a_title_and_axis_titles_with_units(  # type: ignore[no-untyped-def]
    browser,  # noqa: F811 (the fixture imported above)
    demo,
    readings,
    spec: PageSpec,
) -> None:
    reading = read_page(browser, demo[0], spec, readings)
    assert reading.title == spec.title
    problems = []
    for index, chart in enumerate(reading.charts):
        name = chart["title"] or f"chart {index + 1}"
        if not chart["title"]:
            problems.append(f"{name}: no title")
        axes = {axis["id"]: axis for axis in chart["axes"]}
        for axis in chart["axes"]:
            if not (axis["visible"] and axis["ticks"]):
                continue  # not drawn, or draws no numbers
            # Small multiples: an axis matching another shares its title.
            group = [axis, *(a for a in axes.values() if axis["id"] in (a["matches"],))]
            if axis["matches"] in axes:
                group.append(axes[axis["matches"]])
            title = next((a["title"] for a in group if a["title"]), "")
            if not title:
                problems.append(f"{name}: {axis['name']} has no title")
            elif axis["type"] in NUMERIC_AXES and not UNIT.search(title):
                problems.append(f"{name}: {axis['name']} title {title!r} names no unit")
    assert not problems, problems


@pytest.mark.parametrize("path", ["overview", "alerts"])
def test_no_sideways_scroll_on_a_phone(browser, demo, path: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    spec = next(s for s in PAGES if s.url_path == path)
    page = open_view(browser, page_url(demo[0], spec), PHONE)
    try:
        assert page.locator("h1").first.inner_text().strip() == spec.title
        widths = page.evaluate(WIDTHS_JS)
    finally:
        close_view(page)
    # The document, and Streamlit's main area (it scrolls itself, not the document).
    assert widths["document"] <= widths["viewport"], widths
    assert widths["main"] <= widths["mainVisible"], widths
