"""The store's data version (kneepoint/prepared.py), on SQLite and PostgreSQL: it stays put
while nothing is written, moves with every round, rollup and mutation pages show, and its
tick follows the newest write while the collector lives and the wall clock when it died."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from collectors.engines.vllm import parse_vllm
from kneepoint.config import Config
from kneepoint.prepared import Version, tick, version
from kneepoint.store.db import open_store
from kneepoint.store.models import (
    AlertHistoryRow,
    AlertRow,
    AnnotationRow,
    AuditRow,
    NotificationRow,
    RunRow,
    SilenceRow,
)
from kneepoint.store.rollup import rollup
from kneepoint.store.writer import ensure_targets, record_replica
from tests.conftest import VLLM_032, read

T0 = 1_700_000_001.0  # one second into a 5 s scrape interval
CONFIG = Config.model_validate(
    {"scrape_interval": "5s", "targets": [{"name": "a", "kind": "vllm", "url": "http://a/"}]}
)


@pytest.fixture
def sessions(fresh_url: Callable[[], str]) -> sessionmaker[Session]:
    return open_store(fresh_url())


def now_of(sessions: sessionmaker[Session], wall: float) -> Version:
    with sessions() as session:
        return version(session, CONFIG, wall)


def scrape(sessions: sessionmaker[Session], at: float) -> None:
    with sessions.begin() as session:
        ids = ensure_targets(session, [("a", "vllm", "http://a/")])
        record_replica(session, ids["a"], at, copy.deepcopy(parse_vllm(read(VLLM_032))))


def test_nothing_written_nothing_moves_within_a_scrape_interval(
    sessions: sessionmaker[Session],
) -> None:
    scrape(sessions, T0 - 7.5)  # the collector's last round, more than an interval ago
    first = now_of(sessions, T0)
    assert now_of(sessions, T0 + 2.0) == first  # a click, a refresh: the same version
    assert first.tick == T0 - 1.0  # the wall clock floored to the interval, past the round
    later = now_of(sessions, T0 + 4.5)  # the next interval: staleness can show
    assert later.tick == T0 + 4.0 and later.samples == first.samples


def test_a_round_moves_the_samples_and_the_tick_reaches_it(
    sessions: sessionmaker[Session],
) -> None:
    scrape(sessions, T0 - 7.5)
    before = now_of(sessions, T0)
    scrape(sessions, T0 - 0.4)
    after = now_of(sessions, T0)
    assert after.samples != before.samples and after.changes == before.changes
    assert after.tick == T0  # the newest round, to the second above it: it counts
    assert now_of(sessions, T0 + 3.0) == after  # a live collector: the round is the key


def test_a_rollup_moves_the_samples(sessions: sessionmaker[Session]) -> None:
    for step in range(40):
        scrape(sessions, T0 - 4 * 3600 + step * 300.0)
    before = now_of(sessions, T0 + 3600)
    with sessions.begin() as session:
        rollup(session, now=T0, retention=CONFIG.retention)
    assert now_of(sessions, T0 + 3600).samples != before.samples


MUTATIONS: dict[str, Callable[[Session, float], object]] = {
    "alert state": lambda s, at: s.execute(update(AlertRow).values(updated_at=at)),
    "alert change": lambda s, at: s.add(
        AlertHistoryRow(fingerprint="f", rule="r", replica="a", ts=at, after="firing")
    ),
    "silence": lambda s, at: s.add(
        SilenceRow(
            matchers="{}", starts_at=at, ends_at=at + 60, author="x", comment="", created_at=at
        )
    ),
    "silence expired": lambda s, at: s.execute(
        update(SilenceRow).where(SilenceRow.id == 1).values(ends_at=at)
    ),
    "annotation": lambda s, at: s.add(AnnotationRow(ts=at - 3600, text="deploy", author="x")),
    "run": lambda s, at: s.add(RunRow(label="l2", model="m", source="x", created_at=at)),
    "notification retried": lambda s, at: s.execute(
        update(NotificationRow).values(attempts=NotificationRow.attempts + 1)
    ),
    "audit": lambda s, at: s.add(
        AuditRow(ts=at, actor="x", via="cli", action="a", outcome="done", subject="s")
    ),
}


def test_every_mutation_a_page_shows_moves_the_changes(sessions: sessionmaker[Session]) -> None:
    scrape(sessions, T0 - 7.5)
    with sessions.begin() as session:
        session.add(
            AlertRow(
                fingerprint="f",
                rule="r",
                replica="a",
                state="firing",
                threshold=1.0,
                updated_at=T0 - 60,
            )
        )
        for end in (T0 + 600, T0 + 900):  # expiring the first leaves the latest end alone
            session.add(
                SilenceRow(
                    matchers=json.dumps({}),
                    starts_at=T0 - 60,
                    ends_at=end,
                    author="x",
                    comment="",
                    created_at=T0 - 60,
                )
            )
        notice = dict(channel="c", fingerprint="f", notice="{}", state="pending")
        session.add(NotificationRow(**notice, attempts=0, next_attempt_at=T0, created_at=T0 - 60))
    wall = T0
    for name, mutate in MUTATIONS.items():
        before = now_of(sessions, wall)
        wall += 0.1  # the same scrape interval: only the data moves
        with sessions.begin() as session:
            mutate(session, wall)
        after = now_of(sessions, wall)
        assert after.changes != before.changes, name
        assert after.samples == before.samples, name


def test_a_change_written_now_is_inside_the_tick(sessions: sessionmaker[Session]) -> None:
    scrape(sessions, T0 - 7.5)
    with sessions.begin() as session:
        session.add(
            AuditRow(ts=T0 + 0.3, actor="x", via="cli", action="a", outcome="done", subject="s")
        )
    assert now_of(sessions, T0 + 0.3).tick >= T0 + 0.3


def test_the_tick_never_falls_behind_the_newest_write() -> None:
    for newest in (T0 - 10.0, T0 - 5.0, T0 - 4.99, T0, T0 + 2.5):  # a collector ahead too
        assert tick(CONFIG, T0, newest) >= newest
    assert tick(CONFIG, T0, None) == T0 - 1.0
