"""The store's data version: a key that changes only when what the pages show changes.

The app caches every computation over the store (app/data.py, app/changes.py, app/insight.py)
across sessions under this key instead of the wall clock, so a click, a refresh or a second
browser with unchanged data reads the cache, and a new collection round, a rollup, or a
mutation (an alert's state, a silence, an annotation, a stored run, a notification, an audit
entry) makes the next page run compute afresh. `tick` is the time pages compute "now" as:
the newest write while the collector keeps writing, else the wall clock floored to the scrape
interval, so a dead collector still makes its replicas stale after `stale_after`.

One small query (a scalar subquery per table, each a max or a count over a small or indexed
table), the same SQL on SQLite and PostgreSQL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kneepoint.config import Config
from kneepoint.store.models import (
    AlertHistoryRow,
    AlertRow,
    AnnotationRow,
    AuditRow,
    NotificationRow,
    RollupProgressRow,
    RunRow,
    SilenceRow,
    TargetRow,
)


@dataclass(frozen=True)
class Version:
    """What the store holds, as far as pages can tell, and the time pages compute as of."""

    samples: tuple[Any, ...]  # the newest round and the rollups' progress
    changes: tuple[Any, ...]  # the mutations pages list
    tick: float  # "now" for every page computed under this version

    @property
    def key(self) -> tuple[Any, ...]:
        """Everything: for what reads both samples and mutations (timeline, weekly review)."""
        return (self.samples, self.changes, self.tick)


def _scalar(column: Any) -> Any:
    return select(column).scalar_subquery()


# Each subquery: a max or a count, enough to see a row added, changed (its time or count
# moved) or deleted (a count dropped).
_SAMPLES = (
    _scalar(func.max(TargetRow.last_scrape_at)),
    _scalar(func.count(TargetRow.id)),
    _scalar(func.sum(RollupProgressRow.until)),
    _scalar(func.count(RollupProgressRow.until)),
)
_CHANGES = (
    _scalar(func.max(AlertRow.updated_at)),
    _scalar(func.count(AlertRow.fingerprint)),
    _scalar(func.max(AlertHistoryRow.id)),
    _scalar(func.max(SilenceRow.id)),
    _scalar(func.sum(SilenceRow.ends_at)),  # an expired silence ends now, whichever it is
    _scalar(func.count(SilenceRow.id)),
    _scalar(func.max(AnnotationRow.id)),
    _scalar(func.count(AnnotationRow.id)),
    _scalar(func.max(RunRow.id)),
    _scalar(func.max(RunRow.created_at)),
    _scalar(func.count(RunRow.id)),
    _scalar(func.max(NotificationRow.id)),
    _scalar(func.max(NotificationRow.sent_at)),
    _scalar(func.sum(NotificationRow.attempts)),  # a retry, a failure
    _scalar(func.count(NotificationRow.id)),
    _scalar(func.max(AuditRow.id)),
)
# The times of the writes pages select by time range (alert changes, notifications, audit
# entries, silences, runs): "now" reaches the newest, so what was just written shows at once.
_WRITTEN = (
    _scalar(func.max(AlertHistoryRow.ts)),
    _scalar(func.max(NotificationRow.created_at)),
    _scalar(func.max(AuditRow.ts)),
    _scalar(func.max(SilenceRow.created_at)),
    _scalar(func.max(RunRow.created_at)),
)


def version(session: Session, config: Config, wall: float) -> Version:
    """The store's version as of the wall-clock time `wall` (time.time())."""
    row = session.execute(select(*_SAMPLES, *_CHANGES, *_WRITTEN)).one()
    samples = tuple(_plain(v) for v in row[: len(_SAMPLES)])
    changes = tuple(_plain(v) for v in row[len(_SAMPLES) : len(_SAMPLES) + len(_CHANGES)])
    written = [v for v in (samples[0], *row[len(_SAMPLES) + len(_CHANGES) :]) if v is not None]
    return Version(samples, changes, tick(config, wall, max(written, default=None)))


def tick(config: Config, wall: float, newest: float | None) -> float:
    """The time pages compute as of: the newest write (to the second above it, so a row
    written within that second counts) while it is less than a scrape interval old (a live
    collector writes every round); else the wall clock floored to the scrape interval, which
    moves on without new data, so staleness and outages still show."""
    interval = config.scrape_interval
    if newest is not None and wall - newest < interval:
        return float(math.ceil(newest))
    # wall - newest >= interval: the floored wall is past the newest write, never behind it.
    return float(math.floor(wall / interval) * interval)


def _plain(value: Any) -> Any:
    """Numbers as floats (PostgreSQL's sums are Decimals), so keys hash and compare alike."""
    return None if value is None else float(value)
