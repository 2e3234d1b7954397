"""Stall detection's rows, pre-filtered by the database: of the rows a window reads
(queries.replica_frame's, through the same summary tiers), only those in a candidate stuck
pair, so an availability SLO's round reads a few rows per replica instead of every sample of
its windows (alerts/evaluate.py `_stalled_in_store`).

A pair of consecutive rows of a target (by time, in the frame replica_frame gives) is a
candidate when kneepoint/derived/stall.py `stuck` would call it stuck without its gap test:
work present at both (running + waiting > 0, unknown queues count as none) and the engine
awake at both (sleep_level unknown or 0), at least one
progress counter known at both, and none known at both that differs. The gap test needs the
replica's median step over the window (evaluate's max_gap), so it is left to `stuck` itself,
which reads the rows this returns; `steps` gives that median for the few targets where it
decides. Every stuck pair is a candidate, so every run of stuck pairs comes back whole, with
each row's predecessor's time (`prev_ts`) to tell rows that were consecutive in the window
from rows that were not."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
    Subquery,
    and_,
    case,
    exists,
    func,
    literal,
    or_,
    select,
    union_all,
)
from sqlalchemy.orm import Session

from kneepoint.derived.stall import PROGRESS
from kneepoint.store import queries, slo_sums
from kneepoint.store.models import RAW

QUEUES = ("requests_running", "requests_waiting")
COLUMNS = (*QUEUES, *PROGRESS, "sleep_level")  # evaluate.STALL_COLUMNS: stall.Point's order


def frame_rows(session: Session, ids: Sequence[int], start: float, end: float) -> Subquery:
    """The rows queries.replica_frame(session, start, end, ids) reads, as a subquery
    (target_id, ts, COLUMNS…): the same pieces of the same tiers (queries.plan), and where
    a target's first row is a summary row, its samples from `start` up to it in its place
    (queries._from_first_sample; the sample wins where both have a row at one time)."""
    samples, rollups = queries.REPLICA_SAMPLES, queries.REPLICA_ROLLUPS
    coarsest = queries.coarsest_for(end - start)
    pieces = queries.plan(start, end, queries.reach(session, rollups) if coarsest else {}, coarsest)
    selects: list[Select[Any]] = []
    for number, (low, high, resolution) in enumerate(pieces):
        table = samples if resolution == RAW else rollups
        closed = number == len(pieces) - 1
        where: list[ColumnElement[bool]] = [
            slo_sums.among(session, table.c.target_id, ids),
            table.c.ts >= low,
            table.c.ts <= high if closed else table.c.ts < high,
        ]
        if resolution != RAW:
            where.append(table.c.resolution == resolution)
        selects.append(
            select(
                table.c.target_id,
                table.c.ts,
                *(table.c[c] for c in COLUMNS),
                literal(int(resolution != RAW), Integer).label("summary"),
            ).where(*where)
        )
    rows = (union_all(*selects) if len(selects) > 1 else selects[0]).subquery("pieces")
    if len(pieces) == 1 or _headed(session, ids, pieces[0]):
        return rows
    # queries._from_first_sample, in SQL: a target whose first row is a summary row gets
    # its samples from `start` up to that row, and the sample replaces a summary row at the
    # same time (only that first row can meet one).
    first = (
        select(rows.c.target_id, func.min(rows.c.ts).label("ts"))
        .group_by(rows.c.target_id)
        .subquery("first")
    )
    # The row's own columns, not the aggregate's: PostgreSQL then bounds the samples' index
    # scan below at both ends (with min(ts) it filtered every later sample of the target,
    # 1.3 million rows at 200 replicas × 3 days).
    late = (
        select(rows.c.target_id, rows.c.ts)
        .select_from(first)
        .join(rows, and_(rows.c.target_id == first.c.target_id, rows.c.ts == first.c.ts))
        .where(rows.c.summary == 1)
        .subquery("late")
    )
    head = select(samples.c.target_id, samples.c.ts, *(samples.c[c] for c in COLUMNS)).join(
        late,
        and_(
            samples.c.target_id == late.c.target_id,
            samples.c.ts >= start,
            samples.c.ts <= late.c.ts,
        ),
    )
    replaced = exists().where(
        late.c.target_id == rows.c.target_id,
        late.c.ts == rows.c.ts,
        exists().where(samples.c.target_id == rows.c.target_id, samples.c.ts == rows.c.ts),
    )
    kept = select(rows.c.target_id, rows.c.ts, *(rows.c[c] for c in COLUMNS)).where(
        ~(and_(rows.c.summary == 1, replaced))
    )
    return union_all(head, kept).subquery("frame")


def _headed(session: Session, ids: Sequence[int], piece: queries.Piece) -> bool:
    """Does every target of `ids` have a sample in `piece`, the first of a window read
    through the tiers? Then no target's first row is a summary row and the window's rows
    are its pieces' as they are (frame_rows' replacing a first summary row by the samples
    up to it, a group over every row read and two joins, cost 0.3 of 0.7 s over 24 hours at
    200 replicas, replacing nothing). One index range per target."""
    low, high, resolution = piece
    if resolution != RAW:
        return False
    samples = queries.REPLICA_SAMPLES
    found = session.execute(
        select(func.count(func.distinct(samples.c.target_id))).where(
            slo_sums.among(session, samples.c.target_id, ids),
            samples.c.ts >= low,
            samples.c.ts < high,
        )
    ).scalar()
    return found == len(set(ids))


def _busy(running: Any, waiting: Any, sleep_level: Any) -> ColumnElement[bool]:
    """Work present and the engine awake (stall.busy: an asleep engine is never busy)."""
    return and_(
        func.coalesce(running, 0.0) + func.coalesce(waiting, 0.0) > 0,
        func.coalesce(sleep_level, 0.0) <= 0,
    )


def candidates(session: Session, ids: Sequence[int], start: float, end: float) -> pd.DataFrame:
    """The rows in a candidate stuck pair (module docstring), ordered by target and time:
    target_id, ts, COLUMNS, prev_ts (the time of the target's previous row in the window;
    NaN at its first) and stuck (1 where the row and the previous one are a candidate)."""
    if not ids:
        return pd.DataFrame(columns=["target_id", "ts", *COLUMNS, "prev_ts", "stuck"])
    rows = frame_rows(session, ids, start, end)
    lagged = select(
        rows.c.target_id,
        rows.c.ts,
        *(rows.c[c] for c in COLUMNS),
        func.lag(rows.c.ts)
        .over(partition_by=rows.c.target_id, order_by=rows.c.ts)
        .label("prev_ts"),
        *(
            func.lag(rows.c[c])
            .over(partition_by=rows.c.target_id, order_by=rows.c.ts)
            .label(f"prev_{c}")
            for c in COLUMNS
        ),
    ).subquery("lagged")
    now, before = lagged.c, {c: lagged.c[f"prev_{c}"] for c in COLUMNS}
    both = [and_(now[c].is_not(None), before[c].is_not(None)) for c in PROGRESS]
    same = [or_(now[c].is_(None), before[c].is_(None), now[c] == before[c]) for c in PROGRESS]
    stuck = and_(
        _busy(now.requests_running, now.requests_waiting, now.sleep_level),
        _busy(before["requests_running"], before["requests_waiting"], before["sleep_level"]),
        or_(*both),
        *same,
    )
    flag = case((stuck, 1), else_=0).label("stuck")
    marked = select(
        *(lagged.c[c] for c in ("target_id", "ts", *COLUMNS, "prev_ts")), flag
    ).subquery("marked")
    edged = select(
        marked,
        func.lead(marked.c.stuck)
        .over(partition_by=marked.c.target_id, order_by=marked.c.ts)
        .label("next_stuck"),
    ).subquery("edged")
    query = (
        select(*(edged.c[c] for c in ("target_id", "ts", *COLUMNS, "prev_ts", "stuck")))
        .where(or_(edged.c.stuck == 1, edged.c.next_stuck == 1))
        .order_by(edged.c.target_id, edged.c.ts)
    )
    return queries.read_bulk(session, query)


def sliced(rows: pd.DataFrame, start: float) -> pd.DataFrame:
    """`candidates` over [start, end] from those over a longer window of raw samples that
    ends at the same time (the same rows from `start` on): a target's first row at or after
    `start` has no previous row there, so it is in no pair, and the rows left in no pair
    are dropped. Every stuck pair of the shorter window is one of the longer, and a row's
    next one in `rows` is its next sample wherever that pair is stuck, so the rows are
    those `candidates` gives for the shorter window."""
    out = rows[rows.ts >= start].copy()
    first = out.prev_ts < start
    out.loc[first, "prev_ts"] = float("nan")
    out.loc[first, "stuck"] = 0
    following = out.groupby("target_id", sort=False).stuck.shift(-1, fill_value=0)
    return out[(out.stuck == 1) | (following == 1)].reset_index(drop=True)


def steps(session: Session, ids: Sequence[int], start: float, end: float) -> dict[int, float]:
    """Each target's median time between consecutive rows of the window (pandas' median of
    `ts.diff()`: the mean of the two middle ones for an even count), 0 for one row."""
    if not ids:
        return {}
    rows = frame_rows(session, ids, start, end)
    gaps = select(
        rows.c.target_id,
        (
            rows.c.ts - func.lag(rows.c.ts).over(partition_by=rows.c.target_id, order_by=rows.c.ts)
        ).label("gap"),
    ).subquery("gaps")
    ranked = (
        select(
            gaps.c.target_id,
            gaps.c.gap,
            func.row_number().over(partition_by=gaps.c.target_id, order_by=gaps.c.gap).label("i"),
            func.count().over(partition_by=gaps.c.target_id).label("n"),
        )
        .where(gaps.c.gap.is_not(None))
        .subquery("ranked")
    )
    # The middle one (odd n: 2i = n + 1) or two (even n: 2i = n and 2i = n + 2).
    middle = 2 * ranked.c.i
    query = (
        select(ranked.c.target_id, func.avg(ranked.c.gap).label("step"))
        .where(or_(middle == ranked.c.n, middle == ranked.c.n + 1, middle == ranked.c.n + 2))
        .group_by(ranked.c.target_id)
    )
    found = {int(t): float(s) for t, s in session.execute(query).all()}
    return {int(t): found.get(int(t), 0.0) for t in ids}
