"""One collection round: fetch all targets, normalize each, store each in its own savepoint."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from collectors.dcgm import parse_dcgm
from collectors.parse import ScrapeFormatError
from collectors.scrape import Fetched, fetch_all
from collectors.vllm import parse_vllm
from kneepoint.clock import Clock, system_clock
from kneepoint.config import Config
from kneepoint.store.writer import ensure_targets, record_failure, record_gpus, record_replica


@dataclass(frozen=True)
class Outcome:
    target: str
    ok: bool
    error: str | None
    seconds: float


def collect_once(
    config: Config, sessions: sessionmaker[Session], clock: Clock = system_clock
) -> list[Outcome]:
    """Scrape every configured target once and store what came back."""
    fetched = asyncio.run(fetch_all(list(config.targets), clock))
    return store_fetched(fetched, sessions)


def store_fetched(fetched: list[Fetched], sessions: sessionmaker[Session]) -> list[Outcome]:
    """Normalize and store; a target whose body is bad is recorded as down, the rest go on."""
    outcomes: list[Outcome] = []
    with sessions.begin() as session:
        ids = ensure_targets(
            session, [(f.target.name, f.target.kind, f.target.url) for f in fetched]
        )
        for item in fetched:
            target_id = ids[item.target.name]
            error = item.error or _store_body(session, target_id, item)
            if error is not None:
                record_failure(session, target_id, item.started_at, error)
            outcomes.append(Outcome(item.target.name, error is None, error, item.duration))
    return outcomes


def _store_body(session: Session, target_id: int, item: Fetched) -> str | None:
    assert item.body is not None
    try:
        with session.begin_nested():
            if item.target.kind == "vllm":
                record_replica(session, target_id, item.started_at, parse_vllm(item.body))
            else:
                gpus = parse_dcgm(item.body, default_host=item.target.name)
                record_gpus(session, target_id, item.started_at, gpus)
    except ScrapeFormatError as error:
        return str(error)
    return None
