"""Screenshots of every page of the app, at desktop (1440 × 900) and phone (390 × 844) size,
in a real Chromium, on the demo (`kneepoint demo`: the twin fleet, its backfilled week, live
traffic, the collectors and alert evaluation), so a reviewer can look at the app without
running it.

    .venv/bin/python bench/screenshots.py [--out DIR] [--pages overview,alerts] [--full]
                                         [--url http://127.0.0.1:8501]

Starts the demo on a free loopback port, waits for data from every replica and for its first
firing alert, opens each page once per size, waits until the page has rendered (its script
has run, every chart drawn, every table painted), and writes DIR/PAGE-desktop.png and
DIR/PAGE-phone.png (DIR defaults to a new temporary folder); prints each path. --full takes
the whole length of the page instead of the first screen. Images are written as 256-colour
PNGs (small enough to commit); --raw keeps Chromium's full-colour ones. --url takes an app
that is already running instead of starting the demo.

tests/real/test_cockpit_browser.py starts the demo and waits for pages with the same helpers
(running_demo, open_view).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.registry import PAGES, PageSpec  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}
# Hang guards, not expectations: how long a broken demo or page may take to show it is broken.
NEVER = 600.0  # seconds: the demo's backfill, first scrapes and first alert evaluation (it took
# 290 s under a load of 40 on 2 cores)
PAGE_NEVER_MS = 120_000  # one page's script, charts and tables
FULL_PAGE_MAX = 8000  # pixels: --full stops there

# Installed in every page before its scripts: records each text drawn on a canvas (what a
# dataframe's grid shows, its placeholders for missing values included, which its accessible
# table leaves empty) and marks each canvas drawn on.
CANVAS_HOOK = """(() => {
    const drawn = window.__kneepointDrawn = [];
    const mark = (canvas) => { if (canvas) canvas.__kneepointPainted = true; };
    const types = [window.CanvasRenderingContext2D, window.OffscreenCanvasRenderingContext2D];
    for (const type of types) {
        if (!type) continue;
        const proto = type.prototype;
        const fillText = proto.fillText, drawImage = proto.drawImage;
        proto.fillText = function (text, ...rest) {
            drawn.push(String(text));
            mark(this.canvas);
            return fillText.call(this, text, ...rest);
        };
        proto.drawImage = function (...args) {
            mark(this.canvas);
            return drawImage.apply(this, args);
        };
    }
})()"""
# Done when the page's script (and every fragment) is idle, no element is still a loading
# skeleton or stale, every chart has been laid out by Plotly and every dataframe has painted.
RENDERED_JS = """() => {
    const app = document.querySelector('[data-testid="stApp"]');
    if (!app || app.dataset.testScriptState !== 'notRunning') return false;
    if (!document.querySelector('h1')) return false;
    if (document.querySelector('[data-testid="stSkeleton"], [data-testid="stAppSkeleton"], '
        + '[data-testid="stSpinner"], [data-stale="true"]')) return false;
    const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')];
    if (!charts.every(c => { const g = c.querySelector('.js-plotly-plot');
                             return g && g._fullLayout; })) return false;
    const frames = [...document.querySelectorAll('[data-testid="stDataFrame"]')];
    return frames.every(f => f.querySelector('table[role="grid"]')
        && [...f.querySelectorAll('canvas')].some(c => c.__kneepointPainted));
}"""
# Two animation frames: whatever the last change scheduled has been painted.
PAINTED_JS = """() => new Promise(done =>
    requestAnimationFrame(() => requestAnimationFrame(() => done(true))))"""


def page_url(base: str, spec: PageSpec, query: str = "") -> str:
    """The page's address: the first page is served at the root, the others at their path."""
    path = "" if spec == PAGES[0] else spec.url_path
    return f"{base}/{path}" + (f"?{query}" if query else "")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli_json(*args: str) -> Any:
    """A `kneepoint ... --json` command's output."""
    shown = subprocess.run(
        [sys.executable, "-m", "kneepoint.cli", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    if shown.returncode != 0:
        raise RuntimeError(f"kneepoint {' '.join(args)} failed: {shown.stderr[-2000:]}")
    return json.loads(shown.stdout)


def firing(config: Path) -> set[tuple[str, str | None]]:
    """(rule, replica) of each firing alert, as `kneepoint alerts list --json` lists them."""
    listed = cli_json("alerts", "list", "--config", str(config))["alerts"]
    return {(a["rule"], a["replica"]) for a in listed if a["state"] == "firing"}


def demo_ready(config: Path) -> bool:
    """Every replica scraped with tokens flowing, and at least one alert firing."""
    report = cli_json("status", "--window", "1m", "--config", str(config))
    replicas = report["replicas"]
    flowing = all(r["up"] and r["generation_tokens_per_second"] for r in replicas)
    return bool(replicas) and flowing and bool(firing(config))


# A watchdog (as kube-prometheus ships one): fires on every replica that answers its scrapes,
# so the demo has a firing alert from its first evaluation. The demo's own rules fire only at
# some points of its live load shape (a day every 30 minutes of wall-clock time) or under a
# loaded collector: a page that must show firing alerts cannot wait on that.
WATCHDOG = {
    "rules": [
        {
            "name": "watchdog",
            "metric": "up",
            "op": "==",
            "threshold": 1,
            "for": "0s",
            "severity": "ticket",
            "runbook": "Always firing while a replica answers: proves the alert pipeline works.",
        }
    ]
}


@contextmanager
def running_demo(folder: Path, never: float = NEVER) -> Iterator[tuple[str, Path]]:
    """`kneepoint demo` on a free loopback port with its config and database in `folder`,
    WATCHDOG added to its rules; yields (app URL, config file) once it is ready (demo_ready),
    stops it with Ctrl-C after."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = folder / "demo.log"
    rules = folder / "watchdog.yaml"
    rules.write_text(yaml.safe_dump(WATCHDOG))
    url = f"http://127.0.0.1:{port}"
    config = folder / "demo" / "kneepoint.yaml"
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kneepoint.cli",
                "demo",
                "--dir",
                str(folder / "demo"),
                "--port",
                str(port),
                "--no-browser",
                "--rules",
                str(rules),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        deadline = time.monotonic() + never
        healthy = False
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"kneepoint demo exited with {process.returncode}: {log.read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the demo was not ready (healthy app, data from every replica, a firing "
                    f"alert) within {never:g}s: {log.read_text()[-3000:]}"
                )
            if not healthy:
                with suppress(httpx.HTTPError):
                    healthy = httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200
            elif config.exists() and demo_ready(config):
                break
            time.sleep(1)
        yield url, config
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=20)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a fresh temporary profile) driven by Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


def settle(page: Any) -> None:
    """Wait until the page has rendered (RENDERED_JS), still is after a paint, and is painted."""
    page.wait_for_selector("h1", timeout=PAGE_NEVER_MS)
    for _ in range(2):
        page.wait_for_function(RENDERED_JS, timeout=PAGE_NEVER_MS, polling=250)
        page.evaluate(PAINTED_JS)


def open_view(browser: Any, url: str, viewport: dict[str, int]) -> Any:
    """A new page (its own context, CANVAS_HOOK installed) at `viewport` size, opened on `url`
    and rendered."""
    context = browser.new_context(viewport=viewport)
    context.add_init_script(CANVAS_HOOK)
    page = context.new_page()
    page.goto(url, timeout=PAGE_NEVER_MS)
    settle(page)
    return page


def close_view(page: Any) -> None:
    context = page.context
    page.close()
    context.close()


def shoot(page: Any, path: Path, full: bool) -> None:
    """A screenshot of the first screen or (full) of the main area's whole length: Streamlit
    scrolls its main area, not the document, so the viewport grows to hold it all."""
    if full:
        height = page.evaluate(
            "() => document.querySelector('[data-testid=\"stMain\"]')?.scrollHeight || 0"
        )
        size = page.viewport_size
        if height > size["height"]:
            page.set_viewport_size({"width": size["width"], "height": min(height, FULL_PAGE_MAX)})
            settle(page)
    page.screenshot(path=str(path))


def small_png(path: Path) -> None:
    """Rewrite a screenshot as a 256-colour PNG (a UI has few colours; no dithering)."""
    from PIL import Image

    with Image.open(path) as image:
        fewer = image.convert("RGB").quantize(
            colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
        )
    fewer.save(path, optimize=True)


def screenshots(
    base: str, out: Path, specs: list[PageSpec], full: bool = False, raw: bool = False
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with chromium() as browser:
        for spec in specs:
            for size_name, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
                page = open_view(browser, page_url(base, spec), viewport)
                try:
                    path = out / f"{spec.url_path}-{size_name}.png"
                    shoot(page, path, full)
                finally:
                    close_view(page)
                if not raw:
                    small_png(path)
                print(path, flush=True)
                written.append(path)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the PNGs (default: a new tmp dir)")
    parser.add_argument(
        "--pages",
        help="comma-separated url paths (default: every page): "
        + ",".join(s.url_path for s in PAGES),
    )
    parser.add_argument("--full", action="store_true", help="the whole page, not the first screen")
    parser.add_argument("--raw", action="store_true", help="keep full-colour PNGs")
    parser.add_argument("--url", help="an app already running (the demo is not started)")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        parser.error(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    specs = list(PAGES)
    if args.pages:
        wanted = args.pages.split(",")
        unknown = set(wanted) - {s.url_path for s in PAGES}
        if unknown:
            parser.error(f"--pages: no page {', '.join(sorted(unknown))}")
        specs = [s for s in PAGES if s.url_path in wanted]
    out = args.out or Path(tempfile.mkdtemp(prefix="kneepoint-screenshots-"))
    if args.url:
        screenshots(args.url.rstrip("/"), out, specs, args.full, args.raw)
        print(f"screenshots in {out}")
        return 0
    with tempfile.TemporaryDirectory(prefix="kneepoint-screenshots-demo-") as folder:
        began = time.monotonic()
        print("starting the demo (backfill, first scrapes, first alert evaluation)", flush=True)
        with running_demo(Path(folder)) as (url, _):
            print(f"demo ready at {url} after {time.monotonic() - began:.0f}s", flush=True)
            screenshots(url, out, specs, args.full, args.raw)
    print(f"screenshots in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
