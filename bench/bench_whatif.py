"""The what-if's cost on the demo store, and what the slice length costs in accuracy.

    .venv/bin/python bench/bench_whatif.py [--replica qwen3-4b-l4] [--slices 5,10,20,60]
        [--days 7] [--keep DIR] [--store CONFIG]

Seeds a store as `kneepoint demo` does (its fleet, its week of backfill, its twin sweeps),
calibrates the replica over the window, then times, per replica-week: the baseline (history
read, prefix share, the unchanged replay: computed once per replica, calibration and
window, kneepoint/whatif/predict.py baseline_replay) and one recommendation's replay as the
weekly review makes it (whatif_replica with that baseline, no predicted knee), and the
predicted knees the page adds (two predicted sweeps, the baseline's then kept). Then the
baseline at each slice length against what the store measured (the twin generated it: known
truth). `--store` reuses a store seeded before (its config file; seeding a demo week takes
minutes). Times are wall-clock seconds of one process on a shared machine."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import func, select  # noqa: E402

from kneepoint.config import load_config  # noqa: E402
from kneepoint.demo import (  # noqa: E402
    FLEET,
    HISTORY_OVERLOADS,
    HISTORY_PEAKS,
    HISTORY_SLEEPS,
    sweep_runs,
    write_config,
)
from kneepoint.store.db import connect_store  # noqa: E402
from kneepoint.store.models import ReplicaSampleRow  # noqa: E402
from kneepoint.store.runs import save_run  # noqa: E402
from kneepoint.twin.backfill import backfill_week  # noqa: E402
from kneepoint.twin.fleet import Fleet, FleetSpec  # noqa: E402
from kneepoint.whatif import Change  # noqa: E402
from kneepoint.whatif.predict import baseline_replay, calibrate_replica, whatif_replica  # noqa: E402
from tests.conftest import migrated  # noqa: E402

KEYS = (
    "generation_tokens_per_second",
    "kv_cache_occupancy_p95",
    "ttft_p99_seconds",
    "preemptions",
    "prefix_cache_hit_rate",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replica", default="qwen3-4b-l4")
    parser.add_argument("--slices", default="5,10,20,60")
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--keep", type=Path, default=None)
    parser.add_argument("--store", type=Path, default=None)
    args = parser.parse_args()
    if args.store is not None:
        config = load_config(args.store)
        sessions = connect_store(config.database)
        with sessions() as session:
            now = float(session.scalar(select(func.max(ReplicaSampleRow.ts))) or 0.0)
    else:
        config, sessions, now = seed(args.keep, args.days)
    run(config, sessions, now, args)


def seed(keep: Path | None, days: float) -> tuple[Any, Any, float]:
    """A store as `kneepoint demo` seeds it: (config, sessions, its end)."""
    folder = keep or Path(tempfile.mkdtemp(prefix="bench-whatif-"))
    folder.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    fleet = Fleet(FleetSpec.model_validate(FLEET)).start()
    try:
        config_file = migrated(write_config(folder, fleet))
        config = load_config(config_file)
        sessions = connect_store(config.database)
        now = float(int(time.time()) - 60)
        backfill_week(
            sessions,
            fleet,
            HISTORY_PEAKS,
            now,
            days=days,
            sleeps=HISTORY_SLEEPS,
            overloads=HISTORY_OVERLOADS,
        )
        with sessions.begin() as session:
            for run in sweep_runs(fleet):
                save_run(session, run, now)
    finally:
        fleet.stop()
    print(f"store: {days:g} days of the demo fleet in {time.perf_counter() - began:.0f} s")
    print(f"       {folder / 'kneepoint.yaml'} (reuse: --store)")
    return config, sessions, now


def run(config: Any, sessions: Any, now: float, args: argparse.Namespace) -> None:
    start = now - args.days * 86400.0
    week = args.days / 7.0
    with sessions() as session:
        profile = calibrate_replica(session, config, args.replica, None, start, now)
        profile.require_trusted()
        slices = [float(s) for s in args.slices.split(",")]
        print(f"{args.replica}: calibrated (rms {profile.fit.rms:.3f})")
        print(
            "slice_s  baseline_s/week (cpu)  change_s/week (cpu)  knees_s  buckets  "
            + "  ".join(KEYS)
        )
        for slice_seconds in slices:
            cpu = time.process_time()
            base = baseline_replay(
                session, args.replica, profile, start, now, config.slos, 0, slice_seconds
            )
            base_cpu = time.process_time() - cpu
            timed, cpu = time.perf_counter(), time.process_time()
            result = whatif_replica(
                session,
                config,
                args.replica,
                Change(kv_cache_dtype="fp8"),
                start,
                now,
                profile=profile,
                slice_seconds=slice_seconds,
                baseline=base,
                knees=False,
            )
            change = time.perf_counter() - timed
            change_cpu = time.process_time() - cpu
            timed = time.perf_counter()
            whatif_replica(
                session,
                config,
                args.replica,
                Change(kv_cache_dtype="fp8"),
                start,
                now,
                profile=profile,
                slice_seconds=slice_seconds,
                baseline=base,
            )
            knees = time.perf_counter() - timed - change
            measured = base.history.measured()
            numbers = base.replay.numbers
            cells = []
            for key in KEYS:
                got, truth = numbers.get(key), measured.get(key)
                if isinstance(got, float | int) and isinstance(truth, float | int) and truth:
                    cells.append(f"{got:.4g}/{truth:.4g} ({(got - truth) / truth:+.0%})")
                else:
                    cells.append(f"{got}/{truth}")
            print(
                f"{slice_seconds:7g}  {base.seconds / week:9.2f} ({base_cpu / week:5.2f})  "
                f"{change / week:7.2f} ({change_cpu / week:5.2f})  "
                f"{knees:7.2f}  "
                f"{result.how['buckets']:7d}  " + "  ".join(cells),
                flush=True,
            )
    print(
        "cells: baseline/measured (relative error); seconds are per replica-week, wall "
        "(and this process's CPU)"
    )


if __name__ == "__main__":
    main()
