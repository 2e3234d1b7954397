"""Downsampling and retention: raw rows -> one per minute -> one per hour -> gone.

Counters are cumulative, so thinning them is lossless for increase() between kept rows as
long as both samples around each reset survive: a bucket keeps its last row plus those.
Gauges on a kept row become the bucket's mean, and `*_peak` columns its maximum, so peaks
and averages stay right at every resolution.

Beside the samples, `summarize` keeps the same thinning at 5 minutes and an hour in summary
tables (replica_rollups, gpu_rollups), written as soon as a bucket is whole: a week's range
then reads a few hundred rows per replica (queries.plan), and stays exact.

Retention also prunes the logs: settled notifications, alert history, ended silences, scrape
errors and the audit trail. The rollup job runs it all with `rollup_in_slices`, which commits
after each bounded slice, so SQLite's write lock is never held for the whole job.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from sqlalchemy import (
    ColumnElement,
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
from sqlalchemy.orm import Session, sessionmaker

from kneepoint.config import Retention
from kneepoint.counters import reset_points
from kneepoint.samples import REPLICA_COUNTERS, REPLICA_GAUGES, SATURATION
from kneepoint.store.models import (
    GPU_READINGS,
    HOUR,
    MINUTE,
    RAW,
    SUMMARY_TIERS,
    AlertHistoryRow,
    AuditRow,
    GpuRollupRow,
    GpuRow,
    GpuSampleRow,
    NotificationRow,
    ReplicaRollupRow,
    ReplicaSampleRow,
    RollupProgressRow,
    ScrapeErrorRow,
    SilenceRow,
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


# Bounded work per transaction (rollup_in_slices): one series and at most this much time.
SUMMARY_SLICE = {300: 6 * 3600.0, 3600: 2 * 86400.0}  # by summary tier
THIN_SLICE = {MINUTE: 3600.0, HOUR: 86400.0}  # by the resolution thinned to
EXPIRE_SLICE = 86400.0
DELETE_BATCH = 2000  # rows of a log (notifications, alert history, silences, audit) per delete

T = TypeVar("T")


class Slices(Protocol):
    """Runs `work(session, *args)`, one bounded piece, in a transaction; returns its result."""

    def __call__(self, work: Callable[..., T], *args: Any) -> T: ...


def _within(session: Session) -> Slices:
    """Every piece in the caller's one transaction."""

    def run(work: Callable[..., T], *args: Any) -> T:
        return work(session, *args)

    return run


def _committing(sessions: sessionmaker[Session]) -> Slices:
    """Every piece in its own transaction, committed before the next begins."""

    def run(work: Callable[..., T], *args: Any) -> T:
        with sessions.begin() as session:
            return work(session, *args)

    return run


def _ids(session: Session, keys: Table) -> list[int]:
    return list(session.scalars(select(keys.c.id)))


def _scalar(session: Session, query: Any) -> Any:
    return session.scalar(query)


@dataclass
class RollupResult:
    thinned: int = 0
    expired: int = 0
    summarized: int = 0
    pruned: int = 0  # rows of the logs: notifications, alerts, silences, scrape errors, audit


def rollup(session: Session, now: float, retention: Retention) -> RollupResult:
    """Apply the retention tiers as of `now` in the caller's transaction; safe to run at any
    interval, and idempotent."""
    return _rollup(_within(session), now, retention)


def rollup_in_slices(
    sessions: sessionmaker[Session], now: float, retention: Retention
) -> RollupResult:
    """What `rollup` does, committed in slices: each transaction covers one series over a
    bounded time (SUMMARY_SLICE, THIN_SLICE, EXPIRE_SLICE) or DELETE_BATCH rows of a log, so
    SQLite's write lock is held for one slice at a time and a concurrent writer (the scrape)
    gets it between slices. Interrupted anywhere, the next run finishes the work."""
    return _rollup(_committing(sessions), now, retention)


def _rollup(run: Slices, now: float, retention: Retention) -> RollupResult:
    result = RollupResult()
    for shape in (REPLICA_SHAPE, GPU_SHAPE):
        result.summarized += _summarize(run, shape, now)
        result.thinned += _thin(run, shape, RAW, MINUTE, now - retention.raw)
        result.thinned += _thin(run, shape, MINUTE, HOUR, now - retention.minute)
        result.expired += _expire(run, shape.table, shape.key, shape.keys, now - retention.hour)
        for resolution, kept_for in zip(
            SUMMARY_TIERS, (retention.minute, retention.hour), strict=True
        ):
            result.expired += _expire(
                run,
                shape.rollups,
                shape.key,
                shape.keys,
                now - kept_for,
                shape.rollups.c.resolution == resolution,
            )
    result.pruned += _expire(
        run, _table(ScrapeErrorRow), "target_id", _table(TargetRow), now - retention.scrape_errors
    )
    result.pruned += _prune(run, prunable(now, retention))
    return result


def _table(model: Any) -> Table:
    return cast(Table, model.__table__)


def prunable(now: float, retention: Retention) -> list[tuple[Table, ColumnElement[bool]]]:
    """The log rows retention removes as of `now`: settled notifications (a pending one is
    still to be delivered), alert state changes, silences ended long enough ago, and audit
    entries older than retention.audit."""
    notifications, history, silences, audit = (
        _table(NotificationRow),
        _table(AlertHistoryRow),
        _table(SilenceRow),
        _table(AuditRow),
    )
    return [
        (
            notifications,
            and_(
                notifications.c.state != "pending",
                notifications.c.created_at < now - retention.notifications,
            ),
        ),
        (history, history.c.ts < now - retention.alert_history),
        (silences, silences.c.ends_at < now - retention.silences),
        (audit, audit.c.ts < now - retention.audit),
    ]


def _prune(run: Slices, logs: list[tuple[Table, ColumnElement[bool]]]) -> int:
    """Delete each log's rows matching its condition, DELETE_BATCH rows per transaction."""
    deleted = 0
    for table, condition in logs:
        while True:
            batch = run(_delete_batch, table, condition)
            deleted += batch
            if batch < DELETE_BATCH:
                break
    return deleted


def _delete_batch(session: Session, table: Table, condition: ColumnElement[bool]) -> int:
    ids = list(
        session.scalars(
            select(table.c.id).where(condition).order_by(table.c.id).limit(DELETE_BATCH)
        )
    )
    if ids:
        session.execute(delete(table).where(table.c.id.in_(ids)))
    return len(ids)


def _expire(
    run: Slices, table: Table, key: str, keys: Table, older_than: float, *where: Any
) -> int:
    """Delete `table`'s rows older than `older_than`, one series and EXPIRE_SLICE at a time."""
    deleted = 0
    for series in run(_ids, keys):
        of_series = [table.c[key] == series, *where]
        oldest = select(func.min(table.c.ts)).where(*of_series, table.c.ts < older_than)
        while (low := run(_scalar, oldest)) is not None:
            high = min(low + EXPIRE_SLICE, older_than)
            deleted += run(_delete, table, high, *of_series)
    return deleted


def _delete(session: Session, table: Table, older_than: float, *where: Any) -> int:
    deleted = cast(
        CursorResult[Any], session.execute(delete(table).where(table.c.ts < older_than, *where))
    )
    return deleted.rowcount or 0


def summarize(session: Session, shape: Shape, now: float) -> int:
    """Write every whole bucket of each summary tier not written yet: 5 minutes from the
    samples, an hour from the 5-minute rows. Returns the rows written."""
    return _summarize(_within(session), shape, now)


def _summarize(run: Slices, shape: Shape, now: float) -> int:
    written = 0
    limit = now - SETTLE
    source: int | None = None  # None: the sample table
    for resolution in SUMMARY_TIERS:
        done, rows = _summarize_tier(run, shape, resolution, source, limit)
        written += rows
        if done is None:
            break
        limit, source = done, resolution
    return written


def _summarize_tier(
    run: Slices, shape: Shape, resolution: int, source: int | None, limit: float
) -> tuple[float | None, int]:
    """Summarize `resolution` buckets ending by `limit`, one series and SUMMARY_SLICE of
    buckets per slice, moving the tier's progress on after each slice of buckets; returns
    how far the tier reaches."""
    table = shape.table if source is None else shape.rollups
    of_source = [] if source is None else [table.c.resolution == source]
    start = run(_tier_start, shape, table, of_source, resolution)
    if start is None:
        return None, 0
    cutoff = math.floor(limit / resolution) * resolution
    if cutoff <= start:
        return start, 0
    keys = run(_ids, shape.keys)
    written = 0
    low = start
    while low < cutoff:
        high = min(low + SUMMARY_SLICE[resolution], cutoff)
        for key in keys:
            written += run(_summarize_series, shape, table, of_source, resolution, key, low, high)
        run(_set_progress, shape, resolution, high)
        low = high
    return cutoff, written


def _tier_start(
    session: Session, shape: Shape, table: Table, of_source: list[Any], resolution: int
) -> float | None:
    """Where the tier's unwritten buckets begin (None: nothing to summarize yet)."""
    progress = session.get(RollupProgressRow, (shape.rollups.name, resolution))
    if progress is not None:
        return progress.until
    first = session.scalar(select(func.min(table.c.ts)).where(*of_source))
    return None if first is None else math.floor(first / resolution) * resolution


def _summarize_series(
    session: Session,
    shape: Shape,
    table: Table,
    of_source: list[Any],
    resolution: int,
    key: int,
    low: float,
    high: float,
) -> int:
    """One series' summary rows of the buckets in [low, high); its rows from `low` on are
    rewritten (a slice interrupted before the progress moved is redone whole)."""
    rollups = shape.rollups
    session.execute(
        delete(rollups).where(
            rollups.c[shape.key] == key, rollups.c.resolution == resolution, rollups.c.ts >= low
        )
    )
    of_key = [table.c[shape.key] == key, *of_source]
    # The row before `low` too: it tells a reset and saturation at the boundary.
    before = session.scalar(select(func.max(table.c.ts)).where(*of_key, table.c.ts < low))
    rows = (
        session.execute(
            select(table)
            .where(*of_key, table.c.ts >= (low if before is None else before), table.c.ts < high)
            .order_by(table.c.ts)
        )
        .mappings()
        .all()
    )
    summary = _summary_rows(shape, list(rows), low, resolution)
    if summary:
        session.execute(insert(rollups), summary)
    return len(summary)


def _set_progress(session: Session, shape: Shape, resolution: int, until: float) -> None:
    progress = session.get(RollupProgressRow, (shape.rollups.name, resolution))
    if progress is None:
        session.add(
            RollupProgressRow(table_name=shape.rollups.name, resolution=resolution, until=until)
        )
    else:
        progress.until = until


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


def _thin(run: Slices, shape: Shape, source: int, target: int, older_than: float) -> int:
    """Thin each series' `source` rows older than `older_than` to `target`, THIN_SLICE at a
    time; returns the rows removed."""
    # Only whole buckets: a bucket still filling would lose the rows that arrive later.
    cutoff = math.floor(older_than / target) * target
    step = THIN_SLICE[target]
    removed = 0
    for key in run(_ids, shape.keys):
        first = run(_first, shape, key, source, -math.inf, cutoff)
        while first is not None:
            low = math.floor(first / step) * step  # a bucket boundary: step is whole buckets
            high = min(low + step, cutoff)
            removed += run(_thin_slice, shape, key, source, target, low, high)
            first = run(_first, shape, key, source, high, cutoff)
    return removed


def _first(
    session: Session, shape: Shape, key: int, resolution: int, low: float, high: float
) -> float | None:
    """The time of a series' first row of `resolution` in [low, high)."""
    table = shape.table
    return session.scalar(
        select(func.min(table.c.ts)).where(
            table.c[shape.key] == key,
            table.c.resolution == resolution,
            table.c.ts >= low,
            table.c.ts < high,
        )
    )


def _thin_slice(
    session: Session, shape: Shape, key: int, source: int, target: int, low: float, high: float
) -> int:
    """Thin one series' `source` rows in [low, high) (whole `target` buckets) to `target`."""
    table = shape.table
    of_key = table.c[shape.key] == key
    rows = list(
        session.execute(
            select(table)
            .where(of_key, table.c.resolution == source, table.c.ts >= low, table.c.ts < high)
            .order_by(table.c.ts)
        )
        .mappings()
        .all()
    )
    # The row before the slice, whatever its resolution, only as context: a counter reset
    # between it and the slice's first row keeps that first row.
    context = (
        session.execute(select(table).where(of_key, table.c.ts < low).order_by(table.c.ts.desc()))
        .mappings()
        .first()
    )
    kept, removals = _thin_series(shape, [context, *rows] if context else rows, target)
    updates = [row for row in kept if row["t"] >= low]
    removals = [row for row in removals if row["t"] >= low]
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
