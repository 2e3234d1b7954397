"""The page bench's worker (bench/bench_pages.py starts it): runs with the product code of one
checkout first on sys.path (PYTHONPATH=<checkout>), so the same bench times before and after.

    page_runs.py seed    --url URL --replicas N --nodes N --gpus N --days D --raw-hours H
    page_runs.py measure --config FILE --app FILE --now T --pages a,b --ranges 1h,24h
                         [--eval-rounds 8] [--steady] [--review] --out FILE.json

`seed` fills a PostgreSQL store with bench/scale_seed.py (once: a store it marked as seeded is
reused) and prints the seeded clock. `measure` runs, in this order:

1. alert evaluation (`alerts.evaluate.evaluate_once`) every 15 s of store time up to the seeded
   clock, after one untimed round a minute before (the collector's previous round): the
   rounds that enter a new minute recompute the SLO burn rates (burn-rate rounds), the others
   do not (plain rounds); with --steady the SLO running sums are first built up to the
   untimed round (`alerts.evaluate.advance_sums` without a budget, timed apart: `backfill`),
   so the timed rounds fold only their own new buckets, as a collector's steady rounds do;
2. every page as its router runs it: the whole script run of app/main.py with
   ?page=<url_path>&range=<range> through streamlit.testing.v1.AppTest, cold (after
   st.cache_data.clear()) and warm (a second session 5 s later by the app's clock: the same
   collection round, no new data), then after a new round: a round written (every target's
   newest samples copied 15 s on), the app's cache warmer (app/warm.py, where the checkout
   has one) run to the end for it, timed (wall and CPU seconds), and the page run in a fresh
   session (`round`); a checkout without a warmer just runs the page after the round. The
   round is deleted afterwards, so the store stays as seeded;
3. the warmer's cost per round with every page visited at the default range (1 h): each
   page run once (caches cleared first), then a minute of rounds (MINUTE_ROUNDS), each
   written and the warmer run for it (where the checkout has one), each timed;
4. the weekly review (`review.report.build_report`, 7 days).

The app's clock (time.time) is set back to the seeded clock at the start of each run and runs
on in real time from there (held still after a new round, while the warmer runs and the
page after it), so that the store's data is as fresh as a collector would keep it
however long the bench has been running; evaluation and review are given the time directly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

_real_time = time.time
_clock = {"base": 0.0, "mark": 0.0, "set": False, "held": False}


def _bench_time() -> float:
    if not _clock["set"]:
        return _real_time()
    if _clock["held"]:
        return _clock["base"]
    return _clock["base"] + (time.perf_counter() - _clock["mark"])


def set_clock(at: float, held: bool = False) -> None:
    """From now on time.time() reads `at`, advancing in real time unless `held`."""
    _clock.update(base=at, mark=time.perf_counter(), set=True, held=held)


# Before any product or Streamlit import: a module that did `from time import time` gets this.
time.time = _bench_time

RANGES = {"1h": 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def seed(args: argparse.Namespace) -> None:
    from sqlalchemy import text

    from kneepoint.store.db import open_store

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from scale_seed import Seeder

    sessions = open_store(args.url)
    with sessions() as session:
        marked = session.execute(
            text("SELECT 1 FROM information_schema.tables WHERE table_name = 'bench_seeded'")
        ).first()
        if marked:
            now = float(session.execute(text("SELECT now_ts FROM bench_seeded")).scalar_one())
            print(json.dumps({"now": now, "reused": True}))
            return
        started = session.execute(text("SELECT count(*) FROM targets")).scalar_one()
    if started:  # an interrupted seed: start again on an empty schema
        with sessions.begin() as session:
            session.execute(text("DROP SCHEMA public CASCADE"))
            session.execute(text("CREATE SCHEMA public"))
        sessions = open_store(args.url)
    seeder = Seeder(
        sessions, args.replicas, args.nodes, args.gpus, _real_time(), args.days, args.raw_hours, say
    )
    seeder.run()
    with sessions.begin() as session:
        session.execute(text("CREATE TABLE bench_seeded (now_ts float8)"))
        session.execute(text("INSERT INTO bench_seeded VALUES (:t)"), {"t": seeder.now})
    print(json.dumps({"now": seeder.now, "reused": False}))


def error_of(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def round_times(now: float, rounds: int) -> list[float]:
    """The untimed round, then the timed ones ending at `now`; the timed rounds start on a
    minute (a burn-rate round), so that 2 rounds are one of each."""
    first = (now - 15 * (rounds - 1)) // 60 * 60
    return [first - 60] + [first + 15 * i for i in range(rounds)]


def backfill(config: Any, sessions: Any, at: float) -> dict[str, Any] | None:
    """The SLO running sums built up to `at` at once, as the collector's rounds would have
    built them over the store's history (None: a checkout without running sums)."""
    from alerts import evaluate

    if not hasattr(evaluate, "advance_sums"):
        return None
    began, buckets = time.perf_counter(), 0
    while True:  # each call folds a day at most (slo_sums.advance's `most`)
        with sessions.begin() as session:
            done = evaluate.advance_sums(session, config, at, budget=10**9)
        if not done:
            break
        buckets += done
    seconds = time.perf_counter() - began
    say(f"  SLO sums built to {at:.0f}: {buckets} buckets in {seconds:.1f} s")
    return {"seconds": seconds, "buckets": buckets}


def evaluation(config: Any, sessions: Any, now: float, rounds: int) -> list[dict[str, Any]]:
    from alerts.evaluate import evaluate_once

    times = round_times(now, rounds)
    done: list[dict[str, Any]] = []
    for number, at in enumerate(times):
        burn = number == 0 or at // 60 != times[number - 1] // 60
        began = time.perf_counter()
        try:
            with sessions.begin() as session:
                evaluate_once(session, config, at)
            error = None
        except Exception as exc:  # reported in the table, never a crashed bench
            error = error_of(exc)
            say(traceback.format_exc())
        seconds = time.perf_counter() - began
        if number:  # the first round stands for the collector's previous one: untimed
            done.append({"at": at, "burn": burn, "seconds": seconds, "error": error})
        say(f"  evaluation at {at:.0f}: {seconds:.2f} s{' (burn rates)' if burn else ''}")
    return done


def alert_count(sessions: Any) -> dict[str, int]:
    """The pending and firing alerts the Alerts page lists (and finds a likely cause for)."""
    from sqlalchemy import text

    with sessions() as session:
        rows = session.execute(text("SELECT state, count(*) FROM alerts GROUP BY state"))
        return {str(state): int(n) for state, n in rows if state in ("pending", "firing")}


def page_run(app_file: str, path: str, label: str, timeout: float) -> dict[str, Any]:
    from streamlit.logger import set_log_level
    from streamlit.testing.v1 import AppTest

    set_log_level("error")  # AppTest's bare-mode warnings (its config resets the level)
    began = time.perf_counter()
    try:
        app = AppTest.from_file(app_file, default_timeout=timeout)
        app.query_params["page"] = path
        app.query_params["range"] = label
        app.run()
        seconds = time.perf_counter() - began
        error = "; ".join(error_of(Exception(e.value)) for e in app.exception) or None
        title = app.title[0].value if len(app.title) else None
    except Exception as exc:
        seconds, error, title = time.perf_counter() - began, error_of(exc), None
    return {"seconds": seconds, "error": error, "title": title}


ROUND = 15.0  # the seeded scrape interval


def _columns(session: Any, table: str) -> list[str]:
    from sqlalchemy import text

    query = "SELECT column_name FROM information_schema.columns WHERE table_name = :t"
    return [str(c) for c in session.execute(text(query), {"t": table}).scalars()]


def write_round(sessions: Any, at: float) -> None:
    """A collection round at `at`: every replica's and GPU's newest sample copied there (any
    schema: the columns are the table's), the targets' last scrape moved to it."""
    from sqlalchemy import text

    with sessions.begin() as session:
        for table in ("replica_samples", "gpu_samples"):
            columns = _columns(session, table)
            copied = ", ".join(":at" if c == "ts" else c for c in columns)
            session.execute(
                text(
                    f"INSERT INTO {table} ({', '.join(columns)}) SELECT {copied} FROM {table} "
                    f"WHERE ts = (SELECT max(ts) FROM {table} WHERE ts < :at)"
                ),
                {"at": at},
            )
        session.execute(
            text("UPDATE targets SET last_scrape_at = :at WHERE last_scrape_at IS NOT NULL"),
            {"at": at},
        )


def drop_rounds(sessions: Any, seeded: float) -> None:
    """The store back as seeded: the rounds written after `seeded` deleted."""
    from sqlalchemy import text

    with sessions.begin() as session:
        for table in ("replica_samples", "gpu_samples"):
            session.execute(text(f"DELETE FROM {table} WHERE ts > :t"), {"t": seeded})
        session.execute(
            text("UPDATE targets SET last_scrape_at = :t WHERE last_scrape_at > :t"),
            {"t": seeded},
        )


REPLAYED: list[tuple[str, float]] = []  # each call the warmer made: its function, wall seconds


def warmer_of(config_file: str) -> Any:
    """The checkout's cache warmer over a fresh record of calls, or None where it has none;
    each call it makes is timed into REPLAYED (where it spends a round)."""
    try:
        from app import data, warm

        read = data.read_version
    except (ImportError, AttributeError):  # an older checkout (its app/data.py has no warmer)
        return None
    registry = warm.REGISTRY = warm.Registry()  # this measure's page runs only
    recorded = registry.advance

    def advance(path: str, version: Any) -> list[tuple[Any, tuple[Any, ...]]]:
        return [(replace(spec, call=_timed(spec)), args) for spec, args in recorded(path, version)]

    registry.advance = advance  # type: ignore[method-assign]
    return warm.Warmer(str(Path(config_file).resolve()), read, registry)


def _timed(spec: Any) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        began = time.perf_counter()
        try:
            return spec.call(*args)
        finally:
            REPLAYED.append((spec.name.rsplit(".", 2)[-2:][-1], time.perf_counter() - began))

    return call


def warm_round(warmer: Any) -> dict[str, Any]:
    """Run the warmer to the end for the version now (as its thread would), timed, with the
    seconds of each call it made (`replayed`: function name and seconds, in its order)."""
    if warmer is None:
        return {
            "seconds": None,
            "cpu": None,
            "calls": 0,
            "failed": 0,
            "settled": False,
            "replayed": [],
        }
    made, failed = warmer.computed, warmer.failed
    REPLAYED.clear()
    began, cpu = time.perf_counter(), time.process_time()
    settled = warmer.settle()
    return {
        "seconds": time.perf_counter() - began,
        "cpu": time.process_time() - cpu,
        "calls": warmer.computed - made,
        "failed": warmer.failed - failed,
        "settled": settled,
        "replayed": [[name, round(seconds, 3)] for name, seconds in REPLAYED],
    }


def replayed(done: dict[str, Any]) -> str:
    """The warmer's calls, slowest first: "_view 3.1 s, _status 0.8 s"."""
    calls = sorted(done.get("replayed") or [], key=lambda c: -c[1])
    return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in calls)


def after_round(
    args: argparse.Namespace, sessions: Any, path: str, label: str, number: int
) -> dict[str, Any]:
    """Round `number` written, the warmer run to the end, the page run in a fresh session."""
    at = args.now + ROUND * number
    try:
        write_round(sessions, at)
        # A second into the round ("now" is `at`), held there: the warmer is given the time
        # it needs (its seconds are reported; more than a round's 15 s: it cannot keep up).
        set_clock(at + 1, held=True)
        warmer = WARMER["it"]
        done = warm_round(warmer)
        run = page_run(args.app, path, label, args.timeout)
    finally:
        drop_rounds(sessions, args.now)
    return run | {"warmer": done}


WARMER: dict[str, Any] = {}


def measure(args: argparse.Namespace) -> None:
    import os

    os.environ["KNEEPOINT_CONFIG"] = args.config
    # AppTest puts the page's folder (app/screens, with alerts.py) first on sys.path: the
    # alerts package must be imported before, as tests/app do.
    import streamlit as st
    from streamlit.logger import set_log_level

    import alerts.evaluate  # noqa: F401

    set_log_level("error")  # AppTest's bare-mode warnings, once per run

    from kneepoint.config import load_config
    from kneepoint.store.db import connect_store

    config = load_config(args.config)
    sessions = connect_store(config.database)
    results: dict[str, Any] = {
        "evaluation": [],
        "pages": [],
        "review": None,
        "warmer": None,
        "backfill": None,
    }
    pages = [p for p in args.pages.split(",") if p]
    if pages or args.eval_rounds:
        # An interrupted run's rounds. A run of the review alone writes no round and reads
        # none (the review ends before the seeded clock), so it leaves the store alone: it
        # may run beside a run that has a round written.
        drop_rounds(sessions, args.now)
    if args.eval_rounds and args.steady:
        results["backfill"] = backfill(config, sessions, round_times(args.now, args.eval_rounds)[0])
    if args.eval_rounds:
        results["evaluation"] = evaluation(config, sessions, args.now, args.eval_rounds)
    results["alerts"] = alert_count(sessions)
    say(f"  alerts pending or firing: {results['alerts']}")
    rounds = 0
    for label in args.ranges.split(","):
        for path in pages:
            row: dict[str, Any] = {"page": path, "range": label}
            st.cache_data.clear()
            WARMER["it"] = warmer_of(args.config)  # what this page asks, nothing before
            set_clock(args.now)
            row["cold"] = page_run(args.app, path, label, args.timeout)
            set_clock(args.now + 5)  # a click or a second session, same collection round
            row["warm"] = page_run(args.app, path, label, args.timeout)
            rounds += 1  # each page its own round: no cache left from another page's
            row["round"] = after_round(args, sessions, path, label, rounds)
            warmed = row["round"]["warmer"]
            say(
                f"  {path} {label}: cold {row['cold']['seconds']:.2f} s, "
                f"warm {row['warm']['seconds']:.2f} s, "
                f"after a round {row['round']['seconds']:.2f} s"
                + (
                    f" (warmer {warmed['seconds']:.2f} s, {warmed['calls']} calls: "
                    f"{replayed(warmed)})"
                    if warmed["seconds"] is not None
                    else ""
                )
                + (f" ERROR {row['cold']['error']}" if row["cold"]["error"] else "")
            )
            results["pages"].append(row)
    if args.warmer_round:
        results["warmer"] = every_page_round(args, sessions, rounds + 1)
    if args.review:
        from review.report import build_report

        began = time.perf_counter()
        try:
            with sessions() as session:
                build_report(session, config, args.now - args.now % 300, 7 * 86400.0)
            error = None
        except Exception as exc:
            error = error_of(exc)
        results["review"] = {"seconds": time.perf_counter() - began, "error": error}
        say(f"  weekly review: {results['review']['seconds']:.2f} s")
    Path(args.out).write_text(json.dumps(results))


MINUTE_ROUNDS = 4  # a minute of 15 s rounds: one enters a new minute, the others do not


def every_page_round(args: argparse.Namespace, sessions: Any, number: int) -> dict[str, Any]:
    """The warmer's cost per round after every page was visited at the default range, over a
    minute of rounds (some computations are made once a minute, not each round): the mean
    of MINUTE_ROUNDS consecutive rounds, and each of them (`rounds`)."""
    import streamlit as st

    st.cache_data.clear()  # what the visits compute, not what an earlier measure left
    WARMER["it"] = warmer_of(args.config)
    set_clock(args.now + 5)
    for path in args.pages.split(","):
        page_run(args.app, path, "1h", args.timeout)
    rounds = []
    try:
        for at in (args.now + ROUND * (number + i) for i in range(MINUTE_ROUNDS)):
            write_round(sessions, at)
            set_clock(at + 1, held=True)
            rounds.append(warm_round(WARMER["it"]) | {"at": at})
    finally:
        drop_rounds(sessions, args.now)
    if rounds[0]["seconds"] is None:
        return rounds[0]
    for done in rounds:
        say(
            f"  warmer, every page visited at 1h, round at {done['at']:.0f}: "
            f"{done['seconds']:.2f} s ({done['cpu']:.2f} s CPU) for {done['calls']} calls, "
            f"{done['failed']} failed: {replayed(done)}"
        )
    return {
        "seconds": statistics.mean(r["seconds"] for r in rounds),
        "cpu": statistics.mean(r["cpu"] for r in rounds),
        "calls": round(statistics.mean(r["calls"] for r in rounds)),
        "failed": sum(r["failed"] for r in rounds),
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    seeding = commands.add_parser("seed")
    seeding.add_argument("--url", required=True)
    for name in ("replicas", "nodes", "gpus"):
        seeding.add_argument(f"--{name}", type=int, required=True)
    seeding.add_argument("--days", type=float, required=True)
    seeding.add_argument("--raw-hours", type=float, required=True)
    measuring = commands.add_parser("measure")
    for name in ("config", "app", "pages", "ranges", "out"):
        measuring.add_argument(f"--{name}", required=True)
    measuring.add_argument("--now", type=float, required=True)
    measuring.add_argument("--eval-rounds", type=int, default=8)
    measuring.add_argument("--review", action="store_true")
    measuring.add_argument("--steady", action="store_true")
    measuring.add_argument("--warmer-round", action="store_true")
    measuring.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    seed(args) if args.command == "seed" else measure(args)


if __name__ == "__main__":
    main()
