"""The one read path over the store: every page, command and alert reads through here."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from kneepoint.samples import Histogram
from kneepoint.store.codec import decode_bounds, decode_histogram
from kneepoint.store.models import (
    AlertHistoryRow,
    AlertRow,
    GpuRow,
    GpuSampleRow,
    HistogramLayoutRow,
    JobHealthRow,
    NotificationRow,
    ReplicaSampleRow,
    ScrapeErrorRow,
    TargetRow,
)


def targets(session: Session) -> dict[str, TargetRow]:
    return {row.name: row for row in session.scalars(select(TargetRow).order_by(TargetRow.id))}


def replica_frame(
    session: Session,
    start: float,
    end: float,
    target_ids: list[int] | None = None,
    columns: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Replica rows with start <= ts <= end, ordered by target and time; only `columns`
    (besides target and time) when given: charts need no histograms, and reading them is
    most of the cost of a long range."""
    table = ReplicaSampleRow.__table__
    selected = (
        (table.c.target_id, table.c.ts, *(table.c[c] for c in columns)) if columns else (table,)
    )
    if target_ids is None:
        target_ids = list(session.scalars(select(TargetRow.id)))
    # The target ids lead the (target_id, ts) key, so each target's rows are one range
    # search; by time alone the whole table would be scanned.
    query = (
        select(*selected)
        .where(
            ReplicaSampleRow.target_id.in_(target_ids),
            ReplicaSampleRow.ts >= start,
            ReplicaSampleRow.ts <= end,
        )
        .order_by(ReplicaSampleRow.target_id, ReplicaSampleRow.ts)
    )
    return pd.read_sql(query, session.connection())


# Every replica column but the encoded ones: what windowed numbers and charts read in bulk.
LIGHT_COLUMNS = tuple(
    c.name
    for c in ReplicaSampleRow.__table__.columns
    if c.name not in ("target_id", "ts", "accepted_per_position") and not c.name.startswith("hist_")
)


def replica_rows_at(session: Session, keys: pd.DataFrame) -> pd.DataFrame:
    """Whole replica rows for the (target_id, ts) pairs in `keys`."""
    if keys.empty:
        return pd.DataFrame(columns=[c.name for c in ReplicaSampleRow.__table__.columns])
    table = ReplicaSampleRow.__table__
    pairs = [(int(t), float(ts)) for t, ts in zip(keys.target_id, keys.ts, strict=True)]
    # Target ids and the time range let the (target_id, ts) key narrow the search first.
    query = select(table).where(
        table.c.target_id.in_(sorted({t for t, _ in pairs})),
        table.c.ts >= min(ts for _, ts in pairs),
        table.c.ts <= max(ts for _, ts in pairs),
        tuple_(table.c.target_id, table.c.ts).in_(pairs),
    )
    return pd.read_sql(query.order_by(table.c.target_id, table.c.ts), session.connection())


def gpu_frame(session: Session, start: float, end: float) -> pd.DataFrame:
    """GPU readings with their identity (target, host, index, model, pod)."""
    query = (
        select(
            GpuRow.target_id,
            GpuRow.host,
            GpuRow.gpu_index,
            GpuRow.model,
            GpuRow.pod,
            GpuRow.uuid,
            GpuSampleRow.__table__,
        )
        .join(GpuRow, GpuRow.id == GpuSampleRow.gpu_id)
        .where(
            GpuSampleRow.gpu_id.in_(select(GpuRow.id).scalar_subquery()),
            GpuSampleRow.ts >= start,
            GpuSampleRow.ts <= end,
        )
        .order_by(GpuSampleRow.gpu_id, GpuSampleRow.ts)
    )
    return pd.read_sql(query, session.connection())


def scrape_errors(session: Session, start: float, end: float) -> pd.DataFrame:
    query = (
        select(TargetRow.name.label("target"), ScrapeErrorRow.ts, ScrapeErrorRow.error)
        .join(TargetRow, TargetRow.id == ScrapeErrorRow.target_id)
        .where(ScrapeErrorRow.ts >= start, ScrapeErrorRow.ts <= end)
        .order_by(ScrapeErrorRow.ts)
    )
    return pd.read_sql(query, session.connection())


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
    return pd.read_sql(query, session.connection())


def alert_history(session: Session, start: float, end: float) -> pd.DataFrame:
    """Every alert state change in [start, end], newest first."""
    table = AlertHistoryRow.__table__
    query = (
        select(table)
        .where(table.c.ts >= start, table.c.ts <= end)
        .order_by(table.c.ts.desc(), table.c.id.desc())
    )
    return pd.read_sql(query, session.connection())


def notifications(session: Session, start: float, end: float) -> pd.DataFrame:
    """The outbox's rows created in [start, end], newest first (the delivery log)."""
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
    )
    return pd.read_sql(query, session.connection())
