"""One collection round: fetch every target, normalize each outside any transaction, then
store the round in one savepoint (each target in its own when the database refuses a row).

Whatever goes wrong with one target (a body its normalizer rejects, an exception of any type
raised while normalizing, a row the database refuses) records that target down with a
one-line reason, and every other target of the round is stored. A sample not newer than the
last one stored for its target (the clock stepped back) is refused and counted
(`targets.samples_refused`): stored, it would sort among older samples and read as a counter
reset. A storage fault that breaks the whole transaction (database locked, disk full) fails
the round; the scheduler records it and the next round starts afresh.

Each replica target's engine (targets.engine, the one its latest sample was read as: the
kind, or for `auto` the one detected) comes with when it was first seen
(targets.engine_since): a sample whose engine differs from the stored one sets it to the
sample's time, in the same savepoint as the sample. The old engine stays in the target's
configuration history (target_configs), where the timeline finds the engine change.
Alert evaluation reads engine_since to hold an alert whose metric the new engine does not
expose (alerts/lifecycle.py).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from sqlalchemy import Table, bindparam, update
from sqlalchemy.orm import Session, sessionmaker

from collectors.dcgm import parse_dcgm
from collectors.engines import parse_replica
from collectors.parse import ScrapeFormatError
from collectors.scrape import Fetched, fetch_all
from kneepoint.clock import Clock, system_clock
from kneepoint.config import Config
from kneepoint.samples import GpuSample, ReplicaSample
from kneepoint.store.errors import describe
from kneepoint.store.models import TargetRow
from kneepoint.store.writer import (
    batch,
    record_failure,
    record_gpus,
    record_refused,
    record_replica,
    round_targets,
)

log = logging.getLogger(__name__)

_TARGETS: Table = TargetRow.__table__  # type: ignore[assignment]
_SET_ENGINE_SINCE = (
    update(_TARGETS)
    .where(_TARGETS.c.id == bindparam("target_id"))
    .values(engine_since=bindparam("since"))
)
# Per target id: the stored engine (None before its first sample).
Engines = dict[int, str | None]


@dataclass(frozen=True)
class Outcome:
    target: str
    ok: bool
    error: str | None
    seconds: float


@dataclass(frozen=True)
class Normalized:
    """One fetched target, normalized: its sample(s), or why it has none."""

    item: Fetched
    replica: ReplicaSample | None = None
    gpus: list[GpuSample] | None = None
    error: str | None = None


def collect_once(
    config: Config, sessions: sessionmaker[Session], clock: Clock = system_clock
) -> list[Outcome]:
    """Scrape every configured target once and store what came back."""
    fetched = fetch_all(list(config.targets), clock)
    return store_fetched(fetched, sessions)


def normalize(item: Fetched) -> Normalized:
    """The canonical sample(s) of one fetched body; never raises."""
    if item.error is not None:
        return Normalized(item, error=item.error)
    assert item.body is not None
    target = item.target
    try:
        if target.kind == "dcgm":
            return Normalized(item, gpus=parse_dcgm(item.body, target.name, target.max_series))
        return Normalized(item, replica=parse_replica(target.kind, item.body, target.max_series))
    except ScrapeFormatError as error:
        return Normalized(item, error=str(error))
    except Exception as error:  # a normalizer bug costs this target, never the round
        log.exception("normalizing the scrape of %s failed", target.name)
        return Normalized(item, error=f"cannot normalize the scrape: {describe(error)}")


def store_fetched(fetched: list[Fetched], sessions: sessionmaker[Session]) -> list[Outcome]:
    """Normalize (before the write transaction opens, so parsing never holds the database's
    write lock), then store every target's rows in one savepoint; if the database refuses
    any row, that savepoint is undone and each target is stored in its own, so the refusal
    costs its target only. In the common round, where nothing is refused, the rows of all
    targets go in batched (writer.batch): a few executemany statements per round, not four
    statements per target."""
    normalized = [normalize(item) for item in fetched]
    errors: list[str | None] = [entry.error for entry in normalized]
    refused: list[bool] = [False] * len(normalized)
    with sessions.begin() as session:
        if session.get_bind().dialect.name == "sqlite":
            # The write lock first, waited for up to the busy timeout. A transaction that
            # reads first cannot wait for it later: if another connection commits between
            # its first read and its first write (the membership beat, an evaluation), the
            # write fails at once with `database is locked` (SQLITE_BUSY_SNAPSHOT in WAL).
            session.connection().exec_driver_sql("BEGIN IMMEDIATE")
        stored_targets = round_targets(
            session, [(f.target.name, f.target.kind, f.target.url) for f in fetched]
        )
        ids, newest, engines = stored_targets.ids, stored_targets.newest, stored_targets.engines
        storable: list[int] = []
        for position, entry in enumerate(normalized):
            item = entry.item
            target_id = ids[item.target.name]
            if errors[position] is not None:
                continue
            if item.started_at <= newest.get(target_id, -math.inf):
                refusal = (
                    f"sample at {item.started_at:.3f} refused: not newer than the last one "
                    f"stored ({newest[target_id]:.3f}); did the clock step back?"
                )
                log.warning("%s: %s", item.target.name, refusal)
                record_refused(session, target_id, refusal)
                errors[position], refused[position] = refusal, True
                continue
            storable.append(position)
        stored = _store_all(session, ids, normalized, storable, engines)
        for position, reason in stored.items():
            errors[position] = reason
        for entry, error, was_refused in zip(normalized, errors, refused, strict=True):
            if error is not None and not was_refused:
                record_failure(session, ids[entry.item.target.name], entry.item.started_at, error)
    return [
        Outcome(entry.item.target.name, error is None, error, entry.item.duration)
        for entry, error in zip(normalized, errors, strict=True)
    ]


def _store_all(
    session: Session,
    ids: dict[str, int],
    normalized: list[Normalized],
    storable: list[int],
    engines: Engines,
) -> dict[int, str]:
    """Store the `storable` entries; return the reason for each one whose rows the database
    refused (by position)."""
    try:
        with session.begin_nested(), batch(session):
            for position in storable:
                entry = normalized[position]
                _write(session, ids[entry.item.target.name], entry, engines)
        return {}
    except Exception:  # some row was refused: find whose, each target in its own savepoint
        pass
    errors: dict[int, str] = {}
    for position in storable:
        entry = normalized[position]
        try:
            with session.begin_nested(), batch(session):
                _write(session, ids[entry.item.target.name], entry, engines)
        except Exception as error:  # this target's rows only: its savepoint is rolled back
            reason = f"cannot store the scrape: {describe(error)}"  # never the SQL's parameters
            log.warning("%s: %s", entry.item.target.name, reason)
            errors[position] = reason
    return errors


def _write(session: Session, target_id: int, entry: Normalized, engines: Engines) -> None:
    if entry.replica is not None:
        record_replica(session, target_id, entry.item.started_at, entry.replica)
        if entry.replica.engine != engines.get(target_id):
            # A new engine (or the first sample): first seen now. Rare, so one statement
            # each, run in this target's savepoint: refused with its sample, never without.
            # A stored engine equal to the sample's leaves engine_since as it is (NULL: not
            # known, from before it was kept, read as long ago).
            session.connection().execute(
                _SET_ENGINE_SINCE, [{"target_id": target_id, "since": entry.item.started_at}]
            )
    else:
        record_gpus(session, target_id, entry.item.started_at, entry.gpus or [])
