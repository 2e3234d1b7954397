"""Smoke runs of the benches docs/benchmarks.md's figures come from, at the smallest sizes their
flags allow: each runs to the end and prints its summary lines, whose numbers are checked
against each other (not against expected values, which depend on the machine).

`bench/bench_prometheus.py` needs Debian's Prometheus, `bench/bench_scale.py` a PostgreSQL
server (it starts a throwaway cluster through tests/postgres.py)."""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_real
from tests.postgres import _binaries

pytestmark = [pytest.mark.real, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"(\d+(?:\.\d+)?)"  # never nan or negative


def bench(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def line(pattern: str, output: str) -> re.Match[str]:
    found = re.search(pattern, output, re.MULTILINE)
    assert found, f"no line matching {pattern!r} in:\n{output}"
    return found


def test_bench_prometheus_prints_the_side_by_side_summary() -> None:
    if shutil.which("prometheus") is None:
        require_real("no prometheus binary (apt-get install prometheus; scripts/setup does it)")
    targets = 5  # a fifth of them dcgm-exporters: one
    output = bench(
        "bench_prometheus.py",
        # 2 s: Prometheus's scrape timeout is the interval, so a loaded machine has 2 s.
        *("--targets", str(targets), "--minutes", "0.1", "--interval", "2", "--sessions", "1"),
    )
    head = line(
        rf"^(\d+) targets every 2s for {NUMBER} min \((\d+) rounds\); "
        rf"kneepoint: (\d+) failed target-scrapes, Prometheus: {NUMBER} targets up$",
        output,
    )
    assert int(head[1]) == targets and int(head[3]) >= 1
    assert int(head[4]) == 0 and float(head[5]) == targets, output
    cpu = line(
        rf"^CPU per target-scrape: kneepoint {NUMBER} ms, Prometheus {NUMBER} ms "
        rf"\(ratio {NUMBER}×; kneepoint's whole process: {NUMBER} ms\)$",
        output,
    )
    ours, theirs, ratio = float(cpu[1]), float(cpu[2]), float(cpu[3])
    assert ours > 0 and theirs > 0
    assert ratio == pytest.approx(ours / theirs, rel=0.1, abs=0.02)  # each printed rounded
    stored = line(
        rf"^bytes per target-day at 2s: kneepoint {NUMBER} MB, Prometheus {NUMBER} MB of chunks "
        rf"\(ratio {NUMBER}×; its index, per block: {NUMBER} MB\)$",
        output,
    )
    # kneepoint's growth is whole SQLite pages (none in so short a run, maybe) and never
    # negative (NUMBER: it was, with the WAL counted before the run and truncated after).
    assert float(stored[1]) >= 0 and float(stored[2]) > 0


def test_bench_scale_runs_end_to_end_at_four_replicas() -> None:
    if _binaries() is None:
        require_real("no PostgreSQL server (apt-get install postgresql; scripts/setup does it)")
    replicas, nodes, gpus, rounds, evaluations = 4, 1, 2, 2, 2
    output = bench(
        "bench_scale.py",
        *("--replicas", str(replicas), "--nodes", str(nodes), "--gpus", str(gpus)),
        *("--rounds", str(rounds), "--interval", "1", "--eval-rounds", str(evaluations)),
        *("--days", "0.05", "--raw-hours", "1"),
    )
    # 1. The collector, measured from /proc.
    line(
        rf"^1\. collector: {replicas} vLLM replicas \+ {nodes} dcgm nodes × {gpus} GPUs, "
        rf"every 1\.0 s, {rounds} measured rounds$",
        output,
    )
    cpu = line(
        rf"collector CPU: {NUMBER} s = {NUMBER} of a core; {NUMBER} s per round; per "
        rf"target-scrape {NUMBER} ms \((\d+) scrapes served by the twin; stored: (\d+) replica "
        rf"\+ (\d+) node scrapes\)$",
        output,
    )
    assert int(cpu[5]) > 0 and int(cpu[6]) > 0, output  # scraped and stored, not nan per scrape
    memory = line(
        r"collector memory: RSS (\d+) MiB after round 1, (\d+) MiB mid-way, (\d+) MiB at the "
        r"end; peak \(VmHWM\) (\d+) MiB$",
        output,
    )
    rss = [int(memory[i]) for i in (1, 2, 3)]
    assert min(rss) > 0 and int(memory[4]) >= max(rss)
    line(
        rf"database growth: {NUMBER} MB for (\d+) replica scrapes .* = {NUMBER} MB per "
        r"replica-day",
        output,
    )
    # 2. Pages: each page's time for 1 h, 24 h and 7 d (one time for those without a range),
    # and the summary names the cells at or over a second, and no other.
    summary = line(r"^  pages at or over 1 s: (.*)$", output)[1]
    pages = 0
    for text in output.splitlines():
        parts = [part.strip() for part in text.split(" | ")]
        if len(parts) != 5 or not re.fullmatch(r"\d+\.\d\d s", parts[2]):
            continue
        pages += 1
        page, cells = parts[0], [c for c in parts[2:] if c]
        ranges = ["1h"] if "no range" in page else ["1h", "24h", "7d"]
        assert len(cells) == len(ranges) and all(re.fullmatch(r"\d+\.\d\d s", c) for c in cells)
        for label, cell in zip(ranges, cells, strict=True):
            seconds, named = float(cell[:-2]), f"{page} {label} (" in summary
            if seconds >= 1.01:  # printed rounded: a cell near 1 s may fall either side
                assert named, (page, label, summary)
            elif seconds < 0.99:
                assert not named, (page, label, summary)
    assert pages >= 5, output
    # 3. Alert evaluation: one time per round asked for, and their median.
    line(rf"^3\. alerts: evaluate_once, built-in rules, {replicas} replicas$", output)
    per_round = line(r"^  per round: (.*) \(median (\d+\.\d\d) s\)$", output)
    times = [float(t) for t in re.findall(r"(\d+\.\d\d) s", per_round[1])]
    assert len(times) == evaluations
    assert float(per_round[2]) == pytest.approx(statistics.median(times), abs=0.011)
    line(
        rf"^  with an SLO: {NUMBER} s when its burn rates are recomputed .*, {NUMBER} s "
        r"otherwise$",
        output,
    )
    line(rf"^done in {NUMBER} min$", output)


def test_bench_pages_times_the_router_per_page_cold_and_warm_at_four_replicas() -> None:
    """Two pages through app/main.py (AppTest), one range, two evaluation rounds (the first
    enters a new minute: burn rates) and the weekly review, on a PostgreSQL store of 4
    replicas seeded by bench/scale_seed.py; the table has a row per page with its cold and
    warm seconds and the aim's verdict, which agrees with the seconds printed."""
    if _binaries() is None:
        require_real("no PostgreSQL server (apt-get install postgresql; scripts/setup does it)")
    output = bench(
        "bench_pages.py",
        *("--replicas", "4", "--days", "0.05", "--raw-hours", "1"),
        *("--pages", "overview,health", "--ranges", "1h", "--eval-rounds", "2", "--steady"),
    )
    line(r"^== 4 replicas × 0\.05 days \(PostgreSQL; seconds; aim: pages ≤ 1\.0 s", output)
    # --steady: the SLO sums built before the timed rounds (a fresh store: some buckets).
    built = line(rf"^SLO sums built first\s+\|\s+{NUMBER} s, (\d+) buckets \|$", output)
    assert int(built[2]) > 0, output
    seen = {}
    for page in ("overview", "health"):
        row = line(
            rf"^{page}\s+1h \|\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+1\.0\s+"
            rf"(yes|no \({NUMBER}×\)) \|$",
            output,
        )
        cold, warm, after_round, warmer = (float(row[i]) for i in (1, 2, 3, 4))
        assert cold > 0 and warm > 0 and after_round > 0 and warmer >= 0
        worst = max(cold, warm, after_round)  # the aim holds for each way a page is opened
        # Printed rounded: a time near the aim may fall either side.
        if worst > 1.01:
            assert row[5].startswith("no"), row[0]
        elif worst < 0.99:
            assert row[5] == "yes", row[0]
        seen[page] = row
    assert "error:" not in output, output  # both pages ran and showed the page asked for
    warmer_row = rf"^warmer, a round, 1 h pages\s+\|\s+{NUMBER} s \({NUMBER} s CPU\), \d+ calls \|$"
    line(warmer_row, output)
    burn = line(rf"^evaluation, burn-rate rounds\s+\|\s+med\s+{NUMBER} max\s+{NUMBER} n=1 ", output)
    plain = line(rf"^evaluation, plain rounds\s+\|\s+med\s+{NUMBER} max\s+{NUMBER} n=1 ", output)
    assert float(burn[1]) == float(burn[2]) and float(plain[1]) == float(plain[2])
    line(rf"^weekly review \(7 d\)\s+\|\s+{NUMBER} s\s+aim\s+30\s+yes \|$", output)
    line(rf"^done in {NUMBER} min$", output)


def test_bench_browser_times_a_page_against_the_bare_one_in_chromium(tmp_path: Path) -> None:
    """One page, one try, two sessions at once, in Chromium, on the app serving a small seeded
    store (--config: no demo backfill to wait for): a row for the bare page and one for the
    page, each time a number, each ratio the printed times' ratio, each time split into the
    script's part and the drawing's, and the app's memory."""
    if not Path("/usr/bin/chromium").exists():
        require_real("no Chromium at /usr/bin/chromium (apt-get install chromium)")
    import time

    from tests.seed import seed

    config = seed(tmp_path, time.time())
    output = bench(
        "bench_browser.py",
        *("--pages", "health", "--repeats", "1", "--sessions", "2", "--config", str(config)),
    )
    cell = rf"{NUMBER} s(?:\s+{NUMBER}×\s+(yes|no))?"
    rows = {}
    for name in ("bare page", "health"):
        row = line(rf"^{name}\s+\|\s+{cell}\s+\|\s+{cell}\s+\|\s+{cell}\s+\|\s+{cell}$", output)
        # (seconds, ratio or None) per column: open tab, new tab, first session, 2 sessions
        rows[name] = [
            (float(row[1 + 3 * k]), float(row[2 + 3 * k]) if row[2 + 3 * k] else None)
            for k in range(4)
        ]
    bare, page = rows["bare page"], rows["health"]
    for column in range(3):  # the page's ratio is to the bare page's time, printed rounded
        seconds, ratio = page[column]
        assert seconds > 0 and bare[column][0] > 0 and bare[column][1] is None, output
        assert ratio == pytest.approx(seconds / bare[column][0], rel=0.1, abs=0.06), output
    for times in (bare, page):  # two sessions at once: the ratio is to the row's own new tab
        seconds, ratio = times[3]
        assert ratio == pytest.approx(seconds / times[1][0], rel=0.1, abs=0.06), output
    # Where each time went, as the page saw it: script runs, the last one's end (within the
    # time), then drawing; what came over the WebSocket.
    split = rf"(\d+) runs?\s+script\s+(?:{NUMBER}\s+\+{NUMBER}|–)\s+(\d+) msg\s+(\d+) KiB"
    for name, times in (("bare page", bare), ("health", page)):
        row = line(rf"^{name}\s+\|\s+{split}\s+\|\s+{split}\s+\|\s+{split}$", output)
        for column in range(3):  # open tab, new tab, first session
            runs, script, drawn, messages, _kib = row.groups()[5 * column : 5 * column + 5]
            assert int(messages) >= 1, output
            if script is None:
                # The bare page's whole run is 6 messages, which a busy browser may take in
                # one React commit: the script state never shows running (seen at load 40).
                assert name == "bare page" and int(runs) == 0, output
                continue
            assert int(runs) >= 1, output
            assert float(script) + float(drawn) == pytest.approx(times[column][0], abs=0.02)
        assert int(row[5]) > 0 or name == "bare page"  # KiB: the health page's tables
    # The sessions at once against the bare page's as many: what they cost by themselves.
    together = line(
        rf"^2 sessions at once against the bare page's 2 \({NUMBER} s, {NUMBER}× its new tab\): "
        rf"health {NUMBER}×$",
        output,
    )
    assert float(together[1]) == pytest.approx(bare[3][0], abs=0.01), output
    assert float(together[3]) == pytest.approx(page[3][0] / bare[3][0], rel=0.1, abs=0.06)
    memory = line(
        r"kneepoint app (\d+) MiB resident \(peak (\d+) MiB\); bare app (\d+) MiB", output
    )
    assert 0 < int(memory[1]) <= int(memory[2]) and int(memory[3]) > 0
    assert "error:" not in output, output
    line(rf"^done in {NUMBER} min$", output)


def test_bench_browser_bounds_its_waits() -> None:
    """A page that does not render in time is reported as such (its cell says so), not
    waited on; a phase's first round always runs, a further one only within its share."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import bench_browser as b
    finally:
        sys.path.remove(str(ROOT / "bench"))

    class TimeoutError(Exception):  # Playwright's is named so
        pass

    def never() -> b.Timing:
        raise TimeoutError("Timeout 5000ms exceeded.")

    def broken() -> b.Timing:
        raise ValueError("no such page\nmore")

    late, failed = b.guarded(never, 5.0), b.guarded(broken, 5.0)
    assert late == "not rendered within 5 s"
    assert failed == "ValueError: no such page"
    assert b.cell(late, None, 1.2).strip() == "not rendered"
    assert b.cell(failed, None, 1.2).strip() == "ERROR"
    assert b.cell(b.median([]), None, 1.2).strip() == "skipped"
    assert b.breakdown(late).strip() == "not rendered"
    spent = b.Pace(5.0).phase(0.0)
    assert spent.another(0) and not spent.another(1)
    assert b.Pace(5.0).phase(600.0).another(2)
