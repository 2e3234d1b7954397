"""Page query benchmark: server-side work of the Overview and Capacity pages over a store of
50 replicas × 7 days (two days raw at 15 s, the rest rolled up to one row a minute, and the
5-minute and hourly summary tiers that long ranges read).

    .venv/bin/python bench/bench_pages.py [--replicas 50] [--days 7]

Prints the seconds each page's data takes (status, series, view) for 1 h, 24 h and 7 d.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import insert

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collectors.vllm import parse_vllm  # noqa: E402
from kneepoint.config import Config, Target  # noqa: E402
from kneepoint.samples import Histogram  # noqa: E402
from kneepoint.series import COLUMNS as SERIES_COLUMNS  # noqa: E402
from kneepoint.series import replica_series  # noqa: E402
from kneepoint.status import build_status  # noqa: E402
from kneepoint.store import queries  # noqa: E402
from kneepoint.store.db import open_store  # noqa: E402
from kneepoint.store.models import MINUTE, ReplicaSampleRow  # noqa: E402
from kneepoint.store.rollup import GPU_SHAPE, REPLICA_SHAPE, summarize  # noqa: E402
from kneepoint.store.writer import _replica_row, ensure_targets  # noqa: E402
from kneepoint.views import build_view  # noqa: E402

CAPTURE = ROOT.parent / "shared" / "fixtures" / "vllm-0.32.0-cpu-prefix-caching.prom"


def fill(sessions, replicas: int, days: float, now: float) -> int:  # type: ignore[no-untyped-def]
    base = parse_vllm(CAPTURE.read_text())
    times = [now - days * 86400 + i * 60.0 for i in range(int((days - 2) * 1440))]
    times += [now - 2 * 86400 + i * 15.0 for i in range(2 * 5760)]
    names = [(f"replica-{i:02d}", "vllm", f"http://r{i}/metrics") for i in range(replicas)]
    rows = 0
    with sessions.begin() as session:
        ids = ensure_targets(session, names)
    for name, _, _ in names:
        sample = copy.deepcopy(base)
        batch = []
        with sessions.begin() as session:
            for step, ts in enumerate(times):
                for counter in (
                    "generation_tokens",
                    "prompt_tokens",
                    "prefix_cache_queries",
                    "prefix_cache_hits",
                    "request_prompt_tokens_count",
                ):
                    sample.counters[counter] = (sample.counters[counter] or 0) + 37 + step % 11
                sample.gauges["kv_cache_usage"] = (step % 97) / 100
                for key, histogram in sample.histograms.items():
                    counts = tuple(c + i for i, c in enumerate(histogram.counts))
                    sample.histograms[key] = Histogram(
                        histogram.bounds, counts, histogram.total + 1
                    )
                row = _replica_row(session, ids[name], ts, sample)
                row["resolution"] = MINUTE if ts < now - 2 * 86400 else 0
                batch.append(row)
            session.execute(insert(ReplicaSampleRow.__table__), batch)
        rows += len(batch)
    return rows


def timed(work) -> float:  # type: ignore[no-untyped-def]
    began = time.perf_counter()
    work()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=50)
    parser.add_argument("--days", type=float, default=7)
    parser.add_argument("--keep", help="Keep the store in this file and reuse it next time.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(args.keep) if args.keep else Path(folder) / "pages.db"
        url = f"sqlite:///{path}"
        reuse = path.exists()
        sessions = open_store(url)
        stamp = path.with_suffix(".now")
        if reuse and stamp.exists():
            now = float(stamp.read_text())
        else:
            now = time.time()
            began = time.perf_counter()
            rows = fill(sessions, args.replicas, args.days, now)
            stamp.write_text(repr(now)) if args.keep else None
            print(
                f"store: {args.replicas} replicas × {args.days:g} days = {rows:,} rows "
                f"(filled in {time.perf_counter() - began:.0f} s)"
            )
        # What the collector's rollup job writes a bucket at a time, every 5 minutes; here the
        # whole history at once (a no-op when a kept store is up to date).
        began = time.perf_counter()
        with sessions.begin() as session:
            written = sum(summarize(session, shape, now) for shape in (REPLICA_SHAPE, GPU_SHAPE))
        if written:
            print(f"summaries: {written:,} rows (written in {time.perf_counter() - began:.0f} s)")
        config = Config(
            database=url,
            targets=[
                Target(name=f"replica-{i:02d}", kind="vllm", url=f"http://r{i}/metrics")
                for i in range(args.replicas)
            ],
        )
        for label, window in (("1h", 3600.0), ("24h", 86400.0), ("7d", 7 * 86400.0)):
            with sessions() as session:

                def overview(window: float = window) -> None:
                    build_status(session, config, now, 300.0)
                    names = {row.id: n for n, row in queries.targets(session).items()}
                    frame = queries.replica_frame(
                        session, now - window, now, columns=SERIES_COLUMNS
                    )
                    replica_series(frame, names)

                overview_s = timed(overview)
                capacity_s = timed(lambda w=window: build_view(session, config, now, w))
            print(f"range {label:>3}: Overview {overview_s:.2f} s, Capacity {capacity_s:.2f} s")


if __name__ == "__main__":
    main()
