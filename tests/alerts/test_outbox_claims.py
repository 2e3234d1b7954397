"""Claims: two senders, each with its own engine and sessions, deliver one outbox at the same
time, on SQLite (`BEGIN IMMEDIATE`) and on a real PostgreSQL (`FOR UPDATE SKIP LOCKED`):
every row reaches the receiver exactly once when nothing crashes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from alerts.outbox import deliver_due, http_sender
from kneepoint.config import Config
from kneepoint.store.db import open_store
from kneepoint.store.models import NotificationRow
from tests.faults.test_delivery import NOW, Sink, fire, rule_to, serving


@pytest.fixture
def sink() -> Iterator[Sink]:
    with serving() as state:
        yield state


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.real)]
)
def database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], str]]:
    if request.param == "sqlite":
        folder = tmp_path_factory.mktemp("outbox")
        yield lambda: f"sqlite:///{folder / 'k.db'}"
    else:
        from tests.postgres import running_postgres

        with running_postgres() as fresh:
            yield fresh


def test_two_senders_send_every_row_exactly_once(
    database: Callable[[], str], sink: Sink, tmp_path: Path
) -> None:
    channels = {name: sink.url(f"/{name}") for name in ("a", "b")}
    config = Config.model_validate(
        {
            "database": database(),
            "channels": [{"name": n, "type": "webhook", "url": u} for n, u in channels.items()],
        }
    )
    writer = open_store(config.database)
    for alert in range(30):  # more per channel than one round takes
        fire(writer, config, rule_to("a", "b"), fingerprint=f"alert-{alert}")
    start = threading.Barrier(2, timeout=30)
    sent: list[int] = []

    def sender(sessions: sessionmaker[Session]) -> None:
        start.wait()
        total = 0
        for _ in range(100):
            with sessions() as session:
                total += deliver_due(session, config, NOW, http_sender(10), deadline=10)["sent"]
                left = session.scalar(
                    select(func.count())
                    .select_from(NotificationRow)
                    .where(NotificationRow.state == "pending")
                )
            if not left:
                break
        sent.append(total)

    # Each its own engine and connections, as another process has.
    engines = [open_store(config.database) for _ in range(2)]
    threads = [threading.Thread(target=sender, args=(engine,)) for engine in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    with writer() as session:
        rows = list(session.scalars(select(NotificationRow)))
    assert len(rows) == 60 and {r.state for r in rows} == {"sent"}
    assert sum(sent) == 60 and len(sink.got) == 60
    assert len(set(sink.keys())) == 60  # no row reached the receiver twice
    assert all(r.resends == 0 and r.attempts == 1 for r in rows)
