"""The one read path over the store: every page, command and alert reads through here.

The logs a page lists (scrape errors, alert history, deliveries) are read newest first and
at most PAGE_ROWS rows each, however long the range: a page never reads every row ever kept.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any, cast

import pandas as pd
from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Executable,
    Float,
    Integer,
    Select,
    String,
    Table,
    Text,
    and_,
    case,
    exists,
    func,
    literal,
    null,
    or_,
    select,
    union_all,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import Session

from kneepoint.samples import Histogram
from kneepoint.store.codec import decode_bounds, decode_histogram
from kneepoint.store.models import (
    RAW,
    SUMMARY_TIERS,
    AlertHistoryRow,
    AlertRow,
    GpuRollupRow,
    GpuRow,
    GpuSampleRow,
    HistogramLayoutRow,
    JobHealthRow,
    NotificationRow,
    ReplicaRollupRow,
    ReplicaSampleRow,
    RollupProgressRow,
    ScrapeErrorRow,
    TargetRow,
)

PAGE_ROWS = 1000  # the most rows of one log a page reads


def read_frame(session: Session, query: Executable) -> pd.DataFrame:
    """A query's rows as a DataFrame, fetched from the database driver's cursor: pandas'
    read_sql goes through SQLAlchemy's row objects, which cost 4× the fetch for a week's
    rows (0.46 s against 0.11 s for 100,000)."""
    result = session.connection().execute(query)
    return pd.DataFrame.from_records(
        result.cursor.fetchall(), columns=list(result.keys()), coerce_float=True
    )


def read_bulk(session: Session, query: Select[Any]) -> pd.DataFrame:
    """A large query's rows as a DataFrame; on PostgreSQL through COPY … TO STDOUT in CSV,
    parsed by pandas' C reader: 5× faster than building Python objects row by row
    (241,000 rows of 38 columns: 1.9 s against 9.6 s). Floats come back exact (PostgreSQL
    writes the shortest text that reads back to the same double); columns keep the types
    read_frame gives them: floats, and text with None where NULL."""
    connection = session.connection()
    if connection.dialect.name != "postgresql":
        return read_frame(session, query)
    compiled = query.compile(
        dialect=connection.dialect, compile_kwargs={"render_postcompile": True}
    )
    types = {c.name: c.type for c in query.selected_columns}
    body = io.BytesIO()
    cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        with cursor.copy(
            f"COPY ({compiled}) TO STDOUT (FORMAT csv, HEADER)", compiled.params
        ) as copy:
            for chunk in copy:
                body.write(chunk)
    finally:
        cursor.close()
    body.seek(0)
    texts = [name for name, kind in types.items() if isinstance(kind, (String, Text))]
    floats = [name for name, kind in types.items() if isinstance(kind, Float)]
    frame = pd.read_csv(
        body,
        dtype={**dict.fromkeys(texts, object), **dict.fromkeys(floats, "float64")},
        keep_default_na=False,
        na_values={name: [""] for name in types},
        true_values=["t"],
        false_values=["f"],
    )
    for name in texts:
        frame[name] = frame[name].astype(object).where(frame[name].notna(), None)
    return frame


def targets(session: Session) -> dict[str, TargetRow]:
    return {row.name: row for row in session.scalars(select(TargetRow).order_by(TargetRow.id))}


REPLICA_SAMPLES = cast(Table, ReplicaSampleRow.__table__)
REPLICA_ROLLUPS = cast(Table, ReplicaRollupRow.__table__)
GPU_SAMPLES = cast(Table, GpuSampleRow.__table__)
GPU_ROLLUPS = cast(Table, GpuRollupRow.__table__)
# What summary rows carry beyond a sample's columns (models.ReplicaRollupRow).
SUMMARY_ONLY = ("saturated_seconds", "ends_saturated")
Piece = tuple[float, float, int]  # [start, end) and the resolution read there (RAW: samples)


def latest_sleep_levels(session: Session) -> dict[int, float | None]:
    """Each replica's sleep level (samples.REPLICA_GAUGES) in its latest sample, by target
    id: the sample stored at its last successful scrape, one primary-key lookup each."""
    rows = session.execute(
        select(ReplicaSampleRow.target_id, ReplicaSampleRow.sleep_level).join(
            TargetRow,
            and_(
                TargetRow.id == ReplicaSampleRow.target_id,
                TargetRow.last_success_at == ReplicaSampleRow.ts,
            ),
        )
    )
    return {int(target_id): level for target_id, level in rows}


def coarsest_for(span: float) -> int:
    """The coarsest rows a range of `span` seconds may read: still finer than the points its
    charts are drawn at (views._bucket), so a chart never shows gaps."""
    if span <= 3600:
        return RAW
    return SUMMARY_TIERS[0] if span <= 2 * 86400 else SUMMARY_TIERS[-1]


def plan(start: float, end: float, reach: dict[int, float], coarsest: int) -> list[Piece]:
    """Cover [start, end] with the fewest rows: the whole buckets of the coarsest summary tier
    allowed that lie inside the range and within what the tier `reach`es, and finer tiers
    for the partial buckets at both edges. Counters stay exact, as every row is a sample."""
    tiers = sorted((r for r in reach if r <= coarsest), reverse=True)
    return _plan(start, end, [(r, reach[r]) for r in tiers], last=True)


def _plan(start: float, end: float, tiers: list[tuple[int, float]], last: bool) -> list[Piece]:
    for index, (resolution, until) in enumerate(tiers):
        low = math.ceil(start / resolution) * resolution
        if low < start:  # start / resolution underflowed to 0 (a denormal start)
            low += resolution
        high = math.floor(min(end, until) / resolution) * resolution
        if high > low:
            finer = tiers[index + 1 :]
            return [
                *_plan(start, low, finer, last=False),
                (low, high, resolution),
                *_plan(high, end, finer, last=last),
            ]
    # The range's own end is inclusive: a sample at exactly `end` belongs to it.
    return [(start, end, RAW)] if end > start or (last and end == start) else []


def reach(session: Session, rollups: Table) -> dict[int, float]:
    """How far each summary tier of `rollups` is written."""
    rows = session.scalars(
        select(RollupProgressRow).where(RollupProgressRow.table_name == rollups.name)
    )
    return {row.resolution: row.until for row in rows}


def _tiered(
    session: Session,
    samples: Table,
    rollups: Table,
    key: str,
    keys: list[int],
    start: float,
    end: float,
    columns: Sequence[str] | None,
    coarsest: int | None,
) -> pd.DataFrame:
    """Rows of `samples` for `keys` over [start, end], ordered by key and time, read through
    the summary tiers as `plan` says."""
    if coarsest is None:
        coarsest = coarsest_for(end - start)
    pieces = plan(start, end, reach(session, rollups) if coarsest else {}, coarsest)
    frames = []
    for number, (low, high, resolution) in enumerate(pieces):
        table = samples if resolution == RAW else rollups
        closed = number == len(pieces) - 1
        where = _piece_where(table, key, keys, low, high, closed, resolution)
        # The keys lead the (key, ts) primary key, so each key's rows are one range search;
        # by time alone the whole table would be scanned. Ordered: PostgreSQL returns a
        # bitmap scan's rows in the table's order (by time, as they were written), and rows
        # out of order would read as counter resets.
        query = (
            select(*_selected(table, key, columns)).where(*where).order_by(table.c[key], table.c.ts)
        )
        frames.append(read_bulk(session, query).assign(summary=resolution != RAW))
    filled = [f for f in frames if len(f)] or frames[:1]
    frame = pd.concat(filled, ignore_index=True) if len(filled) > 1 else filled[0]
    if len(frames) > 1:
        frame = _from_first_sample(session, samples, key, columns, start, frame)
    return frame.drop(columns="summary")


def _piece_where(
    table: Table,
    key: str,
    keys: Sequence[int],
    low: float,
    high: float,
    closed: bool,
    resolution: int,
) -> list[ColumnElement[bool]]:
    """The rows of one piece of a `plan`: its keys in [low, high) ([low, high] for the last
    piece), of the piece's resolution where it reads a summary table."""
    where: list[ColumnElement[bool]] = [
        table.c[key].in_(keys),
        table.c.ts >= low,
        table.c.ts <= high if closed else table.c.ts < high,
    ]
    if resolution != RAW:
        where.append(table.c.resolution == resolution)
    return where


def _selected(table: Table, key: str, columns: Sequence[str] | None) -> tuple[Any, ...]:
    if not columns:
        return (table,)
    wanted = [*columns, *(c for c in SUMMARY_ONLY if c in table.c)]
    return (table.c[key], table.c.ts, *(table.c[c] for c in wanted))


def _from_first_sample(
    session: Session,
    samples: Table,
    key: str,
    columns: Sequence[str] | None,
    start: float,
    frame: pd.DataFrame,
) -> pd.DataFrame:
    """Order the pieces' rows by key and time, and start each series at its first sample:
    a summary row stands for its whole bucket, so where a series' first row is one (no
    finer row came before it), the samples from `start` up to it are read in its place."""
    frame = frame.sort_values([key, "ts"], kind="stable", ignore_index=True)
    firsts = frame.groupby(key, sort=False).head(1)
    late = firsts[firsts.summary.astype(bool)]
    if late.empty:
        return frame
    query = select(*_selected(samples, key, columns)).where(
        or_(
            *(
                and_(samples.c[key] == k, samples.c.ts >= start, samples.c.ts <= ts)
                for k, ts in zip(late[key].astype(int), late.ts.astype(float), strict=True)
            )
        )
    )
    head = read_frame(session, query).assign(summary=False)
    frame = pd.concat([head, frame], ignore_index=True)
    frame = frame.sort_values([key, "ts", "summary"], kind="stable", ignore_index=True)
    return frame.drop_duplicates([key, "ts"], keep="first", ignore_index=True)


def replica_frame(
    session: Session,
    start: float,
    end: float,
    target_ids: list[int] | None = None,
    columns: Sequence[str] | None = None,
    coarsest: int | None = None,
) -> pd.DataFrame:
    """Replica rows with start <= ts <= end, ordered by target and time; only `columns`
    (besides target and time) when given: charts need no histograms, and reading them is
    most of the cost of a long range. Long ranges read summary rows (see `plan`), finer than
    `coarsest` seconds when given; those bring `saturated_seconds`."""
    if target_ids is None:
        target_ids = list(session.scalars(select(TargetRow.id)))
    return _tiered(
        session,
        REPLICA_SAMPLES,
        REPLICA_ROLLUPS,
        "target_id",
        target_ids,
        start,
        end,
        columns,
        coarsest,
    )


# Every replica column but the encoded ones: what windowed numbers and charts read in bulk.
LIGHT_COLUMNS = tuple(
    c.name
    for c in REPLICA_SAMPLES.columns
    if c.name not in ("target_id", "ts", "accepted_per_position") and not c.name.startswith("hist_")
)


def replica_rows_at(
    session: Session, keys: pd.DataFrame, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """Whole replica rows for the (target_id, ts) pairs in `keys` (only `columns` besides
    target and time, when given): from the samples, or from the summary tiers where the
    samples were thinned since."""
    samples = REPLICA_SAMPLES
    if keys.empty:
        names = ["target_id", "ts", *columns] if columns else [c.name for c in samples.columns]
        return pd.DataFrame(columns=names)
    pairs = {(int(t), float(ts)) for t, ts in zip(keys.target_id, keys.ts, strict=True)}
    found = _rows_at(session, samples, pairs, columns)
    missing = pairs - set(zip(found.target_id.astype(int), found.ts.astype(float), strict=True))
    if missing:
        summary = _rows_at(session, REPLICA_ROLLUPS, missing, columns)
        summary = summary.drop_duplicates(["target_id", "ts"])[list(found.columns)]
        found = pd.concat([found, summary], ignore_index=True) if len(found) else summary
    return found.sort_values(["target_id", "ts"], ignore_index=True)


def _rows_at(
    session: Session,
    table: Table,
    pairs: set[tuple[int, float]],
    columns: Sequence[str] | None = None,
) -> pd.DataFrame:
    wanted = (
        (table,) if not columns else (table.c.target_id, table.c.ts, *(table.c[c] for c in columns))
    )
    if session.get_bind().dialect.name == "postgresql":
        # The pairs as two arrays joined on the primary key: one lookup per pair, and one
        # statement of constant size (1,000 OR terms took seconds to build and plan).
        ordered = sorted(pairs)
        keys = (
            func.unnest(
                literal([t for t, _ in ordered], ARRAY(Integer)),
                literal([ts for _, ts in ordered], ARRAY(Float)),
            )
            .table_valued("t", "ts")
            .render_derived(with_types=False)
        )
        return read_frame(
            session,
            select(*wanted).join(
                keys, and_(table.c.target_id == keys.c.t, table.c.ts == keys.c.ts)
            ),
        )
    # One (target_id, ts IN …) term per target: each is a few lookups of the primary key.
    # (A tuple IN over a time range scanned every row of the range: 0.3 s for a week.)
    times: dict[int, list[float]] = {}
    for target_id, ts in sorted(pairs):
        times.setdefault(target_id, []).append(ts)
    query = select(*wanted).where(
        or_(*(and_(table.c.target_id == t, table.c.ts.in_(ts)) for t, ts in times.items()))
    )
    return read_frame(session, query)


def gpu_frame(
    session: Session, start: float, end: float, coarsest: int | None = None
) -> pd.DataFrame:
    """GPU readings with their identity (target, host, index, model, pod, namespace), read
    through the summary tiers like replica_frame."""
    identity = read_frame(
        session,
        select(
            GpuRow.id.label("gpu_id"),
            GpuRow.target_id,
            GpuRow.host,
            GpuRow.gpu_index,
            GpuRow.model,
            GpuRow.pod,
            GpuRow.namespace,
            GpuRow.uuid,
        ),
    )
    readings = _tiered(
        session,
        GPU_SAMPLES,
        GPU_ROLLUPS,
        "gpu_id",
        [int(i) for i in identity.gpu_id],
        start,
        end,
        None,
        coarsest,
    )
    frame = identity.merge(readings, on="gpu_id", how="inner", sort=False)
    return frame.sort_values(["gpu_id", "ts"], kind="stable", ignore_index=True)


def scrape_errors(
    session: Session, start: float, end: float, limit: int = PAGE_ROWS
) -> pd.DataFrame:
    """The newest `limit` scrape errors in [start, end], oldest first."""
    query = (
        select(TargetRow.name.label("target"), ScrapeErrorRow.ts, ScrapeErrorRow.error)
        .join(TargetRow, TargetRow.id == ScrapeErrorRow.target_id)
        .where(ScrapeErrorRow.ts >= start, ScrapeErrorRow.ts <= end)
        .order_by(ScrapeErrorRow.ts.desc())
        .limit(limit)
    )
    return read_frame(session, query).iloc[::-1].reset_index(drop=True)


def job_health(session: Session) -> list[JobHealthRow]:
    return list(session.scalars(select(JobHealthRow).order_by(JobHealthRow.job_id)))


def histogram_layouts(session: Session) -> dict[int, tuple[float, ...]]:
    return {
        row.id: decode_bounds(row.bounds) for row in session.scalars(select(HistogramLayoutRow))
    }


def histograms(encoded: pd.Series, layouts: dict[int, tuple[float, ...]]) -> list[Histogram | None]:
    """Decode a column of encoded histograms (None where a row has none)."""
    return [
        None if text is None or pd.isna(text) else decode_histogram(text, layouts)
        for text in encoded
    ]


def alert_states(session: Session) -> pd.DataFrame:
    """Pending and firing alerts, firing first."""
    table = AlertRow.__table__
    query = (
        select(table)
        .where(table.c.state.in_(["pending", "firing"]))
        .order_by(table.c.state, table.c.rule, table.c.replica)
    )
    return read_frame(session, query)


def alert_history(
    session: Session, start: float, end: float, limit: int = PAGE_ROWS
) -> pd.DataFrame:
    """The alert state changes in [start, end], newest first, at most `limit`."""
    table = AlertHistoryRow.__table__
    query = (
        select(table)
        .where(table.c.ts >= start, table.c.ts <= end)
        .order_by(table.c.ts.desc(), table.c.id.desc())
        .limit(limit)
    )
    return read_frame(session, query)


def notifications(
    session: Session, start: float, end: float, limit: int = PAGE_ROWS
) -> pd.DataFrame:
    """The outbox's rows created in [start, end], newest first, at most `limit` (the
    delivery log)."""
    table = NotificationRow.__table__
    query = (
        select(
            table.c.created_at,
            table.c.channel,
            table.c.fingerprint,
            table.c.state,
            table.c.attempts,
            table.c.sent_at,
            table.c.next_attempt_at,
            table.c.last_error,
        )
        .where(table.c.created_at >= start, table.c.created_at <= end)
        .order_by(table.c.id.desc())
        .limit(limit)
    )
    return read_frame(session, query)


# --- aggregates computed by the database ---------------------------------------------------
# A week of a fleet is millions of rows; the pages and evaluation need a few numbers per
# replica or per interval from them. These return those numbers, computed in SQL (window
# functions: SQLite ≥ 3.25, PostgreSQL), from exactly the rows replica_frame would read.


def _range_rows(
    samples: Table,
    rollups: Table,
    key: str,
    keys: list[int],
    start: float,
    end: float,
    columns: Sequence[str],
    pieces: list[Piece],
) -> Any:
    """The rows `_tiered` reads for these `pieces` as one selectable (key, ts, columns),
    unordered: each piece's rows, and where a key's first row is a summary row, the
    samples from `start` up to it in its place (as `_from_first_sample`: a sample wins over
    a summary row of the same time)."""

    def column(table: Table, name: str) -> Any:
        # A summary-only column (SUMMARY_ONLY) is NULL in the samples' rows, as in the
        # frame _tiered concatenates; typed, so PostgreSQL's UNION matches its type.
        if name in table.c:
            return table.c[name].label(name)
        return sql_cast(null(), rollups.c[name].type).label(name)

    def piece(number: int, low: float, high: float, resolution: int) -> Select[Any]:
        table = samples if resolution == RAW else rollups
        closed = number == len(pieces) - 1
        where = _piece_where(table, key, keys, low, high, closed, resolution)
        return select(
            table.c[key].label(key),
            table.c.ts.label("ts"),
            *(column(table, c) for c in columns),
            literal(int(resolution != RAW), Integer).label("summary"),
        ).where(*where)

    parts = [piece(n, low, high, resolution) for n, (low, high, resolution) in enumerate(pieces)]
    if len(parts) == 1:  # one piece: _tiered reads no head either
        return parts[0].subquery("range_rows")
    rows = union_all(*parts).cte("pieces")
    firsts = (
        select(rows.c[key], func.min(rows.c.ts).label("first_ts"))
        .group_by(rows.c[key])
        .subquery("firsts")
    )
    late = (
        select(rows.c[key], rows.c.ts)
        .join(firsts, and_(rows.c[key] == firsts.c[key], rows.c.ts == firsts.c.first_ts))
        .where(rows.c.summary == 1)
        .cte("late")
    )
    head = (
        select(
            samples.c[key].label(key),
            samples.c.ts.label("ts"),
            *(column(samples, c) for c in columns),
            literal(0, Integer).label("summary"),
        )
        .join(late, and_(samples.c[key] == late.c[key], samples.c.ts <= late.c.ts))
        .where(samples.c.ts >= start)
        .cte("head")
    )
    # Only a late key's first row can meet a head row: the one summary row a sample of the
    # same time replaces. (Asked of every row against the head, SQLite evaluated the head
    # again for each: seconds for a day of 14 replicas.)
    replaced = exists().where(
        late.c[key] == rows.c[key],
        late.c.ts == rows.c.ts,
        exists().where(samples.c[key] == rows.c[key], samples.c.ts == rows.c.ts),
    )
    return union_all(
        select(head),
        select(rows).where(~and_(rows.c.summary == 1, replaced)),
    ).subquery("range_rows")


def _bucket_of(session: Session, ts: Any, seconds: int) -> Any:
    """The start of the `seconds`-long interval (aligned to the epoch, as pandas' Grouper
    aligns 5 minutes to midnight) holding `ts`: floor, on each database."""
    if session.get_bind().dialect.name == "postgresql":
        return func.floor(ts / seconds) * seconds
    # SQLite has floor() only when built with its math functions; times are positive, and
    # CAST truncates toward zero.
    return func.cast(ts / seconds, Integer) * seconds


def fleet_intervals(
    session: Session,
    start: float,
    end: float,
    seconds: int,
    increases: Sequence[str],
    coarsest: int | None = None,
) -> tuple[pd.DataFrame, int]:
    """The fleet per `seconds`-long interval of [start, end]: each counter of `increases`
    increased (`d_<counter>`, summed over replicas; a fall is a reset: the new value is the
    increase, as series.replica_series counts it) and the seconds between each replica's
    rows (`seconds`), by the interval each row falls in; with the number of replicas that
    have rows. The rows read are replica_frame's; only one row per interval comes back."""
    keys = list(session.scalars(select(TargetRow.id)))
    if coarsest is None:
        coarsest = coarsest_for(end - start)
    pieces = plan(start, end, reach(session, REPLICA_ROLLUPS) if coarsest else {}, coarsest)
    rows = _range_rows(
        REPLICA_SAMPLES, REPLICA_ROLLUPS, "target_id", keys, start, end, increases, pieces
    )
    order = {"partition_by": rows.c.target_id, "order_by": rows.c.ts}
    steps = select(
        rows.c.target_id,
        _bucket_of(session, rows.c.ts, seconds).label("bucket"),
        (rows.c.ts - func.lag(rows.c.ts).over(**order)).label("seconds"),
        # 1 at each replica's first row: their sum counts the replicas with rows.
        case((func.lag(rows.c.ts).over(**order).is_(None), 1), else_=0).label("first"),
        *(
            case(
                ((rows.c[c] - func.lag(rows.c[c]).over(**order)) < 0, rows.c[c]),
                else_=rows.c[c] - func.lag(rows.c[c]).over(**order),
            ).label(f"d_{c}")
            for c in increases
        ),
    ).subquery("steps")
    # pandas sums skip missing values and give 0 where all are missing: COALESCE(SUM, 0).
    query = (
        select(
            steps.c.bucket,
            func.coalesce(func.sum(steps.c.seconds), 0.0).label("seconds"),
            func.sum(steps.c.first).label("firsts"),
            *(func.coalesce(func.sum(steps.c[f"d_{c}"]), 0.0).label(f"d_{c}") for c in increases),
        )
        .group_by(steps.c.bucket)
        .order_by(steps.c.bucket)
    )
    frame = read_frame(session, query)
    replicas = int(frame.pop("firsts").sum()) if len(frame) else 0
    return frame, replicas


def counter_windows(
    session: Session,
    start: float,
    end: float,
    counters: Sequence[str],
    last_columns: Sequence[str],
) -> pd.DataFrame:
    """Per target with replica rows in [start, end] (replica_frame's rows): `rows`, each
    counter's increase over them (`<counter>`: a fall is a reset whose new value is the
    increase, as derived.window._increases counts) and how many rows know it
    (`<counter>_known`), and the last row's `last_columns` (`last_<column>`). Computed in
    SQL, one sort and one pass: one row per target comes back, not every sample.

    The increase steps from row to row, so it is left None where a counter is missing at
    some of a target's rows but not all (`_increases` then steps over the gap from the last
    known value): the caller computes those few targets from their rows."""
    keys = list(session.scalars(select(TargetRow.id)))
    coarsest = coarsest_for(end - start)
    pieces = plan(start, end, reach(session, REPLICA_ROLLUPS) if coarsest else {}, coarsest)
    wanted = list(dict.fromkeys([*counters, *last_columns]))
    rows = _range_rows(
        REPLICA_SAMPLES, REPLICA_ROLLUPS, "target_id", keys, start, end, wanted, pieces
    )
    order = {"partition_by": rows.c.target_id, "order_by": rows.c.ts}
    steps = select(
        rows.c.target_id,
        *(rows.c[c] for c in wanted),
        *(func.lag(rows.c[c]).over(**order).label(f"prev_{c}") for c in counters),
        func.lead(rows.c.ts).over(**order).label("next_ts"),
    ).subquery("steps")
    increases = []
    for name in counters:
        value, prev = steps.c[name], steps.c[f"prev_{name}"]
        known = func.count(value)
        total = func.sum(case((prev.is_(None), 0.0), (value < prev, value), else_=value - prev))
        increases += [
            case((or_(known == func.count(), known == 0), total)).label(name),
            known.label(f"{name}_known"),
        ]
    query = select(
        steps.c.target_id,
        func.count().label("rows"),
        *increases,
        # The last row is the one with no row after it.
        *(
            func.max(case((steps.c.next_ts.is_(None), steps.c[c]))).label(f"last_{c}")
            for c in last_columns
        ),
    ).group_by(steps.c.target_id)
    return read_frame(session, query)
