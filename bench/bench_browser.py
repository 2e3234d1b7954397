"""Browser bench: the demo's pages as Chromium shows them, against a bare Streamlit page served
from the same environment in the same run.

    .venv/bin/python bench/bench_browser.py [--pages overview,alerts] [--repeats 3]
        [--sessions 20] [--concurrent-pages overview,...] [--first-pages overview,...]
        [--page-timeout 60] [--minutes 20] [--source DIR] [--config FILE]

Starts `kneepoint demo` (its twin fleet, backfilled week, collectors and app; the watchdog rule
of bench/screenshots.py added so an alert fires from the first evaluation) with the product
code of --source (default: this checkout) on its PYTHONPATH, waits until every replica has
been scraped up and an alert fires, and starts a bare app: two one-line pages
(`st.title(...)`) under st.navigation, served by `streamlit run` from the same Python.
With --config FILE, the app alone (`kneepoint serve --no-collect`) on that config's store as it
is stands in for the demo (the bench's smoke test does this: no backfill to wait for).

Rendered and idle, the same rule for both apps: the page's h1 is its title (st.title), the
app's script state is notRunning, the status widget does not say Running, no skeleton,
spinner or stale element is left, every Plotly chart has been laid out and every dataframe's
canvas painted, and all of that holds for two more animation frames. A time is from the
navigation's start (the document's time origin; for a click in an open tab, the click) to the
first frame of that state, read in the page (performance.now()), so pages waited on one after
the other are each timed from their own start. Network idle is not part of it: Streamlit
talks over one WebSocket, which never goes idle while a session is open.

For each page, median of --repeats:
- open tab: a click on its link in the sidebar of a tab already showing another page;
- new tab: a chat link (`/?page=<url_path>`) opened in a new tab of a browser that has the
  app's static files cached;
- first session: the same link, in a fresh browser profile, as the first session of an app
  process just started (`kneepoint serve --no-collect` on the demo's config and store;
  `streamlit run` for the bare page), for the pages in --first-pages;
- --sessions at once: that many fresh profiles open the link together; the median of their
  times (for the pages in --concurrent-pages), and the app process's resident memory after.

Bounded on a loaded machine: a page not rendered and idle within --page-timeout seconds (the
sessions at once: twice that) is reported as "not rendered", not waited on; --minutes is
shared among the phases (open tab, new tab, sessions at once, first sessions): each phase's
first round always runs (every page measured once), a further repeat only while the phase's
share is left, and a try not run is reported as skipped. Each try is printed as it is measured.

Prints each time and its ratio to the bare page's, and the aims of issue 25 (open and new tab
≤ 1.2× the bare page, first session ≤ 2× it, N sessions' median ≤ 1.5× a single session's).
A median is the middle try's (the lower of the two middle ones for an even count), so that
its breakdown can be printed with it: where an open tab's, a new tab's and a first session's
time went, as the page saw it (STATES_HOOK): the script runs the server made (a chat link's
switch to its page is a second one, and so is the footer's rerun every 15 s when a try lasts
that long), when the last one ended (its deltas all received: the server's script time plus
their transfer), what came over the WebSocket until rendered, and the rest: Chromium drawing
what had arrived. Each phase's figures are also printed as soon as they are measured.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_pages import checkout_label, page_titles  # noqa: E402
from screenshots import CANVAS_HOOK, CHROMIUM, CHROMIUM_ARGS, DESKTOP, WATCHDOG  # noqa: E402

from tests.conftest import free_port  # noqa: E402

NEVER = 600.0  # seconds: the demo's backfill and first alert (290 s under a load of 40)
PAGE_LIMIT_S = 60.0  # default --page-timeout: a page that takes longer is "not rendered"
MINUTES = 20.0  # default --minutes: the measuring's budget (the demo's start not included)
# Each phase's share of --minutes, in the order they run; the first round of each always runs.
SHARES = {"open": 0.25, "new": 0.25, "many": 0.2, "first": 0.3}
NOT_RENDERED = "not rendered within"
SKIPPED = "skipped"
# Without --pages: the pages timed as a first session (an app start each: 20–60 s here) and
# with --sessions at once. The Overview is the landing page; Capacity the heaviest page of
# stop 32; Collector health the lightest.
FIRST_PAGES = ("overview", "capacity", "health")
CONCURRENT_PAGES = ("overview",)
OPEN_TAB_AIM, NEW_TAB_AIM, FIRST_AIM, CONCURRENT_AIM = 1.2, 1.2, 2.0, 1.5
BARE_APP = """import streamlit as st

st.navigation(
    [
        st.Page(lambda: st.title("Bare one"), title="Bare one", url_path="one", default=True),
        st.Page(lambda: st.title("Bare two"), title="Bare two", url_path="two"),
    ]
).run()
"""
BARE = ("", "Bare one")  # (url path, title) of the bare app's page that is timed
BARE_OTHER = ("two", "Bare two")

# Polled every animation frame with the page's title: see "Rendered and idle" above. Returns
# the performance.now() of the first frame of the state once it has held for two more.
DONE_JS = """(want) => {
    const w = window;
    const app = document.querySelector('[data-testid="stApp"]');
    const h1 = document.querySelector('[data-testid="stMain"] h1');
    const running = [...document.querySelectorAll('[data-testid="stStatusWidget"]')]
        .some(e => /Running/i.test(e.textContent));
    let ok = !!app && app.dataset.testScriptState === 'notRunning' && !running && !!h1
        && h1.textContent.trim() === want
        && !document.querySelector('[data-testid="stSkeleton"], [data-testid="stAppSkeleton"], '
            + '[data-testid="stSpinner"], [data-stale="true"]');
    if (ok) ok = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].every(c => {
        const g = c.querySelector('.js-plotly-plot'); return g && g._fullLayout; });
    if (ok) ok = [...document.querySelectorAll('[data-testid="stDataFrame"]')].every(f =>
        f.querySelector('table[role="grid"]')
        && [...f.querySelectorAll('canvas')].some(c => c.__kneepointPainted));
    const now = performance.now();
    if (!ok) { w.__kpSince = undefined; return false; }
    if (w.__kpSince === undefined) { w.__kpSince = now; w.__kpFrames = 0; return false; }
    w.__kpFrames += 1;
    return w.__kpFrames >= 2 ? w.__kpSince : false;
}"""
# Installed in every page before its scripts: notes each change of the app's script state
# (running, notRunning, ...) and each WebSocket message received (its size), with its
# performance.now(), so a try's time can be split (WHERE_JS).
STATES_HOOK = """(() => {
    const w = window;
    w.__kpStates = [];
    w.__kpMessages = [];
    const push = (state) => {
        const last = w.__kpStates[w.__kpStates.length - 1];
        if (state && (!last || last[1] !== state)) w.__kpStates.push([performance.now(), state]);
    };
    const note = (e) => push(e.dataset && e.dataset.testScriptState);
    // An attribute record's value is the next record's old value (or the current one for
    // the last): a whole run (notRunning, running, notRunning) delivered in one batch to a
    // busy page would otherwise read notRunning twice and count no run.
    new MutationObserver(records => { records.forEach((r, i) => {
        if (r.type === 'attributes') {
            const next = records.slice(i + 1).find(
                (o) => o.type === 'attributes' && o.target === r.target);
            push(next ? next.oldValue : r.target.dataset.testScriptState);
            return;
        }
        for (const n of r.addedNodes) if (n.nodeType === 1) {
            note(n); n.querySelectorAll('[data-test-script-state]').forEach(note);
        }
    }); }).observe(document, {subtree: true, childList: true, attributes: true,
                              attributeOldValue: true,
                              attributeFilter: ['data-test-script-state']});
    const Native = w.WebSocket;
    w.WebSocket = class extends Native {
        constructor(...args) {
            super(...args);
            this.addEventListener('message', (m) => {
                const d = m.data;
                w.__kpMessages.push([performance.now(), d.byteLength ?? d.size ?? d.length ?? 0]);
            });
        }
    };
})();"""
# A try's breakdown between its start and its rendered-and-idle frame (performance.now()):
# script runs begun, the end of the last one, WebSocket messages and bytes received.
WHERE_JS = """([t0, t1]) => {
    const within = (list) => list.filter(([t]) => t >= t0 && t <= t1);
    const states = within(window.__kpStates || []);
    const ends = states.filter(([, s]) => s === 'notRunning').map(([t]) => t);
    const messages = within(window.__kpMessages || []);
    return {
        runs: states.filter(([, s]) => s === 'running').length,
        script: ends.length ? ends[ends.length - 1] - t0 : null,
        messages: messages.length,
        bytes: messages.reduce((sum, [, n]) => sum + n, 0),
    };
}"""
# Clicks the sidebar link to a page (url path; '' for the default page) and notes when.
CLICK_JS = """(path) => {
    const links = [...document.querySelectorAll(
        '[data-testid="stSidebarNavLink"], [data-testid="stSidebarNav"] a')];
    const link = links.find(a => new URL(a.href).pathname.replace(/\\/$/, '')
        === (path ? '/' + path : ''));
    if (!link) return null;
    window.__kpSince = undefined;
    const t0 = performance.now();
    link.click();
    return t0;
}"""


def say(line: str = "") -> None:
    print(line, flush=True)


# -- the apps ---------------------------------------------------------------------------------


def healthy(url: str) -> bool:
    with suppress(httpx.HTTPError):
        return httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200
    return False


def stop(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C for the process group we started (the demo stops its app and twin on it)."""
    if process.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=20)
    with suppress(ProcessLookupError):  # anything of the group left behind
        os.killpg(process.pid, signal.SIGKILL)


@contextmanager
def started(command: list[str], source: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(source)}
    with log.open("ab") as output:
        process = subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=source,
            env=env,
            start_new_session=True,  # its own process group: stopped as a whole
        )
    try:
        yield process
    finally:
        stop(process)


def wait_until(check: Callable[[], bool], process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + NEVER
    while not check():
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready within {NEVER:g} s: {log.read_text()[-3000:]}")
        time.sleep(1)


def demo_ready(database: Path) -> bool:
    """Every replica scraped and up, and an alert firing: read from the demo's SQLite store
    directly, so that any checkout's schema will do."""
    if not database.exists():
        return False
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as db:
            down = db.execute(
                "SELECT count(*) FROM targets WHERE kind != 'dcgm' AND (up IS NULL OR NOT up)"
            ).fetchone()[0]
            replicas = db.execute("SELECT count(*) FROM targets WHERE kind != 'dcgm'").fetchone()
            firing = db.execute("SELECT count(*) FROM alerts WHERE state = 'firing'").fetchone()
        return bool(replicas[0]) and down == 0 and bool(firing[0])
    except sqlite3.Error:  # tables not made yet, or busy
        return False


def app_pid(port: int) -> int | None:
    """The Streamlit process serving `port` (the demo's app is a child of the demo)."""
    wanted = str(port).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError):
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if any(b"streamlit" in a or b"appserver" in a for a in args) and wanted in args:
                return int(entry.name)
    return None


def memory_mib(pid: int | None) -> tuple[float, float]:
    """Resident and peak resident memory (VmRSS, VmHWM) of a process, MiB."""
    if pid is None:
        return float("nan"), float("nan")
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def serve_command(config: Path, port: int) -> list[str]:
    """The app alone on a config's store: another process collects (or none does)."""
    return [
        *(sys.executable, "-m", "kneepoint.cli", "serve", "--no-collect", "--no-browser"),
        *("--config", str(config), "--port", str(port)),
    ]


def bare_command(script: Path, port: int) -> list[str]:
    return [
        sys.executable,
        *("-m", "streamlit", "run", str(script)),
        *("--server.headless", "true", "--server.address", "127.0.0.1"),
        *("--server.port", str(port), "--browser.gatherUsageStats", "false"),
        *("--server.fileWatcherType", "none"),
    ]


# -- timing in Chromium -----------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """One try: seconds to rendered and idle, and where they went (WHERE_JS)."""

    seconds: float
    script: float | None  # seconds to the end of the last script run; None: none seen
    runs: int  # script runs begun
    messages: int  # WebSocket messages received
    bytes: int


@dataclass
class Pace:
    """The bounds of a phase: `limit_s` for one page to render (else "not rendered"), and when
    the phase's share of --minutes ends (time.monotonic()): its first round always runs, a
    further one only before then."""

    limit_s: float
    ends: float = float("inf")

    def phase(self, seconds: float) -> Pace:
        return Pace(self.limit_s, time.monotonic() + seconds)

    def another(self, round_: int) -> bool:
        """Whether round `round_` (0 the first) of the phase runs."""
        return round_ == 0 or time.monotonic() < self.ends


def rendered(page: Any, title: str, limit_s: float) -> float:
    """performance.now() of the first frame of the rendered-and-idle state (DONE_JS)."""
    handle = page.wait_for_function(DONE_JS, arg=title, polling="raf", timeout=limit_s * 1000)
    return float(handle.json_value())


def timing(page: Any, began: float, done: float) -> Timing:
    """The try from `began` to `done` (performance.now(), ms) and its breakdown."""
    where = page.evaluate(WHERE_JS, [began, done])
    script = None if where["script"] is None else float(where["script"]) / 1000
    return Timing((done - began) / 1000, script, where["runs"], where["messages"], where["bytes"])


def seconds_to_render(page: Any, title: str, deadline: float) -> Timing:
    """From the navigation's start (the document's time origin) to rendered and idle,
    waiting until `deadline` (time.monotonic()) at most."""
    return timing(page, 0.0, rendered(page, title, max(1.0, deadline - time.monotonic())))


def navigate(page: Any, url: str, title: str, limit_s: float) -> Timing:
    """From the navigation's start to rendered and idle."""
    page.goto(url, wait_until="commit", timeout=limit_s * 1000)
    return timing(page, 0.0, rendered(page, title, limit_s))


def click(page: Any, path: str, title: str, limit_s: float) -> Timing:
    """From a click on the page's sidebar link to rendered and idle."""
    began = page.evaluate(CLICK_JS, path)
    if began is None:
        raise RuntimeError(f"no sidebar link to /{path}")
    return timing(page, float(began), rendered(page, title, limit_s))


def hooked(browser: Any) -> Any:
    """A fresh browser profile whose pages run CANVAS_HOOK and STATES_HOOK."""
    context = browser.new_context(viewport=DESKTOP)
    context.add_init_script(CANVAS_HOOK)
    context.add_init_script(STATES_HOOK)
    return context


def fresh_tab(browser: Any) -> Any:
    return hooked(browser).new_page()


def close(page: Any) -> None:
    context = page.context
    page.close()
    context.close()


def link(base: str, path: str) -> str:
    """A chat link to a kneepoint page: the router's ?page= form
    (docs/how-to/alerts.md)."""
    return f"{base}/?page={path}" if path else f"{base}/"


def direct(base: str, path: str) -> str:
    """A page's own address (the bare app has no router: its links are these)."""
    return f"{base}/{path}"


Try = Timing | str  # a try's timing, or why there is none


def guarded(work: Callable[[], Timing], limit_s: float, what: str = "") -> Try:
    """The try's timing; a page that does not render in time, or fails, is reported (and
    printed with `what`, if given, as it comes), not a crash or a hang."""
    try:
        result: Try = work()
    except Exception as error:
        if type(error).__name__ == "TimeoutError":  # Playwright's: the page never settled
            result = f"{NOT_RENDERED} {limit_s:g} s"
        else:
            result = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    if what:
        say(f"      {what}: {brief(result)}")
    return result


def open_tab(
    browser: Any,
    base: str,
    pages: list[tuple[str, str]],
    other: tuple[str, str],
    repeats: int,
    pace: Pace,
) -> dict[str, list[Try]]:
    """Click through `pages` in one tab, `repeats` times (while the phase has time); a page is
    always reached from another one (`other` when it is the only one)."""
    times: dict[str, list[Try]] = {path: [] for path, _ in pages}
    tab = fresh_tab(browser)
    limit = pace.limit_s
    try:
        start = other if len(pages) == 1 else pages[-1]
        opened = guarded(partial(navigate, tab, direct(base, start[0]), start[1], limit), limit)
        if isinstance(opened, str):  # no tab to click in: every page's error
            return {path: [f"opening {start[0] or '/'}: {opened}"] for path, _ in pages}
        current = start[0]
        for round_ in range(repeats):
            if not pace.another(round_):
                break
            for path, title in pages:
                if current == path:
                    guarded(partial(click, tab, other[0], other[1], limit), limit)
                try_ = partial(click, tab, path, title, limit)
                times[path].append(guarded(try_, limit, f"open tab {title}"))
                current = path
    finally:
        close(tab)
    return times


def new_tab(
    browser: Any,
    base: str,
    pages: list[tuple[str, str]],
    repeats: int,
    pace: Pace,
    bare: bool = False,
) -> dict[str, list[Try]]:
    """Each page's chat link in a new tab of one browser profile (its cache warm), `repeats`
    times while the phase has time."""
    address = direct if bare else link
    context = hooked(browser)
    times: dict[str, list[Try]] = {path: [] for path, _ in pages}
    limit = pace.limit_s
    try:
        warm = context.new_page()
        warmed = partial(navigate, warm, address(base, pages[0][0]), pages[0][1], limit)
        guarded(warmed, limit)  # the static files, cached
        for round_ in range(repeats):
            if not pace.another(round_):
                break
            for path, title in pages:
                tab = context.new_page()
                try_ = partial(navigate, tab, address(base, path), title, limit)
                times[path].append(guarded(try_, limit, f"new tab {title}"))
                tab.close()
        warm.close()
    finally:
        context.close()
    return times


def first_session(
    browser: Any,
    start: Callable[[], Any],
    base: str,
    spec: tuple[str, str],
    repeats: int,
    pace: Pace,
) -> list[Try]:
    """The page as the first session of a just-started app, in a fresh profile, `repeats`
    times while the phase has time."""
    path, title = spec
    address = direct(base, path) if title.startswith("Bare") else link(base, path)
    times: list[Try] = []
    for round_ in range(repeats):
        if not pace.another(round_):
            break
        with start():
            tab = fresh_tab(browser)
            try:
                try_ = partial(navigate, tab, address, title, pace.limit_s)
                times.append(guarded(try_, pace.limit_s, f"first session {title}"))
            finally:
                close(tab)
    return times


def concurrent(browser: Any, address: str, title: str, sessions: int, limit_s: float) -> list[Try]:
    """`sessions` fresh profiles open the link together; each one's time from its own start.
    They share one hang guard, twice a page's limit: they were started together, so they are
    waited on together, and a page shared by many sessions takes longer."""
    tabs = [fresh_tab(browser) for _ in range(sessions)]
    together = 2 * limit_s
    try:
        for tab in tabs:  # each navigation starts as soon as the previous one is sent
            tab.goto(address, wait_until="commit", timeout=together * 1000)
        deadline = time.monotonic() + together
        return [guarded(partial(seconds_to_render, tab, title, deadline), together) for tab in tabs]
    finally:
        for tab in tabs:
            close(tab)


# -- the report -------------------------------------------------------------------------------


def median(times: list[Try]) -> Timing | str:
    """The middle try (the lower middle one of an even count), or the first error."""
    errors = [t for t in times if isinstance(t, str)]
    timings = sorted((t for t in times if isinstance(t, Timing)), key=lambda t: t.seconds)
    return errors[0] if errors else timings[(len(timings) - 1) // 2] if timings else SKIPPED


def failed(value: str, width: int) -> str:
    """A cell for a try with no time: not rendered in time, skipped (no time left), or an
    error (printed under the tables)."""
    word = (
        "not rendered"
        if value.startswith(NOT_RENDERED)
        else SKIPPED
        if value == SKIPPED
        else "ERROR"
    )
    return f"{word:>{width}}"


def cell(value: Timing | str | None, reference: Timing | str | None, aim: float) -> str:
    """'2.31 s 1.9× no' (its ratio to the reference, and whether it meets the aim)."""
    if value is None:
        return f"{'–':>18}"
    if isinstance(value, str):
        return failed(value, 18)
    if not isinstance(reference, Timing):
        return f"{value.seconds:6.2f} s {'':>10}"
    ratio = value.seconds / reference.seconds
    return f"{value.seconds:6.2f} s {ratio:4.1f}× {'yes' if ratio <= aim else 'no':>3}"


def breakdown(value: Timing | str | None) -> str:
    """'2 runs script  1.20 +0.40  31 msg   118 KiB' for one try."""
    if value is None:
        return f"{'–':>42}"
    if isinstance(value, str):
        return failed(value, 42)
    script = "script    – " if value.script is None else f"script {value.script:5.2f}"
    drawn = "" if value.script is None else f"+{value.seconds - value.script:4.2f}"
    return (
        f"{value.runs} run{'s' if value.runs != 1 else ' '} {script} {drawn:>5} "
        f"{value.messages:3d} msg {value.bytes / 1024:5.0f} KiB"
    )


def brief(value: Timing | str) -> str:
    """'2.31 s (1 run  script  1.20 +1.11  31 msg   118 KiB)', or the error."""
    if isinstance(value, str):
        return value
    return f"{value.seconds:.2f} s ({breakdown(value).strip()})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", help="url paths, comma-separated (default: every page)")
    parser.add_argument("--repeats", type=int, default=3, help="tries per page (median)")
    parser.add_argument("--sessions", type=int, default=20, help="sessions at once")
    parser.add_argument(
        "--concurrent-pages",
        help=f"pages timed with --sessions (default: --pages, else {','.join(CONCURRENT_PAGES)})",
    )
    parser.add_argument(
        "--first-pages",
        help=f"pages timed as a first session (default: --pages, else {','.join(FIRST_PAGES)})",
    )
    parser.add_argument(
        "--page-timeout",
        type=float,
        default=PAGE_LIMIT_S,
        help="seconds a page may take to render before it is reported as not rendered",
    )
    parser.add_argument(
        "--minutes",
        type=float,
        default=MINUTES,
        help="the measuring's budget: a phase repeats a try only while its share is left",
    )
    parser.add_argument("--source", type=Path, default=ROOT, help="checkout whose code runs")
    parser.add_argument(
        "--config",
        type=Path,
        help="time the app on this config's store as it is (kneepoint serve --no-collect) "
        "instead of the demo",
    )
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    source = args.source.resolve()
    what = f"app on {args.config}" if args.config else "demo (4 replicas, SQLite)"
    titles = page_titles(source)

    def chosen(flag: str | None) -> list[str]:
        paths = flag.split(",") if flag else [p for p in titles if p != "audit"] + ["audit"]
        unknown = [p for p in paths if p not in titles]
        if unknown:
            parser.error(f"no page {', '.join(unknown)} (pages: {', '.join(titles)})")
        return [p for p in titles if p in paths]

    pages = chosen(args.pages)
    first_pages = chosen(args.first_pages or args.pages or ",".join(FIRST_PAGES))
    concurrent_pages = chosen(args.concurrent_pages or args.pages or ",".join(CONCURRENT_PAGES))
    pace = Pace(args.page_timeout)
    limit = args.page_timeout
    specs = [("" if p == next(iter(titles)) else p, titles[p]) for p in pages]
    other = next(  # the page a lone page is clicked from: a light one if it can be
        ("" if p == next(iter(titles)) else p, titles[p])
        for p in ["health", "audit", *titles]
        if p in titles and p not in pages[:1]
    )
    say(f"browser bench: {checkout_label(source)} ({source}); Chromium {CHROMIUM}")
    began = time.monotonic()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="kneepoint-browser-") as name:
        folder = Path(name)
        (folder / "watchdog.yaml").write_text(yaml.safe_dump(WATCHDOG))
        bare_script = folder / "bare.py"
        bare_script.write_text(BARE_APP)
        port, bare_port = free_port(), free_port()
        base, bare_base = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{bare_port}"
        if args.config:  # an app alone on that store, as it is (no collector)
            config = args.config.resolve()
            demo_command = serve_command(config, port)
        else:
            config = folder / "demo" / "kneepoint.yaml"
            demo_command = [
                *(sys.executable, "-m", "kneepoint.cli", "demo", "--dir", str(folder / "demo")),
                *("--port", str(port), "--no-browser", "--rules", str(folder / "watchdog.yaml")),
            ]
        log = folder / "apps.log"
        with (
            started(demo_command, source, log) as demo,
            started(bare_command(bare_script, bare_port), source, log) as bare,
            sync_playwright() as playwright,
        ):
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            wait_until(
                lambda: (
                    healthy(base)
                    and (args.config is not None or demo_ready(folder / "demo" / "kneepoint.db"))
                ),
                demo,
                log,
            )
            wait_until(lambda: healthy(bare_base), bare, log)
            say(f"{what} ready after {time.monotonic() - began:.0f} s; measuring")
            results: dict[str, dict[str, Any]] = {}
            share = {name: part * args.minutes * 60 for name, part in SHARES.items()}
            say("  open tab (a click in the sidebar):")
            phase = pace.phase(share["open"])
            bare_open = open_tab(browser, bare_base, [BARE], BARE_OTHER, args.repeats, phase)
            opened = open_tab(browser, base, specs, other, args.repeats, phase)
            say(f"  new tab (a chat link) ({time.monotonic() - began:.0f} s):")
            phase = pace.phase(share["new"])
            bare_new = new_tab(browser, bare_base, [BARE], args.repeats, phase, bare=True)
            newly = new_tab(browser, base, specs, args.repeats, phase)
            results["bare page"] = {"open": median(bare_open[""]), "new": median(bare_new[""])}
            for page, (path, _) in zip(pages, specs, strict=True):
                results[page] = {"open": median(opened[path]), "new": median(newly[path])}
            say(f"  open and new tabs timed ({time.monotonic() - began:.0f} s); medians:")
            for page, row in results.items():  # as they come: a run cut short still says them
                say(f"    {page:<16} open {brief(row['open'])}; new {brief(row['new'])}")
            # N sessions at once, then the app's memory: one round, whatever the time.
            rows = [("bare page", direct(bare_base, BARE[0]), BARE[1])] + [
                (p, link(base, path), title)
                for p, (path, title) in zip(pages, specs, strict=True)
                if p in concurrent_pages
            ]
            for page, address, title in rows:
                times = concurrent(browser, address, title, args.sessions, limit)
                results[page]["many"] = median(times)
                done = sum(isinstance(t, Timing) for t in times)
                middle = brief(results[page]["many"])
                say(f"    {page:<16} {args.sessions} sessions, median {middle}; {done} rendered")
            app_memory = memory_mib(app_pid(port))
            bare_memory = memory_mib(app_pid(bare_port))
            say(f"  {args.sessions} sessions at once timed ({time.monotonic() - began:.0f} s)")
            # First sessions: apps started for each try, on the same store; rounds over the
            # pages (the bare one first), so that a short budget still times each once.

            @contextmanager
            def app_started(command: list[str], url: str) -> Iterator[None]:
                with started(command, source, log) as process:
                    wait_until(lambda: healthy(url), process, log)
                    yield

            first_port = free_port()
            first_base = f"http://127.0.0.1:{first_port}"
            serve = partial(app_started, serve_command(config, first_port), first_base)
            bare_serve = partial(app_started, bare_command(bare_script, first_port), first_base)
            firsts: dict[str, tuple[Callable[[], Any], tuple[str, str]]] = {
                "bare page": (bare_serve, BARE)
            }
            for page, spec in zip(pages, specs, strict=True):
                if page in first_pages:
                    firsts[page] = (serve, spec)
            first_times: dict[str, list[Try]] = {page: [] for page in firsts}
            phase = pace.phase(share["first"])
            for round_ in range(args.repeats):
                if not phase.another(round_):
                    break
                for page, (start, spec) in firsts.items():
                    first_times[page] += first_session(browser, start, first_base, spec, 1, pace)
            for page, times in first_times.items():
                results[page]["first"] = median(times)
                say(f"    {page:<16} first session {brief(results[page]['first'])}")
            browser.close()
    bare_row = results["bare page"]
    say()
    say(
        f"== Chromium, {what} against a bare Streamlit page; median of "
        f"{args.repeats}; {args.sessions} sessions: median of their times, ratio to the page's "
        "new tab (machine shared: noisy)"
    )
    say(
        f"{'page':<16} | {'open tab (aim ≤ 1.2×)':>18} | {'new tab (≤ 1.2×)':>18} | "
        f"{'first session (≤ 2×)':>18} | {f'{args.sessions} sessions (≤ 1.5×)':>18}"
    )
    errors = []
    for page, row in results.items():
        for kind in ("open", "new", "first", "many"):
            if isinstance(row.get(kind), str):
                errors.append(f"{page} {kind}: {row[kind]}")
        reference = bare_row if page != "bare page" else {}
        say(
            f"{page:<16} | {cell(row['open'], reference.get('open'), OPEN_TAB_AIM)} | "
            f"{cell(row['new'], reference.get('new'), NEW_TAB_AIM)} | "
            f"{cell(row.get('first'), reference.get('first'), FIRST_AIM)} | "
            f"{cell(row.get('many'), row['new'], CONCURRENT_AIM)}"
        )
    many, single = bare_row.get("many"), bare_row["new"]
    if isinstance(many, Timing) and isinstance(single, Timing):
        # What N sessions cost the browser and the machine by themselves: the bare page's.
        against = [
            f"{page} {row['many'].seconds / many.seconds:.1f}×"
            for page, row in results.items()
            if page != "bare page" and isinstance(row.get("many"), Timing)
        ]
        say(
            f"{args.sessions} sessions at once against the bare page's {args.sessions} "
            f"({many.seconds:.2f} s, {many.seconds / single.seconds:.1f}× its new tab): "
            + (", ".join(against) or "–")
        )
    say()
    say(
        "== where the time went (the median try): script runs, the last one's end as the page "
        "saw it, then drawing; WebSocket messages and KiB received"
    )
    say(f"{'page':<16} | {'open tab':^42} | {'new tab (chat link)':^42} | {'first session':^42}")
    for page, row in results.items():
        say(
            f"{page:<16} | {breakdown(row['open'])} | {breakdown(row['new'])} | "
            f"{breakdown(row.get('first'))}"
        )
    say(
        f"app memory after {args.sessions} sessions: kneepoint app {app_memory[0]:.0f} MiB "
        f"resident (peak {app_memory[1]:.0f} MiB); bare app {bare_memory[0]:.0f} MiB "
        f"(peak {bare_memory[1]:.0f} MiB)"
    )
    for error in errors:
        say(f"error: {error}")
    say(f"done in {(time.monotonic() - began) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
