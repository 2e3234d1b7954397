"""The what-if's cost on the demo store, and what the slice length costs in accuracy.

    .venv/bin/python bench/bench_whatif.py [--replica qwen3-4b-l4] [--slices 5,10,20,60]
        [--days 7] [--keep DIR]

Seeds a store as `kneepoint demo` does (its fleet, its week of backfill, its twin sweeps),
calibrates the replica over the window, then times, per replica-week: the baseline (history
read, prefix share, the unchanged replay: computed once per replica, calibration and
window, kneepoint/whatif/predict.py baseline_replay) and one recommendation's replay
(whatif_replica with that baseline: the changed replay, the knee and the numbers). Then the
baseline at each slice length against what the store measured (the twin generated it: known
truth). Times are wall-clock seconds of one process on a shared machine."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KEYS = (
    "generation_tokens_per_second",
    "kv_cache_occupancy_p95",
    "ttft_p99_seconds",
    "preemptions",
    "prefix_cache_hit_rate",
)


def main() -> None:
    from kneepoint.config import load_config
    from kneepoint.demo import (
        FLEET,
        HISTORY_OVERLOADS,
        HISTORY_PEAKS,
        HISTORY_SLEEPS,
        sweep_runs,
        write_config,
    )
    from kneepoint.store.db import connect_store
    from kneepoint.store.runs import save_run
    from kneepoint.twin.backfill import backfill_week
    from kneepoint.twin.fleet import Fleet, FleetSpec
    from kneepoint.whatif import Change
    from kneepoint.whatif.predict import baseline_replay, calibrate_replica, whatif_replica
    from tests.conftest import migrated

    parser = argparse.ArgumentParser()
    parser.add_argument("--replica", default="qwen3-4b-l4")
    parser.add_argument("--slices", default="5,10,20,60")
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-whatif-"))
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
            days=args.days,
            sleeps=HISTORY_SLEEPS,
            overloads=HISTORY_OVERLOADS,
        )
        with sessions.begin() as session:
            for run in sweep_runs(fleet):
                save_run(session, run, now)
    finally:
        fleet.stop()
    print(f"store: {args.days:g} days of the demo fleet in {time.perf_counter() - began:.0f} s")
    start = now - args.days * 86400.0
    week = args.days / 7.0
    with sessions() as session:
        profile = calibrate_replica(session, config, args.replica, None, start, now)
        profile.require_trusted()
        slices = [float(s) for s in args.slices.split(",")]
        print(f"{args.replica}: calibrated (rms {profile.fit.rms:.3f})")
        print("slice_s  baseline_s/week  change_s/week  buckets  " + "  ".join(KEYS))
        for slice_seconds in slices:
            base = baseline_replay(
                session, args.replica, profile, start, now, config.slos, 0, slice_seconds
            )
            timed = time.perf_counter()
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
            )
            change = time.perf_counter() - timed
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
                f"{slice_seconds:7g}  {base.seconds / week:15.2f}  {change / week:13.2f}  "
                f"{result.how['buckets']:7d}  " + "  ".join(cells),
                flush=True,
            )
    print("cells: baseline/measured (relative error); seconds are per replica-week")


if __name__ == "__main__":
    main()
