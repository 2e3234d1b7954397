"""Downsampling and retention: raw rows -> one per minute -> one per hour -> gone.

Counters are cumulative, so thinning them is lossless for increase() between kept rows as
long as both samples around each reset survive: a bucket keeps its last row plus those.
Gauges on a kept row become the bucket's mean, and `*_peak` columns its maximum, so peaks
and averages stay right at every resolution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import groupby
from typing import Any, cast

from sqlalchemy import CursorResult, RowMapping, Table, and_, bindparam, delete, select, update
from sqlalchemy.orm import Session

from kneepoint.config import Retention
from kneepoint.counters import reset_points
from kneepoint.samples import REPLICA_COUNTERS, REPLICA_GAUGES
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
    cast(Table, ReplicaSampleRow.__table__),
    "target_id",
    REPLICA_COUNTERS,
    REPLICA_GAUGES,
    {
        "kv_cache_usage_peak": "kv_cache_usage",
        "requests_running_peak": "requests_running",
        "requests_waiting_peak": "requests_waiting",
    },
)
GPU_SHAPE = Shape(
    cast(Table, GpuSampleRow.__table__),
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
        result.expired += _delete(session, shape.table, now - retention.hour)
    result.expired += _delete(session, cast(Table, ScrapeErrorRow.__table__), now - retention.raw)
    return result


def _delete(session: Session, table: Table, older_than: float) -> int:
    deleted = cast(CursorResult[Any], session.execute(delete(table).where(table.c.ts < older_than)))
    return deleted.rowcount or 0


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
    updates: list[dict[str, Any]] = []
    removals: list[dict[str, Any]] = []
    for _, group in groupby(rows, key=lambda row: row[shape.key]):
        kept, removed = _thin_series(shape, list(group), target)
        updates += kept
        removals += removed
    by_key = and_(table.c[shape.key] == bindparam("k"), table.c.ts == bindparam("t"))
    if updates:
        columns: dict[str, Any] = {
            c: bindparam(c) for c in (*shape.means, *shape.peaks, "resolution")
        }
        session.execute(update(table).where(by_key).values(columns), updates)
    if removals:
        session.execute(delete(table).where(by_key), removals)
    return len(removals)


def _thin_series(
    shape: Shape, rows: list[RowMapping], resolution: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """For one series' rows: the updates that turn kept rows into rollups, and the removals."""
    around_resets = _around_resets(shape, rows)
    buckets: dict[int, list[int]] = {}
    for index, row in enumerate(rows):
        buckets.setdefault(int(row["ts"] // resolution), []).append(index)
    updates: list[dict[str, Any]] = []
    removals: list[dict[str, Any]] = []
    for members in buckets.values():
        updates.append(_rolled_up(shape, [rows[i] for i in members], resolution))
        for index in members[:-1]:
            if index in around_resets:
                # A sample next to a reset stays, so increases across the reset stay exact.
                updates.append(_rolled_up(shape, [rows[index]], resolution))
            else:
                removals.append({"k": rows[index][shape.key], "t": rows[index]["ts"]})
    return updates, removals


def _around_resets(shape: Shape, rows: list[RowMapping]) -> set[int]:
    """Indexes of the samples on both sides of every counter reset."""
    kept: set[int] = set()
    for counter in shape.counters:
        values = [row[counter] for row in rows]
        for before in reset_points(values):
            after = next(i for i in range(before + 1, len(values)) if values[i] is not None)
            kept.update((before, after))
    return kept


def _rolled_up(shape: Shape, members: list[RowMapping], resolution: int) -> dict[str, Any]:
    """The last member, with gauges replaced by the members' mean and peaks by their max."""
    last = members[-1]
    values: dict[str, Any] = {"k": last[shape.key], "t": last["ts"], "resolution": resolution}
    for column in shape.means:
        known = [row[column] for row in members if row[column] is not None]
        values[column] = sum(known) / len(known) if known else None
    for peak, gauge in shape.peaks.items():
        candidates = [row[peak] if row[peak] is not None else row[gauge] for row in members]
        known = [value for value in candidates if value is not None]
        values[peak] = max(known) if known else None
    return values
