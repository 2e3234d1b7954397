"""The command line, end to end against real HTTP targets on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from kneepoint.cli import app
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.models import ReplicaSampleRow
from tests.conftest import DCGM_T4, VLLM_032, MetricsServer, Route, free_port, migrated


@pytest.fixture
def config_file(metrics_server: MetricsServer, tmp_path: Path) -> Path:
    metrics_server.routes = {"/v": Route(VLLM_032.read_bytes()), "/g": Route(DCGM_T4.read_bytes())}
    path = tmp_path / "kneepoint.yaml"
    path.write_text(f"""
database: sqlite:///{tmp_path / "k.db"}
targets:
  - {{name: replica-a, kind: vllm, url: "{metrics_server.url("/v")}", gpus: ["cp-bm14r7/0"]}}
  - {{name: node, kind: dcgm, url: "{metrics_server.url("/g")}"}}
  - {{name: dead, kind: vllm, url: "http://127.0.0.1:{free_port()}/metrics", timeout: 1s}}
""")
    return migrated(path)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kneepoint.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_collect_once_then_status_json_follows_the_contract(config_file: Path) -> None:
    collected = run("collect", "--once", "--config", str(config_file))
    assert collected.returncode == 0, collected.stderr
    assert "replica-a: up" in collected.stdout
    assert "dead: down: cannot connect" in collected.stdout
    shown = run("status", "--json", "--window", "10m", "--config", str(config_file))
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)  # nothing but JSON on stdout
    assert status["window_seconds"] == 600
    replicas = {r["name"]: r for r in status["replicas"]}
    assert replicas["replica-a"]["up"] is True
    assert replicas["replica-a"]["kv_cache_capacity_tokens"] == 2097152
    assert replicas["dead"]["up"] is False
    assert status["gpus"][0]["replica"] == "replica-a"


def test_the_config_can_come_from_the_environment(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config_file))
    result = CliRunner().invoke(app, ["collect", "--once"])
    assert result.exit_code == 0
    assert "replica-a: up" in result.output


def test_status_prints_a_table_for_people(config_file: Path) -> None:
    runner = CliRunner()
    runner.invoke(app, ["collect", "--once", "--config", str(config_file)])
    result = runner.invoke(app, ["status", "--config", str(config_file)], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "replica-a" in result.output and "DOWN" in result.output


def test_a_bad_config_is_one_sentence_on_stderr_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("scrape_interval: often\n")
    result = run("status", "--json", "--config", str(bad))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip() == (
        f"kneepoint: {bad}: scrape_interval: 'often' is not a duration like 15s, 5m, 48h or 30d"
    )


def test_a_bad_window_is_exit_2(config_file: Path) -> None:
    result = run("status", "--window", "a while", "--config", str(config_file))
    assert result.returncode == 2
    assert "--window" in result.stderr and result.stdout == ""


def test_a_missing_config_file_is_exit_2(tmp_path: Path) -> None:
    result = run("collect", "--once", "--config", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert "cannot read config" in result.stderr


def test_collect_keeps_scraping_on_its_schedule(config_file: Path, tmp_path: Path) -> None:
    fast = tmp_path / "fast.yaml"
    fast.write_text(config_file.read_text() + "scrape_interval: 500ms\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "kneepoint.cli", "collect", "--config", str(fast)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        sessions = open_store(load_config(fast).database)
        deadline = time.monotonic() + 60
        count = 0
        while time.monotonic() < deadline and count < 3:
            time.sleep(0.5)
            with sessions() as session:
                count = session.scalar(select(func.count()).select_from(ReplicaSampleRow)) or 0
        assert count >= 3, "the scheduled collector stored fewer than three scrapes"
        assert process.poll() is None, "the collector stopped although a target is dead"
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_health_says_whether_the_collector_is_scraping(config_file: Path) -> None:
    """The compose stack's health check for the collector container."""
    from apscheduler.schedulers.background import BackgroundScheduler

    from collectors.schedule import install, standard_jobs

    settings = load_config(config_file)
    sessions = open_store(settings.database)
    never = CliRunner().invoke(app, ["health", "--config", str(config_file)])
    assert never.exit_code == 1 and "unhealthy" in never.output
    scheduler = BackgroundScheduler()
    jobs = [job for job in standard_jobs(settings, sessions, time.time) if job.id == "scrape"]
    install(scheduler, jobs, sessions)
    scheduler.start()
    try:
        scheduler.get_job("scrape").modify(next_run_time=datetime.now(UTC))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            result = CliRunner().invoke(app, ["health", "--json", "--config", str(config_file)])
            if result.exit_code == 0:
                break
            time.sleep(0.2)
    finally:
        scheduler.shutdown()
    report = json.loads(result.output)
    assert report["healthy"] is True
    (scrape,) = [job for job in report["jobs"] if job["job"] == "scrape"]
    assert scrape["runs"] >= 1 and scrape["last_success_at"] is not None
