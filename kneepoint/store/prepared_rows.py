"""Prepared state: results the HA leader computes once and every page reads (the issue's
"compute once, read many times"), one row per kind, inputs' key and moment (`prepared`).

A row is written once and never changed: `write` adds it unless that (kind, key, as_of) is
there already, and drops the kind's rows older than its newest KEEP, so the table stays a
few rows per kind. Only the leader writes (its evaluation transaction, which
`collectors.cluster.serialize_evaluation` runs one leader at a time); a second leader in turn
finds the row the first wrote and reads it. Readers (the app) never write. The same SQL on
SQLite and PostgreSQL: the payload is JSON text, not a JSON column (no NaN there)."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kneepoint.store.models import PreparedRow

KEEP = 5  # rows per kind: the newest, and a few before it for pages still showing them


def write(
    session: Session, kind: str, key: str, as_of: float, payload: str, written_at: float
) -> bool:
    """Store `payload` as the `kind` prepared from `key`'s inputs as of `as_of`; False if
    such a row was there already (it is kept: rows never change). Prunes the kind to KEEP."""
    if read(session, kind, key, as_of) is not None:
        return False
    try:
        # A savepoint: a row another writer added meanwhile fails only this insert, never
        # the caller's transaction (the evaluation round it is part of).
        with session.begin_nested():
            session.add(
                PreparedRow(kind=kind, key=key, as_of=as_of, written_at=written_at, payload=payload)
            )
    except IntegrityError:
        return False
    _prune(session, kind)
    return True


def _prune(session: Session, kind: str) -> None:
    """Drop the kind's rows older than its KEEP newest (by moment, whatever their key)."""
    kept = session.scalars(
        select(PreparedRow.as_of)
        .where(PreparedRow.kind == kind)
        .order_by(PreparedRow.as_of.desc())
        .offset(KEEP - 1)
        .limit(1)
    ).first()
    if kept is not None:
        session.execute(
            delete(PreparedRow).where(PreparedRow.kind == kind, PreparedRow.as_of < kept)
        )


def read(session: Session, kind: str, key: str, as_of: float) -> str | None:
    """The payload of the `kind` prepared from `key` as of exactly `as_of`; None if none."""
    return session.scalars(
        select(PreparedRow.payload).where(
            PreparedRow.kind == kind, PreparedRow.key == key, PreparedRow.as_of == as_of
        )
    ).first()


def newest(session: Session, kind: str, key: str, since: float, until: float) -> float | None:
    """The moment of the newest `kind` prepared from `key` as of a time in [since, until];
    None if none (one index range: the unique constraint's index)."""
    return session.scalars(
        select(PreparedRow.as_of)
        .where(
            PreparedRow.kind == kind,
            PreparedRow.key == key,
            PreparedRow.as_of >= since,
            PreparedRow.as_of <= until,
        )
        .order_by(PreparedRow.as_of.desc())
        .limit(1)
    ).first()
