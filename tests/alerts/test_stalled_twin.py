"""`engine-stalled` end to end on the fleet twin: a replica whose engine is wedged
(Replica.stall(): /metrics still answers with requests running and waiting, no token is
counted) is scraped by kneepoint's collector over real HTTP, round after round, and
evaluated; the rule pends, fires after its `for`, `kneepoint status --json` says since when,
and the alert resolves once the engine moves again.

The rounds run on a test clock STEP seconds apart (the collector stamps samples with it), so
a minute of stall costs no minute of wall time; between rounds of a working engine the test
waits for its counters to move, never for a fixed time."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

import kneepoint.cli
from alerts.evaluate import evaluate_once
from alerts.rules import effective_rules
from alerts.values import values
from collectors.collect import collect_once
from kneepoint.cli import app
from kneepoint.config import Config, load_config
from kneepoint.status import build_status
from kneepoint.store.db import open_store
from kneepoint.store.models import AlertHistoryRow, ReplicaSampleRow
from kneepoint.twin.fleet import Fleet, single_replica
from kneepoint.twin.replica import Replica
from kneepoint.views import build_view
from tests.conftest import migrated

pytestmark = pytest.mark.timeout(120)
NAME = "qwen3-4b"
STEP = 15.0  # test-clock seconds between rounds: the default scrape interval
RULE = "engine-stalled"


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    spec = single_replica("l4", NAME, 0, 0, max_num_seqs=4)
    running = Fleet(spec).start()
    yield running
    running.stop()


class Rounds:
    """Collect rounds and evaluations on a test clock that starts now."""

    def __init__(self, config: Config, sessions: sessionmaker[Session]) -> None:
        self.config, self.sessions = config, sessions
        self.now = float(int(time.time()))

    def collect_and_evaluate(self) -> None:
        self.now += STEP
        (outcome,) = collect_once(self.config, self.sessions, clock=lambda: self.now)
        assert outcome.ok, outcome.error  # the API answers /metrics all along
        with self.sessions.begin() as session:
            evaluate_once(session, self.config, self.now)

    def watched(self) -> float | None:
        with self.sessions() as session:
            view = build_view(session, self.config, self.now, 300.0)
            baseline = build_status(session, self.config, self.now, 3600.0)
            return values(view, baseline)[NAME]["engine_stalled"]

    def history(self) -> list[tuple[str | None, str, float]]:
        with self.sessions() as session:
            rows = session.scalars(
                select(AlertHistoryRow)
                .where(AlertHistoryRow.rule == RULE)
                .order_by(AlertHistoryRow.id)
            )
            return [(row.before, row.after, row.ts) for row in rows]

    def latest(self) -> ReplicaSampleRow:
        with self.sessions() as session:
            return session.scalars(
                select(ReplicaSampleRow).order_by(ReplicaSampleRow.ts.desc()).limit(1)
            ).one()


def counted(replica: Replica) -> float:
    stats = replica.engine.stats
    return float(stats.prompt_tokens + stats.generation_tokens)


def wait_for_tokens(replica: Replica, since: float) -> None:
    deadline = time.monotonic() + 30
    while counted(replica) <= since:
        assert time.monotonic() < deadline, "the twin's engine counted no token in 30 s"
        time.sleep(0.01)


def test_a_wedged_twin_engine_pages_and_resolves_when_it_moves_again(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kneepoint.yaml"
    path.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        f"targets:\n  - {{name: {NAME}, kind: vllm, url: '{fleet.url(NAME)}/metrics'}}\n"
    )
    config = load_config(migrated(path))
    rounds = Rounds(config, open_store(config.database))
    replica = fleet.replicas[NAME]
    stall_for = {r.name: r for r in effective_rules(config)}[RULE].for_

    # Idle: frozen counters and nothing queued are no stall.
    for _ in range(3):
        rounds.collect_and_evaluate()
    assert rounds.watched() == 0.0

    # Working: more requests than max_num_seqs, so some run and some wait; tokens move.
    for _ in range(8):
        replica.submit(list(range(1024)), max_tokens=8000)
    for _ in range(3):
        before = counted(replica)
        wait_for_tokens(replica, before)
        rounds.collect_and_evaluate()
    assert rounds.watched() == 0.0
    assert rounds.history() == []

    # Wedged: the server answers, requests sit running and waiting, no token is counted.
    replica.stall()
    rounds.collect_and_evaluate()
    stuck = rounds.latest()
    for _ in range(int(stall_for // STEP) + 3):
        rounds.collect_and_evaluate()
        if rounds.history() and rounds.history()[-1][1] == "firing":
            break
    latest = rounds.latest()
    assert latest.ts > stuck.ts
    assert (latest.prompt_tokens, latest.generation_tokens) == (  # type: ignore[attr-defined]
        stuck.prompt_tokens,  # type: ignore[attr-defined]
        stuck.generation_tokens,  # type: ignore[attr-defined]
    )
    assert (latest.requests_running or 0) > 0 and (latest.requests_waiting or 0) > 0
    assert rounds.watched() == 1.0
    (_, pending, pending_at), (_, firing, fired_at) = rounds.history()
    assert (pending, firing) == ("pending", "firing")
    assert fired_at - pending_at >= stall_for

    monkeypatch.setattr(kneepoint.cli, "system_clock", lambda: rounds.now)
    said = CliRunner().invoke(app, ["status", "--json", "--config", str(path)])
    assert said.exit_code == 0, said.output
    (shown,) = json.loads(said.output)["replicas"]
    assert shown["stalled"] is True
    # It began at the last sample whose counters still moved: before the alert pended.
    since = datetime.strptime(shown["stalled_since"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert since.timestamp() < pending_at
    assert shown["stall_seconds"] >= stall_for

    # Moving again: the alert resolves at the first round that sees tokens counted.
    replica.resume()
    wait_for_tokens(replica, counted(replica))
    rounds.collect_and_evaluate()
    assert rounds.watched() == 0.0
    assert rounds.history()[-1][:2] == ("firing", "resolved")
