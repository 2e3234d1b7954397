"""The What-if page in a real Chromium: the app (`kneepoint serve --no-collect`) over a stored
day of a twin replica and its sweep. Uncalibrated it says so; Calibrate (the local user,
admin on loopback) fits and stores the twin; Replay shows measured, baseline and predicted
numbers and five before/after charts, with no error box and no None or NaN on the page.
(tests/real/test_browser.py opens every page of app/registry.PAGES, this one included.)"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app.test_whatif_page import REPLICA, store_day
from tests.conftest import free_port, wait_until_healthy
from tests.real.test_browser import ERROR_BOXES, browser, open_page  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def whatif_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("whatif-browser")
    config_file = store_day(folder)
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
                "--no-collect",  # the stored day is all there is
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_healthy(process, f"{url}/_stcore/health", 90, Path(log).read_text)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=20)


@pytest.mark.real
def test_calibrate_and_replay_in_chromium(browser, whatif_app: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    page = open_page(browser, f"{whatif_app}/what-if")
    try:
        assert page.locator("h1").first.inner_text().strip() == "What-if"
        page.get_by_text(f"{REPLICA} has no calibration yet").wait_for(timeout=30_000)
        main = page.locator('[data-testid="stMain"]')
        main.get_by_label("Window replayed").click()
        page.get_by_role("option", name="1d", exact=True).click()
        page.get_by_role("button", name="Calibrate").click()
        page.get_by_text("Fitted points", exact=True).wait_for(timeout=120_000)
        fit = page.locator('[data-testid="stMetric"]').first.inner_text().split("\n")
        assert fit[0] == "Fit" and fit[-1] == "trusted", fit
        page.get_by_role("button", name="Replay the window").click()
        page.get_by_text("Before and after: --kv-cache-dtype fp8").wait_for(timeout=300_000)
        page.wait_for_function(
            "document.querySelectorAll('.js-plotly-plot').length >= 5", timeout=60_000
        )
        charts = page.locator(".js-plotly-plot")
        assert charts.count() == 5
        titles = " ".join(charts.all_inner_texts())
        for title in ("Preemptions", "Throughput", "TTFT p99", "P95 KV occupancy"):
            assert f"{title}: before and after" in titles, titles
        assert "measured" in titles and "predicted" in titles  # the bars' names
        metrics = page.locator('[data-testid="stMetric"]').all_inner_texts()
        throughput = next(m for m in metrics if m.startswith("Throughput"))
        assert re.search(r"[\d,]+ tok/s", throughput), throughput
        body = page.locator("body").inner_text()
        assert "Replayed " in body
        assert not re.search(r"\bNone\b|\bNaN\b|\bnan\b", body), body
        errors = page.locator(ERROR_BOXES)
        assert errors.count() == 0, errors.all_inner_texts()
    finally:
        page.close()
