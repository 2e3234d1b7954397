"""One collection round: fetch every target, normalize each outside any transaction, then
store each target in its own savepoint.

Whatever goes wrong with one target (a body its normalizer rejects, an exception of any type
raised while normalizing, a row the database refuses) records that target down with a
one-line reason, and every other target of the round is stored. A sample not newer than the
last one stored for its target (the clock stepped back) is refused and counted
(`targets.samples_refused`): stored, it would sort among older samples and read as a counter
reset. A storage fault that breaks the whole transaction (database locked, disk full) fails
the round; the scheduler records it and the next round starts afresh.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from collectors.dcgm import parse_dcgm
from collectors.engines import parse_replica
from collectors.parse import ScrapeFormatError
from collectors.scrape import Fetched, fetch_all
from kneepoint.clock import Clock, system_clock
from kneepoint.config import Config
from kneepoint.samples import GpuSample, ReplicaSample
from kneepoint.store.errors import describe
from kneepoint.store.writer import (
    ensure_targets,
    last_stored,
    record_failure,
    record_gpus,
    record_refused,
    record_replica,
)

log = logging.getLogger(__name__)


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
    fetched = asyncio.run(fetch_all(list(config.targets), clock))
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
    write lock), then store each target in its own savepoint."""
    normalized = [normalize(item) for item in fetched]
    outcomes: list[Outcome] = []
    with sessions.begin() as session:
        ids = ensure_targets(
            session, [(f.target.name, f.target.kind, f.target.url) for f in fetched]
        )
        newest = last_stored(session)
        for entry in normalized:
            item = entry.item
            target_id = ids[item.target.name]
            error = entry.error
            if error is None and item.started_at <= newest.get(target_id, -math.inf):
                refusal = (
                    f"sample at {item.started_at:.3f} refused: not newer than the last one "
                    f"stored ({newest[target_id]:.3f}); did the clock step back?"
                )
                log.warning("%s: %s", item.target.name, refusal)
                record_refused(session, target_id, refusal)
                outcomes.append(Outcome(item.target.name, False, refusal, item.duration))
                continue
            if error is None:
                error = _store(session, target_id, entry)
            if error is None:
                newest[target_id] = item.started_at
            else:
                record_failure(session, target_id, item.started_at, error)
            outcomes.append(Outcome(item.target.name, error is None, error, item.duration))
    return outcomes


def _store(session: Session, target_id: int, entry: Normalized) -> str | None:
    item = entry.item
    try:
        with session.begin_nested():
            if entry.replica is not None:
                record_replica(session, target_id, item.started_at, entry.replica)
            else:
                record_gpus(session, target_id, item.started_at, entry.gpus or [])
    except Exception as error:  # this target's rows only: its savepoint is rolled back
        reason = f"cannot store the scrape: {describe(error)}"  # never the SQL's parameters
        log.warning("%s: %s", item.target.name, reason)
        return reason
    return None
