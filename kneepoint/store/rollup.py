"""Downsampling and retention: raw rows -> one per minute -> one per hour -> gone.

Counters are cumulative, so thinning them is lossless for increase() between kept rows as
long as both samples around each reset survive: a bucket keeps its last row plus those.
Gauges on a kept row become the bucket's mean, and `*_peak` columns its maximum, so peaks
and averages stay right at every resolution.

Beside the samples, `summarize` keeps the same thinning at 5 minutes and an hour in summary
tables (replica_rollups, gpu_rollups), written as soon as a bucket is whole: a week's range
then reads a few hundred rows per replica (queries.plan), and stays exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import groupby
from typing import Any, cast

from sqlalchemy import (
    CursorResult,
    RowMapping,
    Table,
    and_,
    bindparam,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session

from kneepoint.config import Retention
from kneepoint.counters import reset_points
from kneepoint.samples import REPLICA_COUNTERS, REPLICA_GAUGES, SATURATION
from kneepoint.store.models import (
    GPU_READINGS,
    HOUR,
    MINUTE,
    RAW,
    SUMMARY_TIERS,
    GpuRollupRow,
    GpuRow,
    GpuSampleRow,
    ReplicaRollupRow,
    ReplicaSampleRow,
    RollupProgressRow,
    ScrapeErrorRow,
    TargetRow,
)

# A bucket is summarized this long after it ends, so that scrapes still in flight land first.
SETTLE = 60.0


@dataclass(frozen=True)
class Shape:
    """How one sample table rolls up."""

    table: Table
    key: str
    counters: tuple[str, ...]
    means: tuple[str, ...]
    peaks: dict[str, str]  # peak column -> the gauge it is the maximum of
    rollups: Table  # its summary tiers
    keys: Table  # the table whose ids are the series keys
    saturation: str | None = None  # the gauge whose time above SATURATION is summed


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
    cast(Table, ReplicaRollupRow.__table__),
    cast(Table, TargetRow.__table__),
    "kv_cache_usage",
)
GPU_SHAPE = Shape(
    cast(Table, GpuSampleRow.__table__),
    "gpu_id",
    ("energy_mj",),
    GPU_READINGS,
    {},
    cast(Table, GpuRollupRow.__table__),
    cast(Table, GpuRow.__table__),
)


@dataclass
class RollupResult:
    thinned: int = 0
    expired: int = 0
    summarized: int = 0


def rollup(session: Session, now: float, retention: Retention) -> RollupResult:
    """Apply the retention tiers as of `now`; safe to run at any interval, and idempotent."""
    result = RollupResult()
    for shape in (REPLICA_SHAPE, GPU_SHAPE):
        result.summarized += summarize(session, shape, now)
        result.thinned += _thin(session, shape, RAW, MINUTE, now - retention.raw)
        result.thinned += _thin(session, shape, MINUTE, HOUR, now - retention.minute)
        result.expired += _delete(session, shape.table, now - retention.hour)
        for resolution, kept_for in zip(
            SUMMARY_TIERS, (retention.minute, retention.hour), strict=True
        ):
            result.expired += _delete(
                session, shape.rollups, now - kept_for, shape.rollups.c.resolution == resolution
            )
    result.expired += _delete(session, cast(Table, ScrapeErrorRow.__table__), now - retention.raw)
    return result


def _delete(session: Session, table: Table, older_than: float, *where: Any) -> int:
    deleted = cast(
        CursorResult[Any], session.execute(delete(table).where(table.c.ts < older_than, *where))
    )
    return deleted.rowcount or 0


def summarize(session: Session, shape: Shape, now: float) -> int:
    """Write every whole bucket of each summary tier not written yet: 5 minutes from the
    samples, an hour from the 5-minute rows. Returns the rows written."""
    written = 0
    limit = now - SETTLE
    source: int | None = None  # None: the sample table
    for resolution in SUMMARY_TIERS:
        done, rows = _summarize_tier(session, shape, resolution, source, limit)
        written += rows
        if done is None:
            break
        limit, source = done, resolution
    return written


def _summarize_tier(
    session: Session, shape: Shape, resolution: int, source: int | None, limit: float
) -> tuple[float | None, int]:
    """Summarize `resolution` buckets ending by `limit`; returns how far the tier reaches."""
    table = shape.table if source is None else shape.rollups
    of_source = [] if source is None else [table.c.resolution == source]
    progress = session.get(RollupProgressRow, (shape.rollups.name, resolution))
    if progress is None:
        first = session.scalar(select(func.min(table.c.ts)).where(*of_source))
        if first is None:
            return None, 0
        start = math.floor(first / resolution) * resolution
    else:
        start = progress.until
    cutoff = math.floor(limit / resolution) * resolution
    if cutoff <= start:
        return start, 0
    rollups = shape.rollups
    session.execute(
        delete(rollups).where(rollups.c.resolution == resolution, rollups.c.ts >= start)
    )
    written = 0
    for key in session.scalars(select(shape.keys.c.id)):
        of_key = [table.c[shape.key] == key, *of_source]
        # The row before `start` too: it tells a reset and saturation at the boundary.
        before = session.scalar(select(func.max(table.c.ts)).where(*of_key, table.c.ts < start))
        rows = (
            session.execute(
                select(table)
                .where(
                    *of_key,
                    table.c.ts >= (start if before is None else before),
                    table.c.ts < cutoff,
                )
                .order_by(table.c.ts)
            )
            .mappings()
            .all()
        )
        summary = _summary_rows(shape, list(rows), start, resolution)
        if summary:
            session.execute(insert(rollups), summary)
            written += len(summary)
    if progress is None:
        session.add(RollupProgressRow(table_name=rollups.name, resolution=resolution, until=cutoff))
    else:
        progress.until = cutoff
    return cutoff, written


def _summary_rows(
    shape: Shape, rows: list[RowMapping], start: float, resolution: int
) -> list[dict[str, Any]]:
    """One series' summary rows from `start` on; the rows before it are only context."""
    saturated = _saturated_seconds(shape, rows)
    columns = set(shape.rollups.c.keys())
    summary: list[dict[str, Any]] = []
    previous = sum(1 for row in rows if row["ts"] < start) - 1
    for index, members in _kept(shape, rows, resolution):
        if rows[index]["ts"] < start:
            continue
        values = _rolled_up(shape, [rows[i] for i in members], resolution)
        row = {column: rows[index][column] for column in columns if column in rows[index]}
        row.update({c: values[c] for c in (*shape.means, *shape.peaks, "resolution")})
        if shape.saturation:
            row["saturated_seconds"] = sum(saturated[previous + 1 : index + 1])
            row["ends_saturated"] = _above(shape.saturation, rows[index])
        summary.append(row)
        previous = index
    return summary


def _saturated_seconds(shape: Shape, rows: list[RowMapping]) -> list[float]:
    """Per row, the seconds since the row before it spent above SATURATION (each sample holds
    until the next); summary rows carry their own."""
    if shape.saturation is None:
        return [0.0] * len(rows)
    seconds = []
    for index, row in enumerate(rows):
        if "saturated_seconds" in row:
            seconds.append(row["saturated_seconds"] or 0.0)
        elif index == 0:
            seconds.append(0.0)
        else:
            before = rows[index - 1]
            above = _above(shape.saturation, before)
            seconds.append(row["ts"] - before["ts"] if above else 0.0)
    return seconds


def _above(gauge: str, row: RowMapping) -> bool:
    """Whether a row's own sample was saturated (a summary row's gauge is a bucket mean)."""
    if row.get("ends_saturated") is not None:
        return bool(row["ends_saturated"])
    return (row[gauge] or 0.0) > SATURATION


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
    kept = _kept(shape, rows, resolution)
    updates = [_rolled_up(shape, [rows[i] for i in members], resolution) for _, members in kept]
    survivors = {index for index, _ in kept}
    removals = [
        {"k": row[shape.key], "t": row["ts"]}
        for index, row in enumerate(rows)
        if index not in survivors
    ]
    return updates, removals


def _kept(shape: Shape, rows: list[RowMapping], resolution: int) -> list[tuple[int, list[int]]]:
    """Which of one series' rows (in time order) survive thinning to `resolution`, each with
    the rows its gauges stand for: a bucket's last row stands for the whole bucket, and a row
    next to a counter reset stays, for itself, so increases across the reset stay exact."""
    around_resets = _around_resets(shape, rows)
    buckets: dict[int, list[int]] = {}
    for index, row in enumerate(rows):
        buckets.setdefault(int(row["ts"] // resolution), []).append(index)
    kept: list[tuple[int, list[int]]] = []
    for members in buckets.values():
        kept += [(index, [index]) for index in members[:-1] if index in around_resets]
        kept.append((members[-1], members))
    return kept


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
