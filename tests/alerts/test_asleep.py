"""An engine put to sleep on purpose (vLLM's sleep mode, `sleep_level` > 0) through the store:
scrapes normalized from the real vLLM 0.32 capture with work present and frozen counters,
one replica asleep and one awake. The status calls the asleep one asleep, never stalled; an
alert round fires engine-stalled (and nothing else) for the awake one only; the SLO's stalled
time is the awake one's alone."""

from __future__ import annotations

import copy
from pathlib import Path

from sqlalchemy import select, update

from alerts.evaluate import evaluate_once, measure
from kneepoint.config import Config, load_config
from kneepoint.samples import ReplicaSample
from kneepoint.status import build_status
from kneepoint.store.db import open_store
from kneepoint.store.models import AlertRow, TargetRow
from kneepoint.store.writer import ensure_targets, record_replica
from tests.alerts.test_stalled_store import LONG, STEP, busy_scrapes
from tests.conftest import migrated

START = 1_800_000_000.0


def _store(tmp_path: Path) -> Config:
    path = tmp_path / "kneepoint.yaml"
    path.write_text(f"""
database: sqlite:///{tmp_path / "k.db"}
targets:
  - {{name: sleeper, kind: vllm, url: "http://127.0.0.1:9/a"}}
  - {{name: wedged, kind: vllm, url: "http://127.0.0.1:9/b"}}
slos:
  - {{name: up, kind: availability, objective: 0.99}}
""")
    return load_config(migrated(path))


def _asleep(scrapes: list[ReplicaSample], level: float) -> list[ReplicaSample]:
    out = []
    for sample in scrapes:
        copied = copy.deepcopy(sample)
        copied.gauges["sleep_level"] = level
        out.append(copied)
    return out


def test_an_asleep_replica_is_asleep_not_stalled_and_fires_nothing(tmp_path: Path) -> None:
    config = _store(tmp_path)
    count = 2 * LONG
    scrapes = {
        "sleeper": _asleep(busy_scrapes(count, steps_move=False), 1.0),
        "wedged": _asleep(busy_scrapes(count, steps_move=False), 0.0),
    }
    times = [START + i * STEP for i in range(count)]
    sessions = open_store(config.database)
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for name, samples in scrapes.items():
            for ts, sample in zip(times, samples, strict=True):
                record_replica(session, ids[name], ts, sample)
    now = times[-1] + 1
    with sessions.begin() as session:
        status = build_status(session, config, now, 600.0)
        replicas = {r["name"]: r for r in status["replicas"]}
        assert replicas["sleeper"]["asleep"] is True
        assert replicas["sleeper"]["sleep_state"] == "weights offloaded"
        assert replicas["sleeper"]["stalled"] is False
        assert replicas["wedged"]["asleep"] is False
        assert replicas["wedged"]["sleep_state"] == "awake"
        assert replicas["wedged"]["stalled"] is True
        counted = measure(session, config, times[0], times[-1]).availability
        assert counted is not None
        # Only the awake replica's frozen stretch is stalled time.
        assert 0 < counted.stalled <= times[-1] - times[0]
    # Alert rounds over the stretch: engine-stalled fires for the awake one alone, and no
    # rule pends or fires on the asleep one.
    for k in range(4):
        with sessions.begin() as session:  # scraped just now: neither stale nor down
            session.execute(update(TargetRow).values(last_scrape_at=now + 30 * k, up=True))
            evaluate_once(session, config, now + 30 * k)
    with sessions() as session:
        alerts = session.scalars(select(AlertRow)).all()
        firing = {(a.rule, a.replica) for a in alerts if a.state == "firing"}
        assert ("engine-stalled", "wedged") in firing
        assert not [a for a in alerts if a.replica == "sleeper" and a.state != "resolved"]
