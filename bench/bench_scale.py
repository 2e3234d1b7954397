"""Scale bench: 1,000 replicas on PostgreSQL, loopback only, in about a quarter of an hour.

    .venv/bin/python bench/bench_scale.py [--replicas 1000 --nodes 125 --gpus 8]
        [--rounds 12 --interval 15] [--days 7 --raw-hours 12] [--skip-collect | --skip-pages]

On a throwaway PostgreSQL cluster (tests/postgres.py, Debian's binaries):

1. Collector. One aiohttp process (bench/scale_twin.py) serves `--replicas` vLLM expositions
   (the real 0.32 capture, counters growing with time) and `--nodes` dcgm-exporters of
   `--gpus` GPUs each; a real `kneepoint collect` subprocess scrapes them every `--interval`
   seconds with the standard jobs (scrape, rollup, outbox delivery; alert evaluation is set
   to once a day, so it runs once at start on an empty store, and is measured in part 3).
   After a first round, `--rounds` intervals are measured from /proc: the collector's CPU
   per round and per target-scrape, its resident memory after every round and its peak
   (VmHWM), and the database's growth (pg_database_size), extrapolated per replica-day.
2. Pages. A second database is seeded in SQL (bench/scale_seed.py) with `--days` of history
   of the same fleet as the collector and its rollup job leave it: samples every 15 s for
   the newest `--raw-hours` (the raw retention is 48 h; fewer keeps the seed short), one a
   minute before that, and the 5-minute and hourly summary tiers. Every page's server-side
   work (the kernel functions app/data.py calls for it, named in the output; one SLO
   configured, so that the SLOs page has one to show) is timed for
   1 h, 24 h and 7 d, and the bytes per row of each tier give the bytes per replica-day at
   each age.
3. Alerts. `evaluate_once` with the built-in rules over the seeded store, `--eval-rounds`
   times; then with an SLO added, whose burn rates are recomputed once a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from scale_seed import Seeder, node_name, replica_name  # noqa: E402

from tests.conftest import free_port  # noqa: E402
from tests.postgres import running_postgres  # noqa: E402

BIN = Path(sys.executable).parent
DAY = 86400.0
RANGES = (("1h", 3600.0), ("24h", DAY), ("7d", 7 * DAY))


def say(line: str = "") -> None:
    print(line, flush=True)


# -- 1. the collector ------------------------------------------------------------------------


def proc(pid: int) -> tuple[float, int, int]:
    """A process's CPU seconds (user + system), resident and peak resident KiB, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return cpu, int(status["VmRSS"].split()[0]), int(status["VmHWM"].split()[0])


def fleet_config(url: str, port: int, args: argparse.Namespace, folder: Path) -> Path:
    base = f"http://127.0.0.1:{port}"
    targets: list[dict[str, Any]] = [
        {
            "name": replica_name(i),
            "kind": "vllm",
            "url": f"{base}/r/{i}/metrics",
            "gpus": [f"{node_name(i // args.gpus)}/{i % args.gpus}"]
            if i // args.gpus < args.nodes
            else [],
        }
        for i in range(args.replicas)
    ]
    targets += [
        {"name": node_name(j), "kind": "dcgm", "url": f"{base}/d/{j}/metrics"}
        for j in range(args.nodes)
    ]
    config = {
        "database": url,
        "scrape_interval": f"{args.interval}s",
        "evaluation_interval": "24h",
        "targets": targets,
    }
    path = folder / "kneepoint.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait_for(check: Callable[[], bool], seconds: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise SystemExit(f"gave up waiting for {what}\n{tail}")
        time.sleep(0.5)


def serving(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def served(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as answer:
        return dict(json.loads(answer.read()))


@contextlib.contextmanager
def process(command: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            yield child
        finally:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def stored(sessions: sessionmaker[Session]) -> tuple[int, int, int]:
    with sessions() as session:
        replicas = session.scalar(text("SELECT count(*) FROM replica_samples")) or 0
        gpus = session.scalar(text("SELECT count(*) FROM gpu_samples")) or 0
        size = session.scalar(text("SELECT pg_database_size(current_database())")) or 0
    return int(replicas), int(gpus), int(size)


def failed_scrapes(sessions: sessionmaker[Session]) -> str:
    """The stored scrape errors and refusals, most common first, in a line."""
    with sessions() as session:
        errors = session.execute(
            text("SELECT error, count(*) FROM scrape_errors GROUP BY error ORDER BY 2 DESC LIMIT 3")
        ).all()
        refused = session.scalar(text("SELECT sum(samples_refused) FROM targets")) or 0
    shown = [f"{count} × {error[:80]}" for error, count in errors]
    if refused:
        shown.append(f"{refused} samples refused")
    return "; ".join(shown)


def collector(url: str, args: argparse.Namespace, folder: Path) -> None:
    from kneepoint.store.db import connect_store

    say(
        f"1. collector: {args.replicas} vLLM replicas + {args.nodes} dcgm nodes × {args.gpus} "
        f"GPUs, every {args.interval} s, {args.rounds} measured rounds"
    )
    port = free_port()
    twin_command = [
        sys.executable,
        str(ROOT / "bench" / "scale_twin.py"),
        *("--replicas", str(args.replicas), "--nodes", str(args.nodes)),
        *("--gpus", str(args.gpus), "--port", str(port)),
    ]
    with process(twin_command, folder / "twin.log") as twin:
        wait_for(lambda: serving(port), 60, "the twin targets")
        config = fleet_config(url, port, args, folder)
        subprocess.run([str(BIN / "kneepoint"), "migrate", "--config", str(config)], check=True)
        sessions = connect_store(url)
        command = [str(BIN / "kneepoint"), "collect", "--config", str(config)]
        with process(command, folder / "collect.log") as collect:
            # The first round creates the targets and GPUs: not measured.
            wait_for(
                lambda: stored(sessions)[0] >= args.replicas,
                10 * args.interval,
                "round 1",
                folder / "collect.log",
            )
            began = time.monotonic()
            ticks = []
            for round_number in range(args.rounds + 1):
                if round_number:
                    time.sleep(max(0.0, began + round_number * args.interval - time.monotonic()))
                if collect.poll() is not None:
                    raise SystemExit(f"kneepoint collect exited: see {folder / 'collect.log'}")
                cpu, rss, peak = proc(collect.pid)
                twin_cpu = proc(twin.pid)[0]
                replica_rows, gpu_rows, size = stored(sessions)
                ticks.append(
                    (
                        time.monotonic(),
                        cpu,
                        rss,
                        peak,
                        replica_rows,
                        gpu_rows,
                        size,
                        twin_cpu,
                        served(port),
                    )
                )
                if round_number:
                    say(
                        f"  after round {round_number + 1}: {cpu - ticks[-2][1]:.2f} CPU-s, "
                        f"RSS {rss / 1024:.0f} MiB (peak {peak / 1024:.0f}), "
                        f"{len(os.listdir(f'/proc/{collect.pid}/task'))} threads, "
                        f"{replica_rows - ticks[-2][4]} replica rows"
                    )
            failures = failed_scrapes(sessions)
        log = (folder / "collect.log").read_text(errors="replace")
    first, last = ticks[0], ticks[-1]
    seconds = last[0] - first[0]
    cpu = last[1] - first[1]
    replica_scrapes = last[4] - first[4]
    node_scrapes = (last[5] - first[5]) / args.gpus
    fetched = sum(last[8].values()) - sum(first[8].values())
    rounds = fetched / (args.replicas + args.nodes)
    per_scrape = cpu / fetched if fetched else float("nan")
    growth = last[6] - first[6]
    rss = [t[2] for t in ticks]
    say(f"  measured {seconds:.0f} s: {rounds:.1f} rounds scraped in {args.rounds} intervals")
    say(
        f"  collector CPU: {cpu:.1f} s = {cpu / seconds:.2f} of a core; "
        f"{cpu / max(rounds, 1e-9):.2f} s per round; per target-scrape "
        f"{per_scrape * 1000:.2f} ms ({fetched} scrapes served by the twin; stored: "
        f"{replica_scrapes} replica + {node_scrapes:.0f} node scrapes)"
    )
    say(f"  twin server CPU: {(last[7] - first[7]) / seconds:.2f} of a core")
    say(
        f"  collector memory: RSS {rss[0] / 1024:.0f} MiB after round 1, "
        f"{rss[len(rss) // 2] / 1024:.0f} MiB mid-way, {rss[-1] / 1024:.0f} MiB at the end; "
        f"peak (VmHWM) {last[3] / 1024:.0f} MiB"
    )
    second_half = rss[len(rss) // 2 :]
    steps = [b - a for a, b in itertools.pairwise(second_half)] or [0]
    say(
        "  memory growth over the second half: "
        f"{(second_half[-1] - second_half[0]) / 1024:+.1f} MiB "
        f"(per round {statistics.mean(steps) / 1024:+.2f} MiB)"
    )
    if replica_scrapes:
        per_day = growth / replica_scrapes * (DAY / args.interval)
        say(
            f"  database growth: {growth / 1e6:.1f} MB for {replica_scrapes} replica scrapes "
            f"(and their {args.gpus * node_scrapes:.0f} GPU readings) = "
            f"{per_day / 1e6:.2f} MB per replica-day at full resolution ({args.interval} s)"
        )
    if failures:
        say(f"  failed scrapes stored: {failures}")
    missed = log.count("maximum number of running instances") + log.count("was missed by")
    if missed:
        say(f"  the scheduler skipped or delayed {missed} runs (a round outlasted the interval)")


# -- 2. pages --------------------------------------------------------------------------------


def timed(work: Callable[[], object]) -> float:
    began = time.perf_counter()
    work()
    return time.perf_counter() - began


def page_work(config: Any, now: float) -> list[tuple[str, str, Callable[[Session, float], object]]]:
    """Each page, the kernel functions app/data.py calls for it, and that work for a range."""
    from alerts import evaluate as alert_rounds
    from alerts import silences
    from alerts.outbox import channel_health
    from kneepoint import audit, timeline
    from kneepoint.knee.detect import assess
    from kneepoint.knee.passive import replica_curve
    from kneepoint.series import COLUMNS as SERIES_COLUMNS
    from kneepoint.series import replica_series
    from kneepoint.status import build_status
    from kneepoint.store import queries
    from kneepoint.store.runs import load_runs
    from kneepoint.views import build_view
    from review.report import build_report

    def overview(session: Session, window: float) -> None:
        build_status(session, config, now, 300.0)
        names = {row.id: n for n, row in queries.targets(session).items()}
        frame = queries.replica_frame(session, now - window, now, columns=SERIES_COLUMNS)
        replica_series(frame, names)
        # Its alert tiles (app/data.alert_states); its SLO tiles are slo_reports, cached
        # for 30 s in the app and timed on the SLOs row.
        queries.alert_states(session)

    def health(session: Session, window: float) -> None:
        queries.targets(session)
        queries.job_health(session)
        queries.scrape_errors(session, now - window, now)

    def alerts(session: Session, window: float) -> None:
        queries.alert_states(session)
        queries.alert_history(session, now - window, now)
        queries.notifications(session, now - window, now)
        channel_health(session)
        silences.load(session)

    def knee(session: Session, window: float) -> None:
        [assess(run, config.slos) for run in load_runs(session)]
        replica_curve(session, replica_name(0), now - window, now)

    return [
        (
            "Overview",
            "build_status (5 min) + replica_frame + replica_series + alert_states",
            overview,
        ),
        (
            "Capacity, Cost, GPUs, Prefix cache, Spec decode",
            "build_view (one cached View)",
            lambda s, w: build_view(s, config, now, w),
        ),
        ("Knee", "load_runs + assess + replica_curve (one replica)", knee),
        ("Timeline", "timeline.events", lambda s, w: timeline.events(s, config, now - w, now)),
        ("Health", "targets + job_health + scrape_errors", health),
        ("Alerts", "alert_states + alert_history + notifications + channel_health", alerts),
        ("Audit", "audit.entries", lambda s, w: audit.entries(s, now - w)),
        ("SLOs (no range)", "slo_reports", lambda s, w: alert_rounds.slo_reports(s, config, now)),
        (
            "Weekly (no range)",
            "build_report (7 d)",
            lambda s, w: build_report(s, config, now - now % 300, 7 * DAY),
        ),
    ]


def bench_config(url: str, args: argparse.Namespace, slo: bool) -> Any:
    from kneepoint.config import Config

    targets: list[dict[str, Any]] = [
        {
            "name": replica_name(i),
            "kind": "vllm",
            "url": f"http://127.0.0.1/r/{i}/metrics",
            "gpus": [f"{node_name(i // args.gpus)}/{i % args.gpus}"]
            if i // args.gpus < args.nodes
            else [],
        }
        for i in range(args.replicas)
    ] + [
        {"name": node_name(j), "kind": "dcgm", "url": f"http://127.0.0.1/d/{j}/metrics"}
        for j in range(args.nodes)
    ]
    slos = (
        [
            {
                "name": "interactive-ttft",
                "metric": "ttft",
                "threshold": "0.5s",
                "objective": 0.99,
                "window": "30d",
            }
        ]
        if slo
        else []
    )
    return Config.model_validate({"database": url, "targets": targets, "slos": slos})


def pages(url: str, args: argparse.Namespace) -> None:
    from alerts.evaluate import evaluate_once
    from kneepoint.store.db import open_store

    say(
        f"2. pages: {args.replicas} replicas + {args.nodes * args.gpus} GPUs × {args.days:g} days "
        f"(15 s rows for the newest {args.raw_hours:g} h, one a minute before, summary tiers)"
    )
    sessions = open_store(url)
    seeder = Seeder(
        sessions, args.replicas, args.nodes, args.gpus, time.time(), args.days, args.raw_hours, say
    )
    counts = seeder.run()
    now = seeder.now
    with sessions() as session:
        sizes = {
            table: int(session.scalar(text(f"SELECT pg_total_relation_size('{table}')")) or 0)
            for table in counts
        }
        total = int(session.scalar(text("SELECT pg_database_size(current_database())")) or 0)
    say(f"  database: {total / 1e9:.2f} GB")
    per_row = {table: sizes[table] / max(counts[table], 1) for table in counts}
    gpus_per_replica = args.nodes * args.gpus / args.replicas
    sample = per_row["replica_samples"] + gpus_per_replica * per_row["gpu_samples"]
    summary = per_row["replica_rollups"] + gpus_per_replica * per_row["gpu_rollups"]
    say(
        f"  bytes per row (table + indexes): replica sample {per_row['replica_samples']:.0f}, "
        f"GPU sample {per_row['gpu_samples']:.0f}, replica summary "
        f"{per_row['replica_rollups']:.0f}, GPU summary {per_row['gpu_rollups']:.0f}"
    )
    say(
        "  per replica-day (with its GPUs' share) by age: raw (under 48 h) "
        f"{(5760 * sample + 312 * summary) / 1e6:.2f} MB, minute rollup (to 35 d) "
        f"{(1440 * sample + 312 * summary) / 1e6:.2f} MB, hour rollup (to 400 d) "
        f"{(24 * sample + 24 * summary) / 1e3:.0f} kB (each with its 5-minute and hourly summaries)"
    )
    config = bench_config(url, args, slo=True)  # an SLO, as the SLOs page has one to show
    work = page_work(config, now)
    say(f"  {'page':<48} | {'functions timed (server side)':<55} |    1 h |   24 h |    7 d")
    slowest: dict[str, float] = {}
    for page, functions, run in work:
        cells = []
        ranges = RANGES[:1] if "no range" in page else RANGES
        for label, window in ranges:
            with sessions() as session:
                seconds = timed(lambda: run(session, window))  # noqa: B023
            slowest[f"{page} {label}"] = seconds
            cells.append(f"{seconds:6.2f}")
        cells += ["      "] * (3 - len(cells))
        say(
            f"  {page:<48} | {functions:<55} | "
            + " | ".join(c + " s" if c.strip() else c for c in cells)
        )
    over = {k: v for k, v in slowest.items() if v >= 1.0}
    slow = ", ".join(f"{k} ({v:.2f} s)" for k, v in over.items())
    say(f"  pages at or over 1 s: {slow or 'none'}")

    say(f"3. alerts: evaluate_once, built-in rules, {args.replicas} replicas")
    for slo in (False, True):
        config = bench_config(url, args, slo=slo)
        times = []
        for number in range(args.eval_rounds if not slo else 2):
            with sessions.begin() as session:
                at = now if slo else now + 15 * number  # an SLO's rounds: the same minute
                times.append(timed(lambda: evaluate_once(session, config, at)))  # noqa: B023
        if slo:
            say(
                f"  with an SLO: {times[0]:.2f} s when its burn rates are recomputed (once a "
                f"minute), {times[1]:.2f} s otherwise"
            )
        else:
            rounds = ", ".join(f"{t:.2f} s" for t in times)
            say(f"  per round: {rounds} (median {statistics.median(times):.2f} s)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=125)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--interval", type=float, default=15.0, help="scrape interval, seconds")
    parser.add_argument("--rounds", type=int, default=12, help="measured scrape rounds")
    parser.add_argument("--days", type=float, default=7.0, help="days of seeded history")
    parser.add_argument("--raw-hours", type=float, default=12.0, help="newest hours kept at 15 s")
    parser.add_argument("--eval-rounds", type=int, default=3)
    parser.add_argument("--skip-collect", action="store_true")
    parser.add_argument("--skip-pages", action="store_true")
    args = parser.parse_args()
    if args.raw_hours > 48:
        parser.error("--raw-hours: the raw retention keeps 48 h")
    began = time.perf_counter()
    with running_postgres() as fresh, tempfile.TemporaryDirectory() as folder:
        if not args.skip_collect:
            collector(fresh(), args, Path(folder))
        if not args.skip_pages:
            pages(fresh(), args)
    say(f"done in {(time.perf_counter() - began) / 60:.1f} min")


if __name__ == "__main__":
    main()
