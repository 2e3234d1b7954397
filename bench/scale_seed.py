"""Seed a PostgreSQL store with days of history for many replicas in minutes, for the scale
bench: every row is generated inside PostgreSQL (INSERT … SELECT over generate_series), in
the shape the collector and its rollup job leave behind (store/rollup.py):

- replica and GPU samples every 15 s for the newest `raw_hours` (never more than the raw
  retention keeps), one a minute (resolution 60, gauges as the minute's mean, peaks kept)
  before that;
- the 5-minute and hourly summary tiers (replica_rollups, gpu_rollups) for the whole span,
  with the rollup progress saying how far each reaches, as `summarize` leaves it.

Values start from the real vLLM 0.32 capture (../shared/fixtures), read by kneepoint's own
normalizer and encoded by its writer (so histogram layouts and encodings are the stored
ones): counters and histogram counts grow with time at a rate per replica variant (so they
never reset), KV occupancy and queues follow a daily wave with a faster ripple that crosses
saturation, and GPU readings follow the same wave. A summary row is its bucket's last
sample, as `summarize` writes it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from collectors.engines.vllm import parse_vllm
from kneepoint.samples import HISTOGRAMS, REPLICA_COUNTERS
from kneepoint.store.models import GPU_READINGS, MINUTE, SUMMARY_TIERS
from kneepoint.store.rollup import SETTLE
from kneepoint.store.writer import _replica_row, ensure_targets

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT.parent / "shared" / "fixtures" / "vllm-0.32.0-cpu-prefix-caching.prom"
VARIANTS = 8
GROWTH = 86400.0  # seconds for a counter of variant 0 to grow by its captured value
GPU_MODEL = "NVIDIA H100 80GB HBM3"
CHUNK = 3600.0  # seconds of samples per INSERT (one transaction each)

# In SQL, per row, with `ts` the sample's time and `v` the replica's variant (0..VARIANTS-1),
# computed once per row in an inner select: `f` the growth factor of counters, `w` the wave.
GROWN_SQL = f"1.0 + (ts - {{start}}) * (1.0 + v / {VARIANTS}.0) / {GROWTH}"
WAVE_SQL = (
    f"0.45 + 0.3 * sin(2 * pi() * (ts / 86400.0 + v / {VARIANTS}.0))"
    f" + 0.25 * sin(2 * pi() * (ts / 1800.0 + v / 3.0))"
)
GROWN, WAVE = "f", "w"
KV = "least(1.0, greatest(0.0, w))"


def replica_name(index: int) -> str:
    return f"replica-{index:04d}"


def node_name(index: int) -> str:
    return f"node-{index:03d}"


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(float(value))
    return "'" + str(value).replace("'", "''") + "'"


def _series(first: float, stop: float, step: float) -> str:
    """Times first, first + step, … before `stop`, as a one-column SQL table."""
    count = max(0, math.ceil((stop - first) / step))
    return (
        f"(SELECT {first!r}::float8 + i * {step!r}::float8 FROM generate_series(0, {count - 1}) i)"
    )


def _histogram_sql(encoded: str | None, grown: str) -> str:
    """An encoded histogram (`layout|sum|n0,n1,…`, per-bucket counts) whose counts and sum
    grow by the factor `grown`: each bucket's count floors, so counts never fall."""
    if encoded is None:
        return "NULL"
    layout, total, counts = encoded.split("|")
    parts = [
        "'0'" if float(n) == 0 else f"floor({float(n)!r} * {grown})::bigint::text"
        for n in counts.split(",")
    ]
    return (
        f"concat('{layout}|', ({float(total)!r} * {grown})::text, '|', "
        f"concat_ws(',', {', '.join(parts)}))"
    )


class Seeder:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        replicas: int,
        nodes: int,
        gpus: int,
        now: float,
        days: float,
        raw_hours: float,
        say: Callable[[str], None] = print,
    ) -> None:
        self.sessions, self.replicas, self.nodes, self.gpus = sessions, replicas, nodes, gpus
        self.now = math.floor(now / 15) * 15
        self.start = self.now - days * 86400
        self.raw_from = self.now - raw_hours * 3600
        self.say = say

    def run(self) -> dict[str, int]:
        began = time.perf_counter()
        self._targets()
        counts: dict[str, int] = {}
        counts["replica_samples"] = self._samples("replica")
        counts["gpu_samples"] = self._samples("gpu")
        counts["replica_rollups"] = self._summaries("replica")
        counts["gpu_rollups"] = self._summaries("gpu")
        with self.sessions.begin() as session:
            session.execute(text("ANALYZE"))
        self.say(f"  seeded in {time.perf_counter() - began:.0f} s: {counts}")
        return counts

    def _targets(self) -> None:
        sample = parse_vllm(CAPTURE.read_text())
        with self.sessions.begin() as session:
            names = [
                (replica_name(i), "vllm", f"http://127.0.0.1/r/{i}/metrics")
                for i in range(self.replicas)
            ] + [
                (node_name(j), "dcgm", f"http://127.0.0.1/d/{j}/metrics") for j in range(self.nodes)
            ]
            ids = ensure_targets(session, names)
            self.reference = _replica_row(session, ids[replica_name(0)], self.now, sample)
            cache = sample.cache
            details = {
                "up": True,
                "last_scrape_at": self.now,
                "last_success_at": self.now,
                "consecutive_failures": 0,
                "generation": sample.generation,
                "engine": sample.engine,
                "unavailable": json.dumps(sample.unavailable, sort_keys=True),
                "engines": sample.engines,
                "model_names": json.dumps(sample.model_names),
                "cache_dtype": cache.cache_dtype,
                "block_size": cache.block_size,
                "num_gpu_blocks": cache.num_gpu_blocks,
                "capacity_tokens": cache.capacity_tokens,
                "prefix_caching": cache.enable_prefix_caching,
                "gpu_memory_utilization": cache.gpu_memory_utilization,
            }
            session.execute(
                text(
                    "UPDATE targets SET "
                    + ", ".join(f"{k} = :{k}" for k in details)
                    + " WHERE kind = 'vllm'"
                ),
                details,
            )
            session.execute(
                text(
                    "UPDATE targets SET up = true, last_scrape_at = :t, last_success_at = :t,"
                    " consecutive_failures = 0 WHERE kind = 'dcgm'"
                ),
                {"t": self.now},
            )
            session.execute(
                text(
                    "INSERT INTO gpus (target_id, host, gpu_index, uuid, model, pod, namespace) "
                    "SELECT t.id, t.name, s, 'GPU-' || t.name || '-' || s, :model, "
                    "CASE WHEN n * :g + s < :r THEN 'vllm-' || (n * :g + s) END, 'inference' "
                    "FROM (SELECT id, name, row_number() OVER (ORDER BY id) - 1 AS n "
                    "      FROM targets WHERE kind = 'dcgm') t, generate_series(0, :g - 1) s"
                ),
                {"model": GPU_MODEL, "g": self.gpus, "r": self.replicas},
            )

    # -- the select lists -------------------------------------------------------------------

    def _replica_columns(self, rolled: bool, resolution: int) -> dict[str, str]:
        ref = self.reference
        grown = GROWN
        columns: dict[str, str] = {
            "target_id": "k",
            "ts": "ts",
            "resolution": str(resolution),
            "engines": _literal(ref.get("engines")),
            "kv_cache_usage": KV,
            "kv_cache_usage_mean": KV,
            "requests_running": f"round(12 + 10 * {WAVE})",
            "requests_waiting": f"greatest(0, round(8 * ({WAVE} - 0.6)))",
            "requests_waiting_capacity": _literal(ref.get("requests_waiting_capacity")),
            "requests_swapped": _literal(ref.get("requests_swapped")),
            "prefix_cache_hit_rate_gauge": _literal(ref.get("prefix_cache_hit_rate_gauge")),
            "spec_decode_acceptance_length_gauge": "NULL",
            "spec_decode_acceptance_rate_gauge": "NULL",
            "accepted_per_position": _literal(ref.get("accepted_per_position")),
        }
        if rolled:  # a thinned row or a summary: gauges are means, and peaks are kept
            columns["kv_cache_usage_peak"] = f"least(1.0, {KV} + 0.08)"
            columns["requests_running_peak"] = f"round(14 + 10 * {WAVE})"
            columns["requests_waiting_peak"] = f"greatest(0, round(8 * ({WAVE} - 0.5)))"
        for counter in REPLICA_COUNTERS:
            base = ref.get(counter)
            columns[counter] = (
                "NULL"
                if base is None
                else "0"
                if base == 0
                else f"floor({float(cast(float, base))!r} * {grown})"
            )
        for histogram in HISTOGRAMS:
            columns[f"hist_{histogram}"] = _histogram_sql(
                cast("str | None", ref.get(f"hist_{histogram}")), grown
            )
        return columns

    def _gpu_columns(self, resolution: int) -> dict[str, str]:
        busy = f"least(1.0, greatest(0.0, {WAVE}))"
        power = f"(70 + 630 * (0.3 * {busy} + 0.4 * 0.6 * {busy} + 0.3 * 0.7 * {busy}))"
        readings = {
            "utilization": f"least(1.0, {busy} * 1.15)",
            "gr_engine_active": f"{busy} * 0.97",
            "sm_active": f"{busy} * 0.8",
            "tensor_active": f"{busy} * 0.6",
            "dram_active": f"{busy} * 0.7",
            "power_watts": power,
            "temperature_c": f"round(40 + 30 * {busy})",
            "memory_temperature_c": "NULL",
            "fb_used_mib": "73728",
            "fb_free_mib": "8192",
        }
        assert set(readings) == set(GPU_READINGS)
        return {
            "gpu_id": "k",
            "ts": "ts",
            "resolution": str(resolution),
            # Integrated at 400 W on average: grows with time, never resets.
            "energy_mj": f"1e9 + (ts - {self.start}) * 400000.0",
            "xid_error": "0",
            **readings,
        }

    def _keys(self, kind: str) -> str:
        if kind == "replica":
            return (
                f"(SELECT id AS k, ((row_number() OVER (ORDER BY id) - 1) % {VARIANTS})::float8"
                " AS v FROM targets WHERE kind = 'vllm')"
            )
        return (
            f"(SELECT id AS k, ((row_number() OVER (ORDER BY id) - 1) % {VARIANTS})::float8"
            " AS v FROM gpus)"
        )

    def _insert(self, table: str, columns: dict[str, str], kind: str, times: str) -> int:
        query = (
            f"INSERT INTO {table} ({', '.join(columns)}) "
            f"SELECT {', '.join(columns.values())} FROM ("
            f"SELECT k, ts, {GROWN_SQL.format(start=self.start)} AS f, {WAVE_SQL} AS w "
            f"FROM {times} AS g(ts) CROSS JOIN {self._keys(kind)} AS keys) AS rows"
        )
        with self.sessions.begin() as session:
            result = session.execute(text(query))
        return int(result.rowcount or 0)  # type: ignore[attr-defined]

    # -- samples and summaries -------------------------------------------------------------

    def _samples(self, kind: str) -> int:
        """Minute rows (each minute's last sample, at :45) before raw_from, raw rows after,
        CHUNK seconds per statement, oldest first (as a collector appends them)."""
        table = "replica_samples" if kind == "replica" else "gpu_samples"
        rows, began = 0, time.perf_counter()
        low = self.start
        while low < self.now:
            high = min(low + CHUNK, self.now + 1)
            if low < self.raw_from:
                high = min(high, self.raw_from)
                first = math.ceil((low - 45) / MINUTE) * MINUTE + 45
                times = _series(first, high, 60.0)
                columns = (
                    self._replica_columns(True, MINUTE)
                    if kind == "replica"
                    else self._gpu_columns(MINUTE)
                )
            else:
                first = math.ceil(low / 15) * 15
                times = _series(first, min(high, self.now + 1), 15.0)
                columns = (
                    self._replica_columns(False, 0) if kind == "replica" else self._gpu_columns(0)
                )
            rows += self._insert(table, columns, kind, times)
            low = high
        self.say(f"  {table}: {rows:,} rows in {time.perf_counter() - began:.0f} s")
        return rows

    def _summaries(self, kind: str) -> int:
        """Both summary tiers over the whole span, as far as `summarize` would have written
        them by now; a summary row stands at its bucket's last sample."""
        table = "replica_rollups" if kind == "replica" else "gpu_rollups"
        rows, began = 0, time.perf_counter()
        limit = self.now - SETTLE
        for resolution in SUMMARY_TIERS:
            first = math.floor(self.start / resolution) * resolution
            until = math.floor(limit / resolution) * resolution
            low = first
            while low < until:
                high = min(low + resolution * 288, until)
                # The last sample of a bucket: its last 15 s scrape (raw), or the last
                # minute row's :45 (older); either way bucket end - 15 s.
                times = _series(low + resolution - 15, high, float(resolution))
                if kind == "replica":
                    columns = self._replica_columns(True, resolution)
                    columns["saturated_seconds"] = (
                        f"CASE WHEN {KV} > 0.9 THEN {resolution * 0.25} ELSE 0 END"
                    )
                    columns["ends_saturated"] = f"({KV} > 0.9)"
                else:
                    columns = self._gpu_columns(resolution)
                rows += self._insert(table, columns, kind, times)
                low = high
            limit = until
            with self.sessions.begin() as session:
                session.execute(
                    text(
                        "INSERT INTO rollup_progress (table_name, resolution, until) "
                        "VALUES (:t, :r, :u)"
                    ),
                    {"t": table, "r": resolution, "u": until},
                )
        self.say(f"  {table}: {rows:,} rows in {time.perf_counter() - began:.0f} s")
        return rows
