"""The timeline's markers in a real Chromium: the app (`kneepoint serve --no-collect`) over a
twin replica's stored history (tests/timeline_scenario.py: restarted, reconfigured,
upgraded, given an XID); every time-series chart marks each change once, at its time, and
hovering a marker shows what changed."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from kneepoint.config import load_config
from tests.conftest import free_port, migrated, wait_until_healthy
from tests.real.test_browser import ERROR_BOXES, browser, open_page  # noqa: F401 (a fixture)
from tests.timeline_scenario import FIRE, STEP, UPGRADE, expected, store_history, write_config

pytestmark = pytest.mark.timeout(180)
TOKEN = secrets.token_hex(24)

# Every chart's markers, as Plotly holds them on each graph div.
MARKERS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(g =>
    (g.data || []).filter(t => t.name === 'changes')
        .map(t => ({x: t.x, kind: t.customdata, text: t.text})))"""


@pytest.fixture(scope="module")
def timeline_app(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, set[tuple[str, float]], dict[int, float], str]]:
    folder = tmp_path_factory.mktemp("timeline")
    config_file = write_config(folder)
    with config_file.open("a") as config:  # the annotation API, started by `kneepoint serve`
        config.write(f"auth:\n  mode: none\n  api_tokens: [{{name: ci, token: {TOKEN}}}]\n")
    migrated(config_file)
    start = float(int(time.time())) - (FIRE + 4) * STEP  # all of it in the last hour
    at = store_history(load_config(config_file), start)
    port, api_port = free_port(), free_port()
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
                "--api-port",
                str(api_port),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_healthy(process, f"{url}/_stcore/health", 90, Path(log).read_text)
            yield url, expected(at), at, f"http://127.0.0.1:{api_port}"
        finally:
            process.terminate()
            process.wait(timeout=20)


@pytest.mark.real
def test_every_chart_marks_each_change_once_and_shows_it_on_hover(
    browser,  # type: ignore[no-untyped-def]  # noqa: F811 (the fixture imported above)
    timeline_app: tuple[str, set[tuple[str, float]], dict[int, float], str],
) -> None:
    url, wanted, at, _ = timeline_app
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
        # One label per trace, or (x-unified hover, the charts' default) one box for all.
        hover = chart.locator(".hoverlayer .hovertext, .hoverlayer .legend")
        hover.first.wait_for(timeout=10_000)
        shown = hover.first.text_content() or ""
        assert "upgrade on r1" in shown and "v1-0.10" in shown, shown
    finally:
        page.close()


@pytest.mark.real
def test_a_deploy_posted_to_kneepoint_serves_api_is_marked_on_the_charts(
    browser,  # type: ignore[no-untyped-def]  # noqa: F811 (the fixture imported above)
    timeline_app: tuple[str, set[tuple[str, float]], dict[int, float], str],
) -> None:
    url, _, _, api = timeline_app
    request = urllib.request.Request(
        f"{api}/api/v1/annotations",
        data=json.dumps({"replica": "r1", "text": "prompt v42"}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 201
        posted = json.loads(answer.read())["at"]
    page = open_page(browser, f"{url}/?range=1h&replica=r1")
    try:
        page.wait_for_function(
            f"({MARKERS_JS})().some(t => t.length && t[0].kind.includes('annotation'))",
            timeout=30_000,
        )
        for (trace,) in page.evaluate(MARKERS_JS):
            notes = [
                (pd.Timestamp(x).timestamp(), text)
                for kind, x, text in zip(trace["kind"], trace["x"], trace["text"], strict=True)
                if kind == "annotation"
            ]
            assert len(notes) == 1 and abs(notes[0][0] - posted) < 1e-3
            assert "prompt v42" in notes[0][1] and "api:ci" in notes[0][1]
    finally:
        page.close()
