"""The timeline's markers in a real Chromium: the app (`kneepoint serve --no-collect`) over a
twin replica's stored history (tests/timeline_scenario.py: restarted, reconfigured,
upgraded, given an XID); every time-series chart marks each change once, at its time, and
hovering a marker shows what changed."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from kneepoint.config import load_config
from tests.conftest import free_port, migrated, wait_until_healthy
from tests.real.test_browser import ERROR_BOXES, browser, open_page  # noqa: F401 (a fixture)
from tests.timeline_scenario import FIRE, STEP, UPGRADE, expected, store_history, write_config

pytestmark = pytest.mark.timeout(180)

# Every chart's markers, as Plotly holds them on each graph div.
MARKERS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(g =>
    (g.data || []).filter(t => t.name === 'changes')
        .map(t => ({x: t.x, kind: t.customdata, text: t.text})))"""


@pytest.fixture(scope="module")
def timeline_app(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, set[tuple[str, float]], dict[int, float]]]:
    folder = tmp_path_factory.mktemp("timeline")
    config_file = migrated(write_config(folder))
    start = float(int(time.time())) - (FIRE + 4) * STEP  # all of it in the last hour
    at = store_history(load_config(config_file), start)
    port = free_port()
    log = folder / "serve.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kneepoint.cli",
                "serve",
                "--config",
                str(config_file),
                "--port",
                str(port),
                "--no-browser",
                "--no-collect",  # the stored history is all there is
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_healthy(process, f"{url}/_stcore/health", 90, Path(log).read_text)
            yield url, expected(at), at
        finally:
            process.terminate()
            process.wait(timeout=20)


@pytest.mark.real
def test_every_chart_marks_each_change_once_and_shows_it_on_hover(
    browser,  # type: ignore[no-untyped-def]  # noqa: F811 (the fixture imported above)
    timeline_app: tuple[str, set[tuple[str, float]], dict[int, float]],
) -> None:
    url, wanted, at = timeline_app
    kinds = {kind for kind, _ in wanted}
    page = open_page(browser, f"{url}/?range=1h&replica=r1")
    try:
        page.wait_for_selector(".js-plotly-plot", timeout=30_000)
        page.wait_for_function(
            f"({MARKERS_JS})().some(traces => traces.length > 0)", timeout=30_000
        )
        charts = page.evaluate(MARKERS_JS)
        assert len(charts) >= 2 and all(len(traces) == 1 for traces in charts), charts
        for (trace,) in charts:
            marks = [
                (kind, pd.Timestamp(x).timestamp())
                for kind, x in zip(trace["kind"], trace["x"], strict=True)
                if kind in kinds
            ]
            assert sorted(marks) == sorted(wanted)  # each change once, at its time
        assert page.locator(ERROR_BOXES).count() == 0

        # Hover the upgrade's marker on the first chart: its detail shows.
        (first,) = charts[0]
        index = next(
            i
            for i, (kind, x) in enumerate(zip(first["kind"], first["x"], strict=True))
            if kind == "upgrade" and pd.Timestamp(x).timestamp() == at[UPGRADE]
        )
        chart = page.locator(".js-plotly-plot").first
        point = chart.locator(".overplot .xy2 .scatterlayer path.point").nth(index)
        point.hover(force=True)
        hover = chart.locator(".hoverlayer .hovertext")
        hover.first.wait_for(timeout=10_000)
        shown = hover.first.text_content() or ""
        assert "upgrade on r1" in shown and "v1-0.10" in shown, shown
    finally:
        page.close()
