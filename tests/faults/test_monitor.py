"""Monitoring of the monitor: when kneepoint itself stops watching (scraping stopped, data
gone, evaluation or delivery failing, the database locked), it is seen: alerts hold and say
"no data", stale targets show down and page, `kneepoint health` fails, and the heartbeat to
the outside stops."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

import kneepoint.cli
from alerts.channels import Notice
from alerts.evaluate import evaluate_once
from collectors.heartbeat import HeartbeatSkipped, heartbeat_job
from collectors.jobs import install, standard_jobs
from kneepoint.cli import app
from kneepoint.config import Config, Heartbeat, Target, load_config
from kneepoint.store.db import open_store
from kneepoint.store.models import AlertHistoryRow, AlertRow, JobHealthRow, NotificationRow
from tests.conftest import VLLM_032, MetricsServer, Route
from tests.seed import seed

SECRET = "/ping/3f6c1a-secret-check-key"
WATCH = """
channels: [{name: hook, type: webhook, url: "http://127.0.0.1:9/hook"}]
rules:
  - {name: kv-watch, metric: kv_cache_occupancy, op: ">=", threshold: 0, for: 0s,
     channels: [hook]}
  - {name: collector-stale, metric: stale_targets, op: ">", threshold: 0, scope: fleet,
     severity: page, channels: [hook]}
"""


def states(sessions: sessionmaker[Session]) -> dict[tuple[str, str], AlertRow]:
    with sessions() as session:
        return {(a.rule, a.replica): a for a in session.scalars(select(AlertRow))}


def test_when_scraping_stops_firing_alerts_hold_and_say_no_data_and_collector_stale_pages(
    tmp_path: Path,
) -> None:
    last = 1_800_000_000.0  # the seeded store's last scrapes are at and just before this
    config_file = seed(tmp_path, last)
    config_file.write_text(config_file.read_text() + WATCH)
    config = load_config(config_file)
    sessions = open_store(config.database)
    with sessions.begin() as session:
        evaluate_once(session, config, last - 1)
    before = states(sessions)
    assert before[("kv-watch", "replica-a")].state == "firing"
    assert ("collector-stale", "") not in before
    # Scraping stops. Ten minutes on, the 5-minute window is empty: no data anywhere.
    with sessions.begin() as session:
        evaluate_once(session, config, last + 600)
    after = states(sessions)
    kv = after[("kv-watch", "replica-a")]
    assert (kv.state, kv.value) == ("firing", None)  # not resolved
    stale = after[("collector-stale", "")]
    assert (stale.state, stale.value) == ("firing", 4.0)  # every target, the DCGM one too
    # A stale replica is no data for target-down (it is the collector that stopped, and
    # collector-stale says so), not four pages that the replicas are down.
    assert ("target-down", "replica-a") not in after
    with sessions() as session:
        history = [
            (h.before, h.after, h.value)
            for h in session.scalars(select(AlertHistoryRow).order_by(AlertHistoryRow.id))
            if (h.rule, h.replica) == ("kv-watch", "replica-a")
        ]
        notices = [
            Notice(**json.loads(row.notice))
            for row in session.scalars(select(NotificationRow).order_by(NotificationRow.id))
        ]
    assert [(b, a) for b, a, _ in history] == [(None, "firing"), ("firing", "firing")]
    assert history[-1][2] is None
    kv_notices = [n for n in notices if n.rule == "kv-watch" and n.replica == "replica-a"]
    assert [n.status for n in kv_notices] == ["firing", "firing"]  # never a resolution
    assert "replica-a no data" in kv_notices[-1].text()  # a group: both replicas
    assert any(n.rule == "collector-stale" and n.status == "firing" for n in notices)


def pipeline_config(tmp_path: Path) -> tuple[Config, sessionmaker[Session]]:
    config = Config(database=f"sqlite:///{tmp_path / 'k.db'}", evaluation_interval=15.0)
    return config, open_store(config.database)


def put_job(
    sessions: sessionmaker[Session],
    job: str,
    success: float | None,
    error: str | None = None,
    run: float | None = None,
) -> None:
    with sessions.begin() as session:
        session.merge(
            JobHealthRow(
                job_id=job,
                last_run_at=run if run is not None else success,
                last_success_at=success,
                last_error=error,
                runs=10,
                failures=1 if error else 0,
            )
        )


def pipeline(sessions: sessionmaker[Session], config: Config, now: float) -> AlertRow | None:
    with sessions.begin() as session:
        evaluate_once(session, config, now)
    return states(sessions).get(("alert-pipeline-failing", ""))


def test_alert_pipeline_failing_pages_for_a_failing_or_late_job_or_refused_messages(
    tmp_path: Path,
) -> None:
    config, sessions = pipeline_config(tmp_path)
    now = 1_800_000_000.0
    put_job(sessions, "alerts", now - 15)
    put_job(sessions, "deliver", now - 5)
    assert pipeline(sessions, config, now) is None
    # Delivery fails (its last run raised): pending, then firing after a minute.
    put_job(sessions, "deliver", now - 60, "OperationalError: database or disk is full", now)
    assert (pipeline(sessions, config, now + 1) or AlertRow()).state == "pending"
    put_job(sessions, "alerts", now + 61)  # evaluation itself keeps running
    firing = pipeline(sessions, config, now + 62)
    assert firing is not None and (firing.state, firing.value) == ("firing", 1.0)
    # Delivery recovers; a message refused for good in the last hour still counts, and
    # evaluation that has not succeeded for over three intervals (and a minute) too.
    put_job(sessions, "deliver", now + 62)
    with sessions.begin() as session:
        session.add(
            NotificationRow(
                channel="hook",
                fingerprint="x",
                notice="{}",
                state="failed",
                attempts=1,
                next_attempt_at=now,
                created_at=now + 30,
            )
        )
    put_job(sessions, "alerts", now - 60)
    assert (pipeline(sessions, config, now + 63) or AlertRow()).value == 2.0
    put_job(sessions, "alerts", now + 63)
    assert (pipeline(sessions, config, now + 64) or AlertRow()).value == 1.0
    put_job(sessions, "alerts", now + 3630)
    put_job(sessions, "deliver", now + 3630)
    resolved = pipeline(sessions, config, now + 30 + 3601)  # the refusal is over an hour old
    assert resolved is not None and resolved.state == "resolved"


def test_health_covers_every_job_and_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = 1_800_000_000.0
    config_file = tmp_path / "kneepoint.yaml"
    config_file.write_text(f"database: sqlite:///{tmp_path / 'k.db'}\nscrape_interval: 15s\n")
    config = load_config(config_file)
    sessions = open_store(config.database)
    monkeypatch.setattr(kneepoint.cli, "system_clock", lambda: now)

    def health() -> tuple[int, dict]:  # type: ignore[type-arg]
        result = CliRunner().invoke(app, ["health", "--json", "--config", str(config_file)])
        return result.exit_code, json.loads(result.output)

    code, report = health()
    assert code == 1 and [(j["job"], j["problem"]) for j in report["jobs"]] == [
        ("scrape", "never ran")
    ]
    put_job(sessions, "scrape", now - 10)
    put_job(sessions, "alerts", now - 10)
    put_job(sessions, "deliver", now - 3)
    put_job(sessions, "rollup", now - 200)
    put_job(sessions, "report", now - 86400 * 3)  # weekly: never overdue, only failed
    code, report = health()
    assert code == 0 and report["healthy"] is True
    assert report["database"] == {"ok": True, "error": None}
    assert {j["job"]: j["ok"] for j in report["jobs"]} == {
        "alerts": True,
        "deliver": True,
        "report": True,
        "rollup": True,
        "scrape": True,
    }
    for job, success, error, problem in (
        ("deliver", now - 3, "OperationalError: database is locked", "failing: Operational"),
        ("rollup", now - 1000, None, "overdue: last success 1000s ago"),
        ("report", now - 60, "TemplateError: missing", "failing: TemplateError"),
        ("alerts", now - 61, None, "overdue: last success 61s ago"),
    ):
        put_job(sessions, job, success, error)
        code, report = health()
        found = {j["job"]: j for j in report["jobs"]}
        assert code == 1 and found[job]["problem"].startswith(problem), found[job]
        put_job(sessions, job, now - 1)
    # A run skipped because the previous one was still going is not a failure by itself.
    put_job(sessions, "scrape", now - 10, "skipped: its previous run was still going", now)
    assert health()[0] == 0
    text = CliRunner().invoke(app, ["health", "--config", str(config_file)]).output
    assert text.splitlines()[0] == "database: ok" and text.splitlines()[-1] == "healthy"


class Clock:
    """An injected clock: real time plus an offset the test moves."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def wait_for(condition: Callable[[], bool], seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_the_heartbeat_is_sent_only_while_scraping_evaluation_and_the_database_are_healthy(
    tmp_path: Path, metrics_server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    metrics_server.routes = {SECRET: Route(b"OK"), "/m": Route(VLLM_032.read_bytes())}
    db = tmp_path / "k.db"
    config = Config(
        database=f"sqlite:///{db}?timeout=0.2",  # a locked database fails fast
        heartbeat=Heartbeat(url=metrics_server.url(SECRET), interval=60.0),
    )
    sessions = open_store(config.database)
    now = time.time()
    clock = Clock()
    hits = lambda: metrics_server.hits.get(SECRET, 0)  # noqa: E731
    put_job(sessions, "scrape", now - 5)
    put_job(sessions, "alerts", now - 5)
    assert heartbeat_job(config, sessions, clock) == 200
    assert hits() == 1
    # The scrape job's last success is over three intervals (and a minute) old: no beat.
    clock.offset = 120.0
    put_job(sessions, "alerts", now + 119)
    caplog.set_level(logging.WARNING, logger="collectors.heartbeat")
    with pytest.raises(HeartbeatSkipped, match="the scrape job is overdue"):
        heartbeat_job(config, sessions, clock)
    assert hits() == 1
    put_job(sessions, "scrape", now + 119)
    assert heartbeat_job(config, sessions, clock) == 200 and hits() == 2
    # Another process holds the database's write lock: the write check fails, no beat.
    holder = sqlite3.connect(db)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(HeartbeatSkipped, match="the database cannot be written"):
            heartbeat_job(config, sessions, clock)
        assert hits() == 2
    finally:
        holder.rollback()
        holder.close()
    assert heartbeat_job(config, sessions, clock) == 200 and hits() == 3
    assert "heartbeat skipped: the scrape job is overdue" in caplog.text
    assert "secret-check-key" not in caplog.text


def test_the_scheduled_heartbeat_stops_when_the_scrape_job_stops(
    tmp_path: Path, metrics_server: MetricsServer
) -> None:
    metrics_server.routes = {SECRET: Route(b"OK"), "/m": Route(VLLM_032.read_bytes())}
    config = Config(
        database=f"sqlite:///{tmp_path / 'k.db'}",
        scrape_interval=0.5,
        evaluation_interval=0.5,
        targets=[Target(name="a", kind="vllm", url=metrics_server.url("/m"))],
        heartbeat=Heartbeat(url=metrics_server.url(SECRET), interval=1.0),
    )
    sessions = open_store(config.database)
    clock = Clock()
    wanted = {"scrape", "alerts", "heartbeat"}
    jobs = [job for job in standard_jobs(config, sessions, clock) if job.id in wanted]
    scheduler = BackgroundScheduler()
    install(scheduler, jobs, sessions, clock)
    scheduler.start()

    def heartbeat() -> JobHealthRow:
        with sessions() as session:
            return session.get(JobHealthRow, "heartbeat") or JobHealthRow(runs=0)

    try:
        assert wait_for(lambda: metrics_server.hits.get(SECRET, 0) >= 2)
        scheduler.pause_job("scrape")

        # A scrape still running when paused would record its success after the clock
        # moves: shift the clock only once the scrape job's record has stopped changing.
        def scrape_runs() -> int:
            with sessions() as session:
                row = session.get(JobHealthRow, "scrape")
                return row.runs if row else 0

        settled = [scrape_runs()]

        def scrape_settled() -> bool:
            time.sleep(1.0)
            settled.append(scrape_runs())
            return settled[-1] == settled[-2]

        assert wait_for(scrape_settled)
        clock.offset = 120.0  # two minutes pass without a scrape
        assert wait_for(lambda: "scrape job is overdue" in (heartbeat().last_error or ""))
        hits, runs = metrics_server.hits[SECRET], heartbeat().runs
        assert wait_for(lambda: heartbeat().runs >= runs + 2)
        assert metrics_server.hits[SECRET] == hits  # skipped runs, no beats
        assert "secret-check-key" not in (heartbeat().last_error or "")
    finally:
        scheduler.shutdown(wait=True)
