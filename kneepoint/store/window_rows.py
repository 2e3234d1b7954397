"""A window's replica rows at fleet size, reduced by the database to the few each number
needs: what views.build_view and status.build_status read instead of every replica's rows
of the range (240 a replica at 1 h, 2,016 at 7 d through the 5-minute tier).

One SQL statement (the same text on SQLite and PostgreSQL) over exactly the rows
queries.replica_frame reads (queries._range_rows: the same summary-tier pieces) returns, per
target:

- its *edge rows*: the first and the last, the one before the last (stall detection's
  last pair, status._maybe_stuck), and the two rows around every counter reset (a counter of
  REPLICA_COUNTERS lower than at the row before). derived/window.py `frame_windows` on these
  rows gives the window of all of them: between two edge rows no counter falls, so each
  counter's increase telescopes (the sum of the steps between them is the difference of
  their values), and frame_windows' own edges (first, last, the pairs around resets: where
  it reads histograms and per-position counts) are the same rows. Whole numbers, as counters
  are, add up exactly in either order.
- every row where the telescoping does not hold: a target with a counter missing at some of
  its rows but not all (frame_windows steps over the gap from the last known value, and
  counts the rows that know it), as queries.counter_windows leaves those to its caller;
- views._peaks' numbers, computed in the same statement (`peaks`), and the two peaks
  causes.gather weighs (`loads`): the most requests running + waiting at one row, and the
  most sequences waiting for KV capacity, as its rows' series gave them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from sqlalchemy import ColumnElement, Float, case, func, literal, or_, select
from sqlalchemy.dialects.postgresql import ARRAY, array
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import Grouping

from kneepoint.samples import REPLICA_COUNTERS, SATURATION
from kneepoint.store import queries
from kneepoint.store.models import RAW, TargetRow

# Columns this statement adds to the rows; dropped before the rows are returned.
HELPERS = (
    "n_rows",
    "saturated_total",
    "spans_total",
    "kv_max",
    "waiting_max",
    "running_max",
    "running_known",
    "concurrency_max",
    "waiting_capacity_max",
)

Peaks = dict[str, float | None]


@dataclass
class Edges:
    """The window's edge rows (module docstring) as a replica_frame with LIGHT_COLUMNS
    would give them, ordered by target and time, and each target's views._peaks numbers."""

    frame: pd.DataFrame
    peaks: dict[int, Peaks] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)  # each target's rows in the range
    loads: dict[int, Peaks] = field(default_factory=dict)  # each target's `_loads`


def read(session: Session, start: float, end: float) -> Edges:
    """The edge rows and peaks of every target's replica rows in [start, end]."""
    keys = list(session.scalars(select(TargetRow.id)))
    coarsest = queries.coarsest_for(end - start)
    reach = queries.reach(session, queries.REPLICA_ROLLUPS) if coarsest else {}
    pieces = queries.plan(start, end, reach, coarsest)
    summary = any(resolution != RAW for _, _, resolution in pieces)
    # replica_frame's columns: the summary-only ones where a summary tier is read.
    columns = [*queries.LIGHT_COLUMNS, *(queries.SUMMARY_ONLY if summary else ())]
    empty = pd.DataFrame(columns=["target_id", "ts", *columns])
    if not keys:
        return Edges(empty)
    rows = queries._range_rows(
        queries.REPLICA_SAMPLES,
        queries.REPLICA_ROLLUPS,
        "target_id",
        keys,
        start,
        end,
        columns,
        pieces,
    )
    postgres = session.get_bind().dialect.name == "postgresql"
    frame = queries.read_bulk(session, _statement(rows, columns, summary, postgres))
    if frame.empty:
        return Edges(empty)
    firsts = frame.drop_duplicates("target_id")
    records = firsts.to_dict("records")
    peaks = {int(record["target_id"]): _peaks(record) for record in records}
    loads = {int(record["target_id"]): _loads(record) for record in records}
    counts = dict(zip(firsts.target_id.astype(int), firsts.n_rows.astype(int), strict=True))
    frame = frame.drop(columns=list(HELPERS)).reset_index(drop=True)
    return Edges(frame, peaks, counts, loads)


def _statement(rows: Any, columns: list[str], summary: bool, postgres: bool = False) -> Any:
    # Every window function over one window: a target's rows in time order, the frame the
    # whole of them (LAG and LEAD ignore the frame; the aggregates read the whole target).
    # Windows that differ only in their frame were one WindowAgg node each on PostgreSQL,
    # each passing every wide row through its own buffer: a fifth of the statement.
    whole: dict[str, Any] = {
        "partition_by": rows.c.target_id,
        "order_by": rows.c.ts,
        "rows": (None, None),
    }
    counters = [c for c in REPLICA_COUNTERS if c in columns]
    # views._peaks: a row is saturated when its KV occupancy is above SATURATION; a summary
    # row says so itself (`ends_saturated`) where it has it.
    above: ColumnElement[Any] = case((rows.c.kv_cache_usage > SATURATION, 1), else_=0)
    if summary:
        above = case((rows.c.ends_saturated.is_(None), above), (rows.c.ends_saturated, 1), else_=0)
    # Which counters a row knows, one bit each: a counter is known at some of a target's
    # rows but not all exactly where its rows' masks differ (two aggregates, not one count
    # per counter).
    mask = sum(
        (case((rows.c[c].is_(None), 0), else_=1 << bit) for bit, c in enumerate(counters)),
        start=literal(0),
    )
    total = func.count().over(**whole)
    # One pass of window functions, each once.
    marked = select(
        rows.c.target_id,
        rows.c.ts,
        *(rows.c[c] for c in columns),
        total.label("n_rows"),
        func.lag(rows.c.ts).over(**whole).label("prev_ts"),
        func.lead(rows.c.ts).over(**whole).label("next_ts"),
        func.lead(rows.c.ts, 2).over(**whole).label("after_next_ts"),
        case((_fell(rows, counters, whole, postgres), 1), else_=0).label("reset"),
        func.lag(above).over(**whole).label("prev_above"),
        # A counter known at some rows but not all: every row comes back.
        case((func.min(mask).over(**whole) != func.max(mask).over(**whole), 1), else_=0).label(
            "irregular"
        ),
        func.max(func.coalesce(rows.c.kv_cache_usage_peak, rows.c.kv_cache_usage))
        .over(**whole)
        .label("kv_max"),
        func.max(func.coalesce(rows.c.requests_waiting_peak, rows.c.requests_waiting))
        .over(**whole)
        .label("waiting_max"),
        func.max(func.coalesce(rows.c.requests_running_peak, rows.c.requests_running))
        .over(**whole)
        .label("running_max"),
        func.count(rows.c.requests_running).over(**whole).label("running_known"),
        # causes.gather's: a row's running + waiting (a row without running counts not,
        # as pandas skips its NaN sum), and the stored gauge as it is (no summary peak:
        # the series read the stored value).
        func.max(rows.c.requests_running + func.coalesce(rows.c.requests_waiting, 0.0))
        .over(**whole)
        .label("concurrency_max"),
        func.max(rows.c.requests_waiting_capacity).over(**whole).label("waiting_capacity_max"),
    ).subquery("marked")
    m = marked.c
    # The seconds saturated since the previous row: the summary row's own count, else the
    # span when the previous row ended saturated; none at a target's first row.
    span = m.ts - m.prev_ts
    saturated: ColumnElement[Any] = span * m.prev_above
    if summary:
        saturated = case(
            (m.prev_ts.is_(None), None), else_=func.coalesce(m.saturated_seconds, saturated)
        )
    again: dict[str, Any] = {"partition_by": m.target_id, "order_by": m.ts, "rows": (None, None)}
    summed = select(
        marked,
        # The row before a reset: the next row's flag.
        func.lead(m.reset).over(**again).label("before_reset"),
        # pandas' sum of none is 0: COALESCE. Summed in time order, as pandas sums them.
        func.coalesce(func.sum(saturated).over(**again), literal(0.0)).label("saturated_total"),
        func.coalesce(func.sum(span).over(**again), literal(0.0)).label("spans_total"),
    ).subquery("summed")
    s = summed.c
    edge = or_(
        s.prev_ts.is_(None),
        s.next_ts.is_(None),
        s.after_next_ts.is_(None),
        s.reset == 1,
        s.before_reset == 1,
        s.irregular == 1,
    )
    return (
        select(
            s.target_id,
            s.ts,
            *(s[c] for c in columns),
            *(s[c] for c in HELPERS),
        )
        .where(edge)
        .order_by(s.target_id, s.ts)
    )


def _fell(rows: Any, counters: list[str], window: dict[str, Any], postgres: bool) -> Any:
    """Whether a counter is lower than at the target's row before (NULL where none can be
    compared, as a missing value compares). On PostgreSQL the row before's counters are
    fetched once, as one array (the same LAG written in each comparison is evaluated once):
    a LAG per counter fetched the row before once each, 23 times a row, a third of the
    statement's time. SQLite has no arrays: a LAG per counter."""
    if not postgres:
        return or_(*(rows.c[c] < func.lag(rows.c[c]).over(**window) for c in counters))
    values = array([rows.c[c] for c in counters])
    # Parenthesized: PostgreSQL subscripts a window function's value only in parentheses.
    before = Grouping(func.lag(values, type_=ARRAY(Float)).over(**window))
    # PostgreSQL's arrays count from 1.
    return or_(*(rows.c[c] < before[number] for number, c in enumerate(counters, start=1)))


def _peaks(record: dict[str, Any]) -> Peaks:
    """views._peaks' numbers of one target from the statement's totals."""
    rows, spans = int(record["n_rows"]), float(record["spans_total"])

    def peak(value: Any) -> float:
        # pandas' max of nothing known is NaN, and _peaks gives it as it is.
        return float("nan") if _missing(value) else float(value)

    return {
        "time_saturated": float(record["saturated_total"]) / spans
        if rows >= 2 and spans > 0
        else None,
        "peak_kv_occupancy": peak(record["kv_max"]),
        "peak_waiting": peak(record["waiting_max"]),
        "peak_running": peak(record["running_max"]) if record["running_known"] else None,
    }


def _loads(record: dict[str, Any]) -> Peaks:
    """causes.gather's peaks of one target (None: no row knows it)."""
    return {
        "peak_concurrency": _known(record["concurrency_max"]),
        "peak_waiting_capacity": _known(record["waiting_capacity_max"]),
    }


def _known(value: Any) -> float | None:
    return None if _missing(value) else float(value)


def _missing(value: Any) -> bool:
    return value is None or value != value
