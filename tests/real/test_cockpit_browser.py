"""The app as an on-call engineer opens it, in a real Chromium, on the demo (`kneepoint demo`:
the twin fleet, its backfilled week, live traffic, collectors and alert evaluation; its SLO
burn-rate alerts fire on the backfilled week at the first evaluation):

- the Overview shows every alert that `kneepoint alerts list --json` lists as firing;
- no table on any page shows "None" or "NaN" (a dataframe's grid is a canvas: the text it
  draws is recorded as it is drawn, its missing-value placeholder included, while its rows
  are scrolled through; its accessible table and every HTML table are read as well);
- no page has Streamlit's "Deploy" button;
- at a 390 × 844 phone viewport the Overview and Alerts pages do not scroll sideways, and on
  every page with tables each table fits the screen and shows, without scrolling, its row's
  name and the columns it is for, none of their headers or cells cut (PHONE_TABLES);
- every chart has a title, and each axis a title, with a unit where it shows numbers.

Pages are read once each (PageReading) and the checks run on what was read. Waits are hang
guards (bench/screenshots.py settle), never timings the tests depend on."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.registry import PAGES, PageSpec
from bench.screenshots import (
    CANVAS_HOOK,
    DESKTOP,
    PAGE_NEVER_MS,
    PAINTED_JS,
    PHONE,
    ROOT,
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


# Each table a page may show at 390 px: the headers it must show first, whole, without
# scrolling (its row's name, pinned, then the columns it is for; app/tables.phone_layout).
# A page's first entries (REQUIRED_TABLES of them) are tables the demo always shows.
PHONE_TABLES: dict[str, list[tuple[str, ...]]] = {
    "overview": [],
    "alerts": [
        ("Rule", "State", "Value"),
        ("Rule", "To", "Time"),
        ("Channel", "State", "Created"),
        ("Silence", "Ended", "Matchers"),
    ],
    "timeline": [("Kind", "Time", "Replica")],
    "slos": [("Window", "Firing", "Long-window burn (× budget)"), ("Window", "Now", "When")],
    "capacity": [
        ("Replica", "Reaches the knee", "Knee (seqs)"),
        ("Plan", "Sequences that fit"),
    ],
    "prefix-cache": [("Event", "From", "Value"), ("Replica", "GPU", "CPU offload")],
    "knee": [("Run", "Knee", "Recommended"), ("Concurrency", "Throughput (× baseline)", "Verdict")],
    "cost": [],
    "what-if": [
        ("Number", "Predicted", "Measured"),
        ("Number", "Error", "Measured"),
        ("Change", "Throughput", "TTFT p95"),  # the published validation
    ],
    "gpus": [],
    "health": [
        ("Target", "State", "Failures in a row"),
        ("Collector", "State", "Last seen"),
        ("Job", "Failures", "Last run"),
        ("Target", "Time"),
    ],
    "audit": [("Action", "Outcome", "Time")],
}
REQUIRED_TABLES = {"alerts": 2, "timeline": 1, "slos": 1, "capacity": 2, "knee": 2, "health": 3}
REQUIRED_TABLES["audit"] = 1  # the test posts an annotation first (audited)
# Installed before the page's scripts, after CANVAS_HOOK: records each text drawn on a canvas
# with where it is drawn (its left and right edge, from measureText and the text alignment)
# and the clip it is drawn in (glide-data-grid clips each column to its own bounds: a text
# wider than its column, or a column past the grid's edge, is cut there, with no ellipsis).
CLIP_HOOK = """(() => {
    const log = window.__kneepointTexts = [];
    const proto = CanvasRenderingContext2D.prototype;
    const states = new WeakMap();
    const state = ctx => {
        let s = states.get(ctx);
        if (!s) states.set(ctx, s = {clip: null, stack: [], rect: null});
        return s;
    };
    const {save, restore, beginPath, rect, clip, fillText} = proto;
    const x = (ctx, at) => { const t = ctx.getTransform(); return t.a * at + t.e; };
    proto.save = function () { const s = state(this); s.stack.push(s.clip);
                               return save.call(this); };
    proto.restore = function () { const s = state(this); s.clip = s.stack.pop() || null;
                                  return restore.call(this); };
    proto.beginPath = function () { state(this).rect = null; return beginPath.call(this); };
    proto.rect = function (left, top, width, height) {
        state(this).rect = [x(this, left), x(this, left + width)];
        return rect.call(this, left, top, width, height);
    };
    proto.clip = function (...args) {
        const s = state(this), r = s.rect;
        if (r) s.clip = s.clip ? [Math.max(s.clip[0], r[0]), Math.min(s.clip[1], r[1])] : r;
        return clip.apply(this, args);
    };
    proto.fillText = function (text, at, ...rest) {
        const width = this.measureText(text).width * this.getTransform().a;
        const anchor = x(this, at), align = this.textAlign;
        const left = align === 'right' || align === 'end' ? anchor - width
            : align === 'center' ? anchor - width / 2 : anchor;
        log.push({canvas: this.canvas, text: String(text), left, right: left + width,
                  clip: state(this).clip});
        return fillText.call(this, text, at, ...rest);
    };
})()"""
# Each dataframe scrolled down a screen at a time (not across: what shows without scrolling
# sideways), each step painted, so every row's cells are drawn; then what was drawn in it.
# A frame's header canvas is its shorter one.
PHONE_GRIDS_JS = """async () => {
    const paint = () => new Promise(done =>
        requestAnimationFrame(() => requestAnimationFrame(() => done(true))));
    const frames = [...document.querySelectorAll('[data-testid="stDataFrame"]')];
    for (const frame of frames) {
        const scroller = frame.querySelector('.dvn-scroller');
        if (!scroller) continue;
        scroller.scrollLeft = 0;
        for (let y = 0, step = 0; step < 200; y += scroller.clientHeight, step++) {
            scroller.scrollTop = y;
            await paint();
            if (y + scroller.clientHeight >= scroller.scrollHeight) break;
        }
    }
    return frames.map(frame => {
        const canvases = [...frame.querySelectorAll('canvas')]
            .sort((a, b) => b.clientHeight - a.clientHeight);
        const [cells, header] = canvases;
        const box = frame.getBoundingClientRect();
        const drawn = c => window.__kneepointTexts.filter(t => t.canvas === c)
            .map(({text, left, right, clip}) => ({text, left, right, clip}));
        return {right: box.right, left: box.left, visible: cells ? cells.clientWidth : 0,
                header: header ? drawn(header) : [], cells: cells ? drawn(cells) : []};
    });
}"""


def open_phone_view(browser, url: str):  # type: ignore[no-untyped-def]  # noqa: F811
    """open_view at PHONE size with CLIP_HOOK installed as well."""
    context = browser.new_context(viewport=PHONE)
    context.add_init_script(CANVAS_HOOK)
    context.add_init_script(CLIP_HOOK)
    page = context.new_page()
    page.goto(url, timeout=PAGE_NEVER_MS)
    settle(page)
    return page


def columns_shown(frame: dict[str, Any]) -> list[tuple[str, float, float]]:
    """The frame's columns as last drawn, left to right: (header, left, right) of its clip."""
    last: dict[str, tuple[float, float]] = {}
    for text in frame["header"]:
        if text["clip"]:
            last[text["text"]] = (text["clip"][0], text["clip"][1])
    return sorted(((h, a, b) for h, (a, b) in last.items()), key=lambda c: c[1])


def cut_in(frame: dict[str, Any], header: str, left: float, right: float) -> list[str]:
    """What of one column is not whole on screen: the column past the grid's visible edge, or
    its header or a cell's text past the column's bounds (cut there), or ellipsised."""
    problems = []
    if left < -0.5 or right > frame["visible"] + 1:  # 1 px: the grid's border
        problems.append(f"{header!r} spans {left:.0f}..{right:.0f} px of {frame['visible']}")
    texts = [t for t in frame["header"] if t["text"] == header]
    cells = [
        t
        for t in frame["cells"]
        if t["clip"] and abs(t["clip"][0] - left) < 0.5 and abs(t["clip"][1] - right) < 0.5
    ]
    for text in [texts[-1], *cells]:
        if text["left"] < left - 0.5 or text["right"] > right + 0.5 or text["text"].endswith("…"):
            problems.append(
                f"{header!r}: {text['text']!r} drawn at {text['left']:.0f}..{text['right']:.0f}"
                f" in {left:.0f}..{right:.0f}"
            )
    return problems


@pytest.mark.parametrize("path", list(PHONE_TABLES))
def test_tables_on_a_phone_show_what_matters_whole(browser, demo, path: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    spec = next(s for s in PAGES if s.url_path == path)
    url, config = demo
    if path == "audit":  # an audited change, so that the Audit page has a table to show
        subprocess.run(
            [
                *(sys.executable, "-m", "kneepoint.cli", "annotate"),
                *("--config", str(config), "--text", "phone table check"),
            ],
            check=True,
            capture_output=True,
            timeout=120,
            cwd=ROOT,
        )
    page = open_phone_view(browser, page_url(url, spec))
    try:
        assert page.locator("h1").first.inner_text().strip() == spec.title
        assert page.locator(ERROR_BOXES).count() == 0, page.locator(ERROR_BOXES).all_inner_texts()
        frames = page.evaluate(PHONE_GRIDS_JS)
        widths = page.evaluate(WIDTHS_JS)
    finally:
        close_view(page)
    assert widths["document"] <= widths["viewport"] == PHONE["width"], widths
    expected = PHONE_TABLES[path]
    found: set[tuple[str, ...]] = set()
    problems: list[str] = []
    for index, frame in enumerate(frames):
        name = f"table {index + 1}"
        if frame["left"] < 0 or frame["right"] > PHONE["width"]:
            problems.append(f"{name} spans {frame['left']}..{frame['right']} px")
        shown = columns_shown(frame)
        headers = [h for h, _, _ in shown]
        leading = next((e for e in expected if tuple(headers[: len(e)]) == e), None)
        if leading is None:
            problems.append(f"{name} leads with {headers}, none of {expected}")
            continue
        found.add(leading)
        for header, left, right in shown[: len(leading)]:
            problems.extend(f"{name}: {p}" for p in cut_in(frame, header, left, right))
    required = expected[: REQUIRED_TABLES.get(path, 0)]
    problems.extend(f"no table leads with {e}" for e in required if e not in found)
    assert not problems, problems
