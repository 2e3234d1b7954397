"""An evaluation round writes its alerts' states over the rows it loaded: the stored rows are
those session.merge left (new, changed, unchanged, and a pending alert that recovered
deleted), without looking each row up again."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select

from alerts import evaluate
from alerts.lifecycle import Alert
from kneepoint.config import Config, load_config
from kneepoint.store.db import open_store
from kneepoint.store.models import AlertRow
from tests.seed import seed

RULES = """
rules:
  - {{name: kv-watch, metric: kv_cache_occupancy, op: ">=", threshold: 0, for: 0s}}
  - {{name: kv-slow, metric: kv_cache_occupancy, op: ">=", threshold: {slow}, for: 1h}}
  - {{name: cost-watch, metric: cost_per_million_tokens, op: ">=", threshold: 0, for: 0s,
     scope: fleet}}
"""


def _config(folder: Path, now: float, slow: float) -> Config:
    path = folder / "kneepoint.yaml"
    if not path.exists():
        seed(folder, now)
        path.write_text(path.read_text() + RULES.format(slow=slow))
    else:  # kv-slow's threshold moved: its pending alerts recover (their rows go)
        text = path.read_text()
        path.write_text(text[: text.index("rules:")] + RULES.format(slow=slow))
    return load_config(path)


def _merge(
    session: Any, rows: dict[str, AlertRow], states: dict[str, Alert], values: dict[str, Any]
) -> None:
    """What the round wrote before: a merge of every state, a lookup of every row gone."""
    for key in set(rows) - set(states):
        session.delete(session.get(AlertRow, key))
    for key, alert in states.items():
        session.merge(AlertRow(**asdict(alert), **values[key]))


def _rounds(folder: Path, now: float) -> list[list[dict[str, Any]]]:
    """The alerts table after each of three rounds (kv-slow pending, then recovered)."""
    stored = []
    for offset, slow in ((0, 0.0), (30, 0.0), (60, 2.0)):
        config = _config(folder, now, slow)
        sessions = open_store(config.database)
        with sessions.begin() as session:
            evaluate.evaluate_once(session, config, now + offset)
        with sessions() as session:
            rows = session.scalars(select(AlertRow).order_by(AlertRow.fingerprint))
            stored.append(
                [{c.name: getattr(r, c.name) for c in AlertRow.__table__.columns} for r in rows]
            )
    return stored


def test_the_rows_written_are_those_merge_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    (tmp_path / "mine").mkdir()
    (tmp_path / "merged").mkdir()
    mine = _rounds(tmp_path / "mine", now)
    monkeypatch.setattr(evaluate, "_write_alerts", _merge)
    merged = _rounds(tmp_path / "merged", now)
    assert mine == merged
    states = [{(r["rule"], r["state"]) for r in rows} for rows in mine]
    assert ("kv-slow", "pending") in states[0] and ("kv-slow", "pending") in states[1]
    assert not any(rule == "kv-slow" for rule, _ in states[2])  # recovered: deleted
    assert ("kv-watch", "firing") in states[2] and ("cost-watch", "firing") in states[2]


def test_a_round_reads_its_alerts_once(tmp_path: Path) -> None:
    """The second round, with every alert stored: one statement reads the alerts table
    (merge looked each row up again: the session holds the loaded rows weakly)."""
    now = time.time()
    config = _config(tmp_path, now, 0.0)
    sessions = open_store(config.database)
    with sessions.begin() as session:
        evaluate.evaluate_once(session, config, now)
    reads: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM alerts" in statement:
            reads.append(statement)

    with sessions.begin() as session:
        count = len(session.scalars(select(AlertRow)).all())
        engine = session.get_bind()
        event.listen(engine, "before_cursor_execute", seen)
        try:
            evaluate.evaluate_once(session, config, now + 30)
        finally:
            event.remove(engine, "before_cursor_execute", seen)
    assert count >= 3
    assert len(reads) == 1
