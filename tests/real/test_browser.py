"""The running app in a real Chromium: every page opens without an error box, and a link
with page, range and replica in its query string reopens that view."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.registry import PAGES
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.runs import save_run
from kneepoint.twin.ladder import ladder_run
from kneepoint.twin.profiles import gpu, model
from kneepoint.twin.simulated_engine import EngineConfig
from tests.conftest import (
    DCGM_T4,
    VLLM_032,
    Route,
    free_port,
    require_real,
    serving_metrics,
    wait_until_healthy,
)
from tests.seed import seed

CHROMIUM = "/usr/bin/chromium"
ERROR_BOXES = '[data-testid="stException"], [data-testid="stAlertContentError"]'


@pytest.fixture(scope="module")
def app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`kneepoint serve` (collectors, scheduler, app) on a seeded hour of history, scraping
    live targets on loopback: two replicas and a GPU node that answer, one that is down."""
    with serving_metrics() as targets:
        targets.routes = {
            "/a": Route(VLLM_032.read_bytes()),
            "/b": Route(VLLM_032.read_bytes()),
            "/gpus": Route(DCGM_T4.read_bytes()),
            "/down": Route(b"upstream unavailable", status=503),
        }
        config = seed(tmp_path_factory.mktemp("browser"), time.time(), base_url=targets.url(""))
        with open_store(load_config(config).database).begin() as session:  # the Knee page's runs
            for fp8 in (False, True):
                engine = EngineConfig(gpu("rtx4000ada"), model("qwen3-4b"), fp8_weights=fp8)
                run = ladder_run(engine, "fp8" if fp8 else "bf16", "Qwen/Qwen3-4B", (1, 4, 16, 64))
                save_run(session, run, time.time())
        port = free_port()
        log = config.parent / "serve.log"
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kneepoint.cli",
                "serve",
                "--config",
                str(config),
                "--port",
                str(port),
                "--no-browser",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_healthy(process, f"{url}/_stcore/health", 90, log.read_text)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=20)
        assert targets.hits.get("/a", 0) >= 1, "kneepoint serve never scraped its targets"


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        require_real(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require_real("the playwright Python package is not installed")
    with sync_playwright() as playwright:
        # launch() gives Chromium a fresh, temporary profile of its own.
        instance = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
                "--disable-sync",
            ],
        )
        yield instance
        instance.close()


# The script run is over (Streamlit marks its root with the run's state; "initial" before
# the first run), nothing is still loading, and every Plotly chart has been laid out.
RUN_DONE_JS = """() => {
    const app = document.querySelector('[data-testid="stApp"]');
    if (!app || app.dataset.testScriptState !== 'notRunning') return false;
    if (document.querySelector('[data-testid="stSkeleton"], [data-testid="stAppSkeleton"], '
        + '[data-testid="stSpinner"], [data-stale="true"]')) return false;
    return [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].every(c => {
        const g = c.querySelector('.js-plotly-plot');
        return g && g._fullLayout;
    });
}"""
# Two animation frames: whatever the last change scheduled has been painted.
PAINTED_JS = """() => new Promise(done =>
    requestAnimationFrame(() => requestAnimationFrame(() => done(true))))"""


def settled(page) -> None:  # type: ignore[no-untyped-def]
    """Wait until the page's script run has finished and what it sent is drawn, and still is
    after a paint (as bench/screenshots.py's `settle`, without its canvas hook). This replaces
    a fixed 1.5 s pause: shorter on a quick page, and on a page still running after 1.5 s it
    waits for the run's end instead of looking for error boxes too early."""
    for _ in range(2):
        page.wait_for_function(RUN_DONE_JS, timeout=60_000, polling=100)
        page.evaluate(PAINTED_JS)


def open_page(browser, url: str):  # type: ignore[no-untyped-def]
    page = browser.new_page()
    page.goto(url)
    page.wait_for_selector("h1", timeout=60_000)
    # Let the page's own queries finish and render, then look for failures.
    page.wait_for_load_state("networkidle")
    settled(page)
    return page


@pytest.mark.real
@pytest.mark.parametrize("spec", PAGES, ids=lambda spec: spec.url_path)
def test_each_page_opens_without_an_error_box(browser, app_url: str, spec) -> None:  # type: ignore[no-untyped-def]
    # The default page lives at the root; the others at their own path.
    path = "" if spec == PAGES[0] else spec.url_path
    page = open_page(browser, f"{app_url}/{path}")
    try:
        assert page.locator("h1").first.inner_text().strip() == spec.title
        errors = page.locator(ERROR_BOXES)
        assert errors.count() == 0, errors.all_inner_texts()
        assert page.get_by_text("Page not found").count() == 0
    finally:
        page.close()


@pytest.mark.real
def test_a_link_reopens_the_same_page_range_and_replica(browser, app_url: str) -> None:  # type: ignore[no-untyped-def]
    page = open_page(browser, f"{app_url}/?page=health&range=6h&replica=replica-b")
    try:
        page.wait_for_function(
            "document.querySelector('h1')?.innerText.includes('health')", timeout=30_000
        )
        assert page.locator("h1").first.inner_text().strip() == "Collector health"
        sidebar = page.locator('[data-testid="stSidebar"]')
        assert sidebar.get_by_label("Time range").input_value() == "6h"
        assert "replica-b" in sidebar.inner_text()
        assert "range=6h" in page.url and "page=health" in page.url
        assert page.locator(ERROR_BOXES).count() == 0
    finally:
        page.close()


@pytest.mark.real
def test_the_overview_shows_a_tile_per_replica_and_charts(browser, app_url: str) -> None:  # type: ignore[no-untyped-def]
    page = open_page(browser, f"{app_url}/?range=1h")
    try:
        body = page.locator("body").inner_text()
        for name in ("replica-a", "replica-b", "replica-down"):
            assert name in body
        assert "HTTP 503" in body  # replica-down's reason, from the live scrape
        page.wait_for_selector(".js-plotly-plot", timeout=30_000)
        assert page.locator(".js-plotly-plot").count() == 4
    finally:
        page.close()


@pytest.mark.real
def test_the_knee_page_draws_the_runs_and_compares_them(browser, app_url: str) -> None:  # type: ignore[no-untyped-def]
    page = open_page(browser, f"{app_url}/knee")
    try:
        page.wait_for_selector(".js-plotly-plot", timeout=30_000)
        chart = page.locator(".js-plotly-plot").first.inner_text()
        # By default each run as a share of its own peak (the Knee page's normalized view).
        assert "bf16: % of peak" in chart and "fp8: % of peak" in chart and "knee" in chart
        body = page.locator("body").inner_text()
        assert "Compare two runs" in body and "better" in body  # fp8 against bf16
        assert page.locator(ERROR_BOXES).count() == 0
    finally:
        page.close()
