"""SLO evaluation rounds at fleet size, before and after the running sums: `evaluate_once` with
a latency and an availability SLO (30-day windows) on a PostgreSQL store seeded by
bench/scale_seed.py, timed with the product code of each --source checkout, same run.

    .venv/bin/python bench/bench_slo_rounds.py [--replicas 200] [--days 3] [--raw-hours 12]
        [--source DIR]... [--keep DIR]

The store is seeded once (with the first source's code, whose schema every later one
migrates forward) and copied per source (CREATE DATABASE … TEMPLATE), so every source reads
the same rows. Each source then runs, in a child process:

- where it keeps SLO running sums (alerts.evaluate.advance_sums): 6 rounds every 15 s of
  store time from a fresh store (no sums yet: each round's advance writes a bounded share,
  slo_sums.BUDGET target-buckets), "building" (the first of them is the first round ever);
  then the rest of the backfill in one untimed-by-rounds call;
- then 8 rounds 15 s apart ending at the seeded clock, starting on a minute: 2 burn-rate
  rounds (a new minute recomputes the burn rates) and 6 plain ones ("steady").

A checkout without sums runs the 8 steady rounds only. Times are wall-clock seconds of one
process on a shared machine: compare sources within one run."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

STEP = 15.0
STEADY = 8
BUILDING = 6  # rounds timed while the sums are built (each writes a bounded share)


def say(line: str = "") -> None:
    print(line, file=sys.stderr, flush=True)


def rounds(config_path: str, now: float, out: str) -> None:
    """The child: run with PYTHONPATH=<checkout>."""
    from alerts import evaluate
    from kneepoint.config import load_config
    from kneepoint.store.db import open_store

    config = load_config(Path(config_path))
    sessions = open_store(config.database)
    first = (now - STEP * (STEADY - 1)) // 60 * 60
    steady = [first + STEP * i for i in range(STEADY)]
    done: list[dict[str, Any]] = []

    def one(at: float, phase: str, previous: float | None) -> None:
        burn = previous is None or at // 60 != previous // 60
        began = time.perf_counter()
        with sessions.begin() as session:
            evaluate.evaluate_once(session, config, at)
        seconds = time.perf_counter() - began
        reach = None
        if hasattr(evaluate, "advance_sums"):
            from kneepoint.store import slo_sums

            with sessions() as session:
                row = slo_sums.progress(session)
                reach = None if row is None else row.until
        done.append({"phase": phase, "at": at, "burn": burn, "seconds": seconds, "until": reach})
        lag = "" if reach is None else f", sums reach {(at - reach) / 3600:.1f} h before"
        say(f"  {phase} round at {at:.0f}: {seconds:.2f} s{' (burn)' if burn else ''}{lag}")

    if hasattr(evaluate, "advance_sums"):
        at, previous = steady[0] - STEP * (BUILDING + 1), None
        for _ in range(BUILDING):  # rounds while the sums are built, each bounded
            one(at, "building", previous)
            previous, at = at, at + STEP
        # The rest of the backfill (hundreds of bounded rounds at fleet size) in one go.
        began = time.perf_counter()
        while True:  # a day per call at most (slo_sums.advance's `most`)
            with sessions.begin() as session:
                if not evaluate.advance_sums(session, config, at, budget=10**9):
                    break
        say(f"  rest of the backfill at once: {time.perf_counter() - began:.1f} s")
        done.append({"phase": "backfill", "seconds": time.perf_counter() - began})
    previous = None
    for at in steady:
        one(at, "steady", previous)
        previous = at
    Path(out).write_text(json.dumps(done))


def label(source: Path) -> str:
    head = subprocess.run(
        ["git", "-C", str(source), "log", "-1", "--format=%h"],
        capture_output=True,
        text=True,
        check=False,
    )
    return head.stdout.strip() or source.name


def summary(result: list[dict[str, Any]]) -> list[str]:
    lines = []
    building = [r for r in result if r["phase"] == "building"]
    rest = [r["seconds"] for r in result if r["phase"] == "backfill"]
    if rest:
        lines.append(f"    the rest of the backfill in one call: {rest[0]:.1f} s")
    if building:
        burns = [r["seconds"] for r in building if r["burn"]]
        total = sum(r["seconds"] for r in building)
        lines.append(
            f"    first round ever (burn, no sums): {building[0]['seconds']:.2f} s; "
            f"building the sums: {len(building)} rounds, {total:.1f} s in all, burn rounds "
            f"median {statistics.median(burns):.2f} s max {max(burns):.2f} s"
        )
    for burn in (True, False):
        times = [r["seconds"] for r in result if r["phase"] == "steady" and r["burn"] == burn]
        if times:
            lines.append(
                f"    steady {'burn-rate' if burn else 'plain'} rounds ({len(times)}): median "
                f"{statistics.median(times):.2f} s, max {max(times):.2f} s"
            )
    return lines


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "rounds":
        rounds(sys.argv[2], float(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=200)
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--raw-hours", type=float, default=12.0)
    parser.add_argument("--source", type=Path, action="append")
    parser.add_argument("--keep", type=Path, help="keep the PostgreSQL cluster in DIR, reuse it")
    args = parser.parse_args()
    import math

    from bench_pages import GPUS, worker, write_config
    from pg_cluster import kept_postgres, throwaway_postgres

    sources = [s.resolve() for s in (args.source or [ROOT])]
    cluster = (lambda: kept_postgres(args.keep)) if args.keep else throwaway_postgres
    with cluster() as database, tempfile.TemporaryDirectory() as folder:
        name = f"slo_{args.replicas}r_{args.days:g}d_{args.raw_hours:g}h".replace(".", "_")
        url, _ = database(name)
        began = time.perf_counter()
        seeded = json.loads(
            worker(
                sources[0],
                "seed",
                *("--url", url, "--replicas", str(args.replicas)),
                *("--nodes", str(math.ceil(args.replicas / GPUS)), "--gpus", str(GPUS)),
                *("--days", str(args.days), "--raw-hours", str(args.raw_hours)),
            )
        )
        say(f"seeded in {time.perf_counter() - began:.0f} s (reused: {seeded['reused']})")
        import psycopg

        base = url.rsplit("/", 1)
        plain = base[0].replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(f"{plain}/postgres", autocommit=True) as connection:
            for number in range(len(sources)):
                connection.execute(f"DROP DATABASE IF EXISTS {base[1]}_run{number}")
                connection.execute(f"CREATE DATABASE {base[1]}_run{number} TEMPLATE {base[1]}")
        results = []
        for number, source in enumerate(sources):
            copy_url = f"{url}_run{number}"
            config = write_config(Path(folder), copy_url, args.replicas)
            out = Path(folder) / f"rounds-{number}.json"
            say(f"{label(source)} ({source}):")
            subprocess.run(
                [sys.executable, __file__, "rounds", str(config), repr(seeded["now"]), str(out)],
                env={**os.environ, "PYTHONPATH": str(source)},
                cwd=source,
                check=True,
            )
            results.append(json.loads(out.read_text()))
    say()
    say(
        f"== {args.replicas} replicas × {args.days:g} days, PostgreSQL, a latency and an "
        "availability SLO (seconds per evaluate_once; shared machine: compare within this run)"
    )
    for source, result in zip(sources, results, strict=True):
        say(f"  {label(source)} ({source}):")
        for line in summary(result):
            say(line)


if __name__ == "__main__":
    main()
