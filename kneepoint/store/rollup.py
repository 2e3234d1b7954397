"""Downsampling and retention: raw rows -> one per minute -> one per hour -> gone.

Counters are cumulative, so thinning them is lossless for increase() between kept rows as
long as both samples around each reset survive: a bucket keeps its last row plus those.
Gauges on a kept row become the bucket's mean, and `*_peak` columns its maximum, so peaks
and averages stay right at every resolution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy import Table, and_, bindparam, delete, select, update
from sqlalchemy.orm import Session

from kneepoint.config import Retention
from kneepoint.counters import reset_points
from kneepoint.samples import REPLICA_COUNTERS
from kneepoint.store.models import (
    GPU_READINGS,
    HOUR,
    MINUTE,
    RAW,
    GpuSampleRow,
    ReplicaSampleRow,
    ScrapeErrorRow,
)


@dataclass(frozen=True)
class Shape:
    """How one sample table rolls up."""

    table: Table
    key: str
    counters: tuple[str, ...]
    means: tuple[str, ...]
    peaks: dict[str, str]  # peak column -> the gauge it is the maximum of


REPLICA_SHAPE = Shape(
    ReplicaSampleRow.__table__,  # type: ignore[arg-type]
    "target_id",
    REPLICA_COUNTERS,
    (
        "kv_cache_usage",
        "kv_cache_usage_mean",
        "requests_running",
        "requests_waiting",
        "requests_waiting_capacity",
        "requests_swapped",
        "prefix_cache_hit_rate_gauge",
    ),
    {
        "kv_cache_usage_peak": "kv_cache_usage",
        "requests_running_peak": "requests_running",
        "requests_waiting_peak": "requests_waiting",
    },
)
GPU_SHAPE = Shape(
    GpuSampleRow.__table__,  # type: ignore[arg-type]
    "gpu_id",
    ("energy_mj",),
    GPU_READINGS,
    {},
)


@dataclass
class RollupResult:
    thinned: int = 0
    expired: int = 0


def rollup(session: Session, now: float, retention: Retention) -> RollupResult:
    """Apply the retention tiers as of `now`; safe to run at any interval, and idempotent."""
    result = RollupResult()
    for shape in (REPLICA_SHAPE, GPU_SHAPE):
        result.thinned += _thin(session, shape, RAW, MINUTE, now - retention.raw)
        result.thinned += _thin(session, shape, MINUTE, HOUR, now - retention.minute)
        expired = session.execute(
            delete(shape.table).where(shape.table.c.ts < now - retention.hour)
        )
        result.expired += expired.rowcount or 0
    errors = session.execute(delete(ScrapeErrorRow).where(ScrapeErrorRow.ts < now - retention.raw))
    result.expired += errors.rowcount or 0
    return result


def _thin(session: Session, shape: Shape, source: int, target: int, older_than: float) -> int:
    # Only whole buckets: a bucket still filling would lose the rows that arrive later.
    cutoff = math.floor(older_than / target) * target
    table = shape.table
    rows = (
        session.execute(
            select(table)
            .where(table.c.resolution == source, table.c.ts < cutoff)
            .order_by(table.c[shape.key], table.c.ts)
        )
        .mappings()
        .all()
    )
    updates: list[dict] = []
    removals: list[dict] = []
    group: list = []
    for row in rows:
        if group and row[shape.key] != group[0][shape.key]:
            _thin_group(shape, group, target, updates, removals)
            group = []
        group.append(row)
    if group:
        _thin_group(shape, group, target, updates, removals)
    if updates:
        columns = {c: bindparam(c) for c in (*shape.means, *shape.peaks, "resolution")}
        statement = (
            update(table)
            .where(and_(table.c[shape.key] == bindparam("k"), table.c.ts == bindparam("t")))
            .values(columns)
        )
        session.execute(statement, updates)
    if removals:
        statement = delete(table).where(
            and_(table.c[shape.key] == bindparam("k"), table.c.ts == bindparam("t"))
        )
        session.execute(statement, removals)
    return len(removals)


def _thin_group(
    shape: Shape, rows: list, resolution: int, updates: list[dict], removals: list[dict]
) -> None:
    keep_raw: set[int] = set()
    for counter in shape.counters:
        values = [row[counter] for row in rows]
        for before in reset_points(values):
            # Both sides of a reset stay: the drop between them is what marks the reset.
            after = next(i for i in range(before + 1, len(values)) if values[i] is not None)
            keep_raw.update((before, after))
    buckets: dict[int, list[int]] = {}
    for index, row in enumerate(rows):
        buckets.setdefault(int(row["ts"] // resolution), []).append(index)
    for members in buckets.values():
        last = members[-1]
        values = {"k": rows[last][shape.key], "t": rows[last]["ts"], "resolution": resolution}
        for column in shape.means:
            known = [rows[i][column] for i in members if rows[i][column] is not None]
            values[column] = sum(known) / len(known) if known else None
        for peak, gauge in shape.peaks.items():
            candidates = [
                rows[i][peak] if rows[i][peak] is not None else rows[i][gauge] for i in members
            ]
            known = [c for c in candidates if c is not None]
            values[peak] = max(known) if known else None
        updates.append(values)
        for index in members[:-1]:
            if index in keep_raw:
                # A sample next to a reset stays, so increases across the reset stay exact.
                updates.append(_as_update(shape, rows[index], resolution))
            else:
                removals.append({"k": rows[index][shape.key], "t": rows[index]["ts"]})


def _as_update(shape: Shape, row, resolution: int) -> dict:  # type: ignore[no-untyped-def]
    values = {"k": row[shape.key], "t": row["ts"], "resolution": resolution}
    values.update({column: row[column] for column in shape.means})
    values.update(
        {
            peak: row[peak] if row[peak] is not None else row[gauge]
            for peak, gauge in shape.peaks.items()
        }
    )
    return values
