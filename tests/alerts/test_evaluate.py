"""Alert evaluation over a seeded store, through the same kernel as the pages and the CLI."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

import kneepoint.cli
from alerts.evaluate import evaluate_once
from app import data
from app.format import show
from app.registry import PAGES_DIR
from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import parse_vllm
from kneepoint import clock
from kneepoint.cli import app
from kneepoint.config import Config, load_config
from kneepoint.store import queries
from kneepoint.store.db import open_store
from kneepoint.store.models import AlertHistoryRow
from kneepoint.store.writer import ensure_targets, record_failure, record_gpus, record_replica
from tests.conftest import DCGM_T4, VLLM_032, read
from tests.seed import seed

WATCH = """
rules:
  - {name: kv-watch, metric: kv_cache_occupancy, op: ">=", threshold: 0, for: 0s}
  - {name: cost-watch, metric: cost_per_million_tokens, op: ">=", threshold: 0, for: 0s,
     scope: fleet}
"""


def cli(config: Path, *args: str) -> dict:  # type: ignore[type-arg]
    result = CliRunner().invoke(app, [*args, "--config", str(config)])
    assert result.exit_code == 0, result.output
    return json.loads(result.output) if "--json" in args else {"out": result.output}


@pytest.fixture
def seeded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = seed(tmp_path, time.time())
    config.write_text(config.read_text() + WATCH)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    return config


def test_the_page_the_cli_and_the_alert_engine_show_the_same_value(
    seeded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One instant for all three, so the same five minutes of rows are in every window.
    now = float(int(time.time()))
    monkeypatch.setattr(clock, "system_clock", lambda: now)
    monkeypatch.setattr(kneepoint.cli, "system_clock", lambda: now)
    monkeypatch.setattr(data, "now", lambda: now)
    said = cli(seeded, "alerts", "eval", "--once")["out"]
    assert "kv-watch on replica-a: inactive -> firing" in said
    status = cli(seeded, "status", "--json", "--window", "5m")
    listed = cli(seeded, "alerts", "list", "--json")["alerts"]
    engine = {(a["rule"], a["replica"]): a["value"] for a in listed}
    for replica in status["replicas"]:
        if replica["kv_cache_occupancy"] is not None:
            assert engine[("kv-watch", replica["name"])] == replica["kv_cache_occupancy"]
    fleet_cost = status["fleet"]["cost_per_million_tokens"]
    assert fleet_cost is not None
    assert engine[("cost-watch", None)] == fleet_cost

    capacity = AppTest.from_file(str(PAGES_DIR / "capacity.py"), default_timeout=60)
    capacity.query_params["range"] = "5m"
    capacity.run()
    shown = [m.value for m in capacity.metric if m.label == "KV occupancy"]
    assert shown == [show(r["kv_cache_occupancy"], "%") for r in status["replicas"]]
    assert show(engine[("kv-watch", "replica-a")], "%") in shown
    cost = AppTest.from_file(str(PAGES_DIR / "cost.py"), default_timeout=60)
    cost.query_params["range"] = "5m"
    cost.run()
    fleet = {m.label: m.value for m in cost.metric}["Fleet $ / 1M tokens"]
    assert fleet == show(engine[("cost-watch", None)], "$") != "–"


def still_refused(sessions: sessionmaker[Session], ts: float) -> None:
    """The collector goes on scraping the dead replica (else it would be stale: no data)."""
    with sessions.begin() as session:
        target = queries.targets(session)["replica-down"].id
        record_failure(session, target, ts, "cannot connect: connection refused")


def test_a_dead_replica_pages_after_a_minute_and_history_is_kept(seeded: Path) -> None:
    config = load_config(seeded)
    sessions = open_store(config.database)
    now = time.time()
    for offset in (0, 30, 61):
        still_refused(sessions, now + offset)
        with sessions.begin() as session:
            evaluate_once(session, config, now + offset)
    with sessions() as session:
        history = [
            (row.rule, row.replica, row.before, row.after)
            for row in session.scalars(select(AlertHistoryRow).order_by(AlertHistoryRow.id))
            if row.rule == "target-down"
        ]
    assert history == [
        ("target-down", "replica-down", None, "pending"),
        ("target-down", "replica-down", "pending", "firing"),
    ]


def test_the_alerts_page_shows_what_fires_and_what_changed(seeded: Path) -> None:
    config = load_config(seeded)
    sessions = open_store(config.database)
    now = time.time()
    for offset in (-62, -1):  # the dead replica: pending a minute ago, firing now
        with sessions.begin() as session:
            evaluate_once(session, config, now + offset)
    page = AppTest.from_file(str(PAGES_DIR / "alerts.py"), default_timeout=60).run()
    assert not page.exception, [e.value for e in page.exception]
    counts = {m.label: m.value for m in page.metric}
    # Headers for people, states as badges (app/tables.py).
    current = page.dataframe[0].value
    firing = current[current["State"] == "● firing"]
    assert int(counts["Firing"]) == len(firing) >= 1
    pairs = set(zip(firing["Rule"], firing["Replica"], strict=True))
    assert ("target-down", "replica-down") in pairs
    history = page.dataframe[1].value
    down = history[history["Rule"] == "target-down"]
    assert list(down["To"]) == ["● firing", "● pending"]  # newest first


def test_silences_are_created_and_expired_on_the_alerts_page(seeded: Path) -> None:
    page = AppTest.from_file(str(PAGES_DIR / "alerts.py"), default_timeout=60).run()
    page.text_input[0].input("alertname=kv-cache-saturated, replica=replica-a")
    page.text_input[1].input("resizing")  # the comment; the author is the signed-in user
    page.button[-1].click().run()  # the form's submit (the last button)
    assert not page.exception, [e.value for e in page.exception]
    assert any("Silence #1 created." in box.value for box in page.success)
    (silence,) = data.silence_list()
    assert silence.matchers == {"alertname": "kv-cache-saturated", "replica": "replica-a"}
    assert (silence.author, silence.comment) == ("local user", "resizing")
    page.run()
    page.button(key="expire-1").click().run()
    assert data.silence_list()[0].ends_at <= time.time()
    page.text_input[0].input("no equals sign")
    page.button[-1].click().run()
    assert "is not label=value" in page.error[0].value


def test_a_firing_alert_is_repeated_every_repeat_interval_and_not_in_between(
    tmp_path: Path,
) -> None:
    from kneepoint.store.models import NotificationRow

    config_file = seed(tmp_path, time.time())
    config_file.write_text(
        config_file.read_text()
        + "repeat_interval: 1h\n"
        + "channels: [{name: hook, type: webhook, url: 'http://127.0.0.1:9/hook'}]\n"
        + "rules: [{name: target-down, metric: up, op: '==', threshold: 0, for: 0s,"
        + " channels: [hook]}]\n"
    )
    config = load_config(config_file)
    sessions = open_store(config.database)
    now = time.time()
    sent_after = []
    for minutes in (0, 30, 59, 61, 90, 122):
        still_refused(sessions, now + minutes * 60)
        with sessions.begin() as session:
            evaluate_once(session, config, now + minutes * 60)
        with sessions() as session:
            sent_after.append(session.query(NotificationRow).count())
    # News at 0, a reminder once an hour has passed (61), and the next at 122.
    assert sent_after == [1, 1, 1, 2, 2, 3]


BURSTY = """
database: sqlite:///{db}
scrape_interval: 5s
targets:
  - {{name: replica-a, kind: vllm, url: "http://127.0.0.1:9/a", gpus: ["cp-bm14r7/0"]}}
  - {{name: gpu-node, kind: dcgm, url: "http://127.0.0.1:9/gpus"}}
rules:
  - {{name: gpu-idle, metric: gpu_utilization, op: "<", threshold: 0.3, for: 5m}}
"""


def bursty_store(folder: Path, start: float, minutes: int) -> tuple[Config, sessionmaker[Session]]:
    """A GPU mostly idle (0.05) with a busy instant (0.9) every fifth scrape, as DCGM shows
    a lightly used GPU: its level is 0.22, under gpu-idle's 0.3, but a single reading is
    sometimes far over it."""
    config_file = folder / "kneepoint.yaml"
    config_file.write_text(BURSTY.format(db=folder / "kneepoint.db"))
    config = load_config(config_file)
    sessions = open_store(config.database)
    base = parse_vllm(read(VLLM_032))
    (gpu,) = parse_dcgm(read(DCGM_T4), default_host="gpu-node")
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for step in range(minutes * 12):
            ts = start + step * 5
            record_replica(session, ids["replica-a"], ts, base)
            busy = 0.9 if step % 5 == 4 else 0.05
            record_gpus(session, ids["gpu-node"], ts, [replace(gpu, gr_engine_active=busy)])
    return config, sessions


def test_a_held_breach_of_a_bursty_gauge_reaches_firing_and_history_says_what_was_seen(
    tmp_path: Path,
) -> None:
    # The demo's gpu-idle went pending -> inactive -> pending every 15-45 s and never fired:
    # the rule read the GPU's latest instant, and one busy scrape in five ended the pending
    # state; the history then showed the value from before (under the threshold).
    start = 1_800_000_000.0
    config, sessions = bursty_store(tmp_path, start, minutes=12)
    for k in range(14):  # every 30 s from minute 5 to 11.5: the latest reading cycles
        with sessions.begin() as session:
            evaluate_once(session, config, start + 300 + 30 * k)
    with sessions() as session:
        changes = [
            (row.before, row.after, row.value)
            for row in session.scalars(select(AlertHistoryRow).order_by(AlertHistoryRow.id))
            if row.rule == "gpu-idle" and row.replica == "replica-a"
        ]
    assert [(before, after) for before, after, _ in changes] == [
        (None, "pending"),
        ("pending", "firing"),
    ]
    # What was recorded is the window's level the rule compared, under the threshold.
    assert all(value is not None and 0.2 < value < 0.3 for _, _, value in changes)


def test_eval_says_no_data_in_words_never_value_none(tmp_path: Path) -> None:
    config = seed(tmp_path, time.time())
    config.write_text(
        config.read_text()
        + "rules:\n  - {name: kv-blind, metric: kv_cache_occupancy, op: '>=', threshold: 0.9,"
        + " for: 0s, no_data: alert}\n"
    )
    said = cli(config, "alerts", "eval", "--once")["out"]
    # replica-down never answered: no data, which this rule counts as a breach.
    assert "kv-blind on replica-down: inactive -> firing (no data, threshold 0.9" in said, said
    assert "None" not in said, said


def test_a_firing_messages_reads_hold_no_write_lock(
    seeded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cause and timeline reads of a firing page's message are made before evaluation
    writes: on SQLite a write holds the database's write lock until commit, and a scrape
    round waiting behind seconds of reads failed with `database is locked`."""
    import sqlite3

    from alerts import messages

    config_path = Path(str(seeded))
    config_path.write_text(
        config_path.read_text()
        + "  - {name: kv-page, metric: kv_cache_occupancy, op: '>=', threshold: 0, for: 0s,"
        " severity: page}\n"
    )
    config = load_config(config_path)
    database = config.database.reveal().removeprefix("sqlite:///")
    writable: list[bool] = []

    def can_write() -> None:
        other = sqlite3.connect(database, timeout=0)  # another writer, as the scrape is
        try:
            other.execute("BEGIN IMMEDIATE")  # the write lock, or `database is locked`
            other.execute("ROLLBACK")
            writable.append(True)
        except sqlite3.OperationalError:
            writable.append(False)
        finally:
            other.close()

    gather, events = messages.causes.gather, messages.timeline.events

    def gathering(*args: object, **kwargs: object) -> object:
        can_write()
        return gather(*args, **kwargs)  # type: ignore[arg-type]

    def reading(*args: object, **kwargs: object) -> object:
        can_write()
        return events(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(messages.causes, "gather", gathering)
    monkeypatch.setattr(messages.timeline, "events", reading)
    sessions = open_store(config.database)
    with sessions.begin() as session:
        transitions = evaluate_once(session, config, time.time())
    assert any(t.alert.rule == "kv-page" for t in transitions)
    assert writable and all(writable), f"reads made while the write lock was held: {writable}"
