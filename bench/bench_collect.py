"""Collector benchmark: CPU per scrape of the real vLLM capture, and storage per replica-day.

    .venv/bin/python bench/bench_collect.py

Prints (1) CPU milliseconds per scrape, split into parse + normalize and store, for the real
~50 KB vLLM 0.32 capture, and (2) bytes stored per replica-day at a 15 s interval, raw and
after rollups, with what a year of one replica takes under the default retention, and (3)
parse + normalize CPU per scrape of each other engine's fixture (ENGINE_CAPTURES).
"""

from __future__ import annotations

import copy
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collectors.engines.llamacpp import parse_llamacpp  # noqa: E402
from collectors.engines.sglang import parse_sglang  # noqa: E402
from collectors.engines.tgi import parse_tgi  # noqa: E402
from collectors.engines.trtllm import parse_trtllm  # noqa: E402
from collectors.engines.vllm import parse_vllm  # noqa: E402
from kneepoint.config import Retention  # noqa: E402
from kneepoint.samples import Histogram, ReplicaSample  # noqa: E402
from kneepoint.store.db import open_store  # noqa: E402
from kneepoint.store.rollup import rollup  # noqa: E402
from kneepoint.store.writer import ensure_targets, record_replica  # noqa: E402

CAPTURE = ROOT.parent / "shared" / "fixtures" / "vllm-0.32.0-cpu-prefix-caching.prom"
DAY = 86400.0
INTERVAL = 15.0

FIXTURES = ROOT / "tests" / "fixtures"
# Each engine's exposition whose parse + normalize CPU is measured beside vLLM's: (label,
# file, normalizer). Add an engine by adding its row.
ENGINE_CAPTURES: list[tuple[str, Path, Callable[[str], ReplicaSample]]] = [
    ("TGI 3.3.7", FIXTURES / "tgi-3.3.7-speculate2.prom", parse_tgi),
    ("TGI 2.2.0", FIXTURES / "tgi-2.2.0-idle.prom", parse_tgi),
    ("TensorRT-LLM full", FIXTURES / "trtllm-full-iteration-stats.prom", parse_trtllm),
    ("TensorRT-LLM kv", FIXTURES / "trtllm-1.3-kv-gauges.prom", parse_trtllm),
    ("TensorRT-LLM basic", FIXTURES / "trtllm-1.0-unprefixed.prom", parse_trtllm),
    ("llama.cpp b11434", FIXTURES / "llamacpp-b11434-busy.prom", parse_llamacpp),
    ("SGLang 0.5.23", FIXTURES / "sglang-0.5.23-priority.prom", parse_sglang),
    ("SGLang 0.5.10 tp2", FIXTURES / "sglang-0.5.10-tp2-all-schedulers.prom", parse_sglang),
]


def cpu_per_scrape(text: str, sessions, batches: int = 7, rounds: int = 60):  # type: ignore[no-untyped-def]
    """CPU ms per scrape for parse + normalize and for storing (one commit per scrape), as
    (median, best) over batches: this machine is shared, so one batch can be slowed by others."""
    with sessions.begin() as session:
        target = ensure_targets(session, [("bench", "vllm", "http://bench/metrics")])["bench"]
    parse_ms, store_ms, ts = [], [], 1e9
    for _ in range(batches):
        parse_cpu = store_cpu = 0.0
        for _ in range(rounds):
            began = time.process_time()
            sample = parse_vllm(text)
            parsed = time.process_time()
            with sessions.begin() as session:
                record_replica(session, target, ts, sample)
            ts += INTERVAL
            parse_cpu += parsed - began
            store_cpu += time.process_time() - parsed
        parse_ms.append(parse_cpu / rounds * 1000)
        store_ms.append(store_cpu / rounds * 1000)
    total = [p + s for p, s in zip(parse_ms, store_ms, strict=True)]
    return {
        "total": (statistics.median(total), min(total)),
        "parse": (statistics.median(parse_ms), min(parse_ms)),
        "store": (statistics.median(store_ms), min(store_ms)),
    }


def parse_cpu(
    text: str, parse: Callable[[str], ReplicaSample], batches: int = 7, rounds: int = 60
) -> tuple[float, float]:
    """CPU ms of parse + normalize per scrape, (median, best) over batches."""
    per_batch = []
    for _ in range(batches):
        began = time.process_time()
        for _ in range(rounds):
            parse(text)
        per_batch.append((time.process_time() - began) / rounds * 1000)
    return statistics.median(per_batch), min(per_batch)


def a_day_of_scrapes(base: ReplicaSample, start: float) -> list[tuple[float, ReplicaSample]]:
    """A replica under varying load: counters grow, histograms fill, gauges move."""
    rng = random.Random(7)
    points = []
    current = copy.deepcopy(base)
    for step in range(int(DAY / INTERVAL)):
        current = copy.deepcopy(current)
        load = 0.5 + 0.5 * rng.random()
        for name, value in current.counters.items():
            if value is not None:
                current.counters[name] = value + int(rng.random() * 400 * load)
        current.gauges["kv_cache_usage"] = round(rng.random() * load, 4)
        current.gauges["kv_cache_usage_mean"] = current.gauges["kv_cache_usage"]
        current.gauges["requests_running"] = float(rng.randint(0, 64))
        current.gauges["requests_waiting"] = float(rng.randint(0, 8))
        for name, histogram in current.histograms.items():
            added = [rng.randint(0, 3) if i % 3 else 0 for i in range(len(histogram.counts))]
            counts, running = [], 0.0
            for count, extra in zip(histogram.counts, added, strict=True):
                running += extra
                counts.append(count + running)
            current.histograms[name] = Histogram(
                histogram.bounds, tuple(counts), histogram.total + rng.random() * 5
            )
        points.append((start + step * INTERVAL, current))
    return points


def database_bytes(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connection.execute("VACUUM")
        pages = connection.execute("PRAGMA page_count").fetchone()[0]
        size = connection.execute("PRAGMA page_size").fetchone()[0]
    return int(pages * size)


def storage_per_replica_day(base: ReplicaSample, folder: Path) -> tuple[int, int, int]:
    """Bytes for one replica-day raw, after the minute rollup, and after the hour rollup."""
    empty = folder / "empty.db"
    open_store(f"sqlite:///{empty}")
    baseline = database_bytes(empty)
    path = folder / "day.db"
    sessions = open_store(f"sqlite:///{path}")
    with sessions.begin() as session:
        target = ensure_targets(session, [("bench", "vllm", "http://bench/metrics")])["bench"]
        for ts, sample in a_day_of_scrapes(base, start=0.0):
            record_replica(session, target, ts, sample)
    raw = database_bytes(path) - baseline
    retention = Retention()
    with sessions.begin() as session:
        rollup(session, now=DAY + retention.raw + 60, retention=retention)
    minute = database_bytes(path) - baseline
    with sessions.begin() as session:
        rollup(session, now=DAY + retention.minute + 3600, retention=retention)
    hour = database_bytes(path) - baseline
    return raw, minute, hour


def machine_speed() -> float:
    """CPU ms for a fixed pure-Python loop: to read the figures above against this machine."""
    began = time.process_time()
    sum(range(10_000_000))
    return (time.process_time() - began) * 1000


def main() -> None:
    text = CAPTURE.read_text()
    base = parse_vllm(text)
    with tempfile.TemporaryDirectory() as folder:
        sessions = open_store(f"sqlite:///{Path(folder) / 'cpu.db'}")
        cpu = cpu_per_scrape(text, sessions)
        raw, minute, hour = storage_per_replica_day(base, Path(folder))
    retention = Retention()
    year = (
        raw * retention.raw
        + minute * (retention.minute - retention.raw)
        + hour * (365 * DAY - retention.minute)
    ) / DAY
    print(f"capture: {CAPTURE.name} ({len(text.encode()) / 1024:.1f} KiB)")
    for part, label in (
        ("total", "CPU per scrape"),
        ("parse", "  parse + normalize"),
        ("store", "  store"),
    ):
        median, best = cpu[part]
        print(f"{label}: {median:.2f} ms median, {best:.2f} ms best of 7 batches")
    print(
        f"bytes per replica-day at {INTERVAL:g}s: raw {raw / 1e6:.2f} MB, "
        f"after minute rollup {minute / 1e6:.3f} MB, after hour rollup {hour / 1e3:.1f} kB"
    )
    print(f"one replica for a year (48h raw, 35d minute, rest hourly): {year / 1e6:.1f} MB")
    for label, path, parse in ENGINE_CAPTURES:
        engine_text = path.read_text()
        median, best = parse_cpu(engine_text, parse)
        print(
            f"{label} ({path.name}, {len(engine_text.encode()) / 1024:.1f} KiB): parse + "
            f"normalize {median:.2f} ms median, {best:.2f} ms best of 7 batches"
        )
    print(f"machine: sum(range(10**7)) takes {machine_speed():.0f} ms of CPU here")


if __name__ == "__main__":
    main()
