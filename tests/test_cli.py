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

    from collectors.jobs import install, standard_jobs

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


# --- kneepoint audit ----------------------------------------------------------------------


@pytest.fixture
def audited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A migrated store whose app runs as `auth: {mode: none, anonymous_role: operator}`."""
    path = tmp_path / "kneepoint.yaml"
    path.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\ntargets: []\n"
        "auth: {mode: none, anonymous_role: operator}\n"
    )
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(path))
    return migrated(path)


def act_in_the_app() -> None:
    """What people do through the app: a silence, a refused broad one, and its expiry."""
    from streamlit.testing.v1 import AppTest

    def script() -> None:
        import streamlit as st

        from app import actions
        from kneepoint.auth import Refused

        number = actions.create_silence("alertname=kv-cache-saturated", 1.0, "deploying")
        try:
            actions.create_silence("severity=page", 1.0, "mute every page")
        except Refused as refused:
            st.error(str(refused))
        actions.expire_silence(number)

    ran = AppTest.from_function(script, default_timeout=60).run()
    assert not ran.exception, [e.value for e in ran.exception]
    assert len(ran.error) == 1  # the broad silence, refused


def test_audit_json_prints_what_the_app_recorded(audited: Path) -> None:
    from kneepoint import audit

    act_in_the_app()
    shown = run("audit", "--json", "--config", str(audited))
    assert shown.returncode == 0, shown.stderr
    printed = json.loads(shown.stdout)  # nothing but JSON on stdout
    with open_store(load_config(audited).database)() as session:
        stored = [entry.as_dict() for entry in audit.entries(session, 0.0)]
    assert printed == stored
    assert [(e["action"], e["outcome"]) for e in printed] == [
        ("silence.expire", "done"),
        ("silence.create", "refused"),
        ("silence.create", "done"),
    ]
    assert all(e["actor"] == "anonymous" and e["role"] == "operator" for e in printed)
    assert set(printed[0]) == {
        "id",
        "ts",
        "actor",
        "role",
        "via",
        "address",
        "action",
        "outcome",
        "subject",
        "before",
        "after",
        "detail",
    }
    assert printed[2]["after"]["comment"] == "deploying"
    assert "needs the admin role" in printed[1]["detail"]


def test_audit_since_and_the_table_newest_first(audited: Path) -> None:
    from kneepoint import audit
    from kneepoint.auth import Identity

    now = time.time()
    sessions = open_store(load_config(audited).database)
    who = Identity("ops@example.com", "operator", "proxy", address="10.0.0.7")
    with sessions.begin() as session:
        for days, subject in ((10, "run old"), (2, "run middle"), (0, "run new")):
            change = audit.Change(subject, before={"label": subject})
            audit.record(session, who, "run.delete", "done", change, now - days * 86400)
    week = json.loads(run("audit", "--json", "--config", str(audited)).stdout)
    assert [e["subject"] for e in week] == ["run new", "run middle"]  # --since 7d by default
    month = run("audit", "--json", "--since", "30d", "--config", str(audited))
    assert [e["subject"] for e in json.loads(month.stdout)] == ["run new", "run middle", "run old"]
    one = json.loads(run("audit", "--json", "--limit", "1", "--config", str(audited)).stdout)
    assert [e["subject"] for e in one] == ["run new"]
    table = run("audit", "--since", "30d", "--config", str(audited))
    assert table.returncode == 0, table.stderr
    assert "audit trail, last 30d, newest first" in table.stdout
    assert "ops@example.com" in table.stdout and "10.0.0.7" in table.stdout
    new, middle, old = (table.stdout.index(s) for s in ("run new", "run middle", "run old"))
    assert new < middle < old
    assert '{"label": "run old"} → –' in table.stdout


def test_audit_says_when_nothing_was_recorded_and_refuses_a_bad_since(audited: Path) -> None:
    empty = run("audit", "--config", str(audited))
    assert empty.returncode == 0 and empty.stdout.strip() == "nothing recorded in the last 7d"
    assert json.loads(run("audit", "--json", "--config", str(audited)).stdout) == []
    bad = run("audit", "--since", "a while", "--config", str(audited))
    assert bad.returncode == 2 and bad.stderr.startswith("kneepoint: --since: ")


def test_audit_text_is_not_rich_markup(audited: Path) -> None:
    """A silence's matchers are typed by people; the table shows them as typed."""
    from kneepoint import audit
    from kneepoint.auth import Identity

    sessions = open_store(load_config(audited).database)
    with sessions.begin() as session:
        change = audit.Change("alertname=[bold red]x[/bold red]")
        audit.record(
            session,
            Identity("a@b.c", "operator", "proxy"),
            "silence.create",
            "done",
            change,
            time.time(),
        )
    table = run("audit", "--config", str(audited))
    assert "alertname=[bold red]x[/bold red]" in table.stdout


def test_a_command_line_import_is_in_the_audit_trail(audited: Path, tmp_path: Path) -> None:
    result = tmp_path / "bench.json"
    result.write_text(
        json.dumps({"label": "cli", "model_id": "m", "max_concurrency": 4, "output_throughput": 9})
    )
    imported = run("import", str(result), "--config", str(audited))
    assert imported.returncode == 0, imported.stderr
    (entry,) = json.loads(run("audit", "--json", "--config", str(audited)).stdout)
    assert (entry["action"], entry["outcome"], entry["via"], entry["role"]) == (
        "run.import",
        "done",
        "cli",
        "admin",
    )
    assert entry["actor"].startswith("cli:") and entry["after"] == {"stored": ["cli"]}


def test_health_this_host_judges_only_this_hosts_collector(config_file: Path) -> None:
    """A pod's liveness probe among several collectors: a job failing on the leader makes
    `health` unhealthy for the whole cluster, but `health --this-host` only when no live
    collector beats on this host."""
    import socket

    from kneepoint.store.models import CollectorRow, JobHealthRow

    settings = load_config(config_file)
    sessions = open_store(settings.database)
    now = time.time()
    lease = settings.collector.lease

    def probe(*extra: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, ["health", *extra, "--config", str(config_file)])
        return result.exit_code, result.output

    with sessions.begin() as session:  # scraping fine, the alerts job failing
        session.add(
            JobHealthRow(job_id="scrape", runs=3, failures=0, last_run_at=now, last_success_at=now)
        )
        session.add(
            JobHealthRow(job_id="alerts", runs=3, failures=3, last_run_at=now, last_error="boom")
        )
        session.add(
            CollectorRow(
                id="elsewhere:1:a", host="elsewhere", pid=1, started_at=now, last_seen_at=now
            )
        )
    code, output = probe("--this-host")
    assert code == 1 and f"no live collector on this host ({socket.gethostname()})" in output
    with sessions.begin() as session:  # this host's collector beat long ago: gone
        session.add(
            CollectorRow(
                id="here:2:b",
                host=socket.gethostname(),
                pid=2,
                started_at=now - 10 * lease,
                last_seen_at=now - 2 * lease,
            )
        )
    assert probe("--this-host")[0] == 1
    with sessions.begin() as session:  # …and now it beats
        session.get(CollectorRow, "here:2:b").last_seen_at = time.time()
    assert probe("--this-host")[0] == 0
    code, output = probe()
    assert code == 1 and "alerts" in output, "the cluster's own check still sees the failure"


def test_demo_rules_file_that_is_not_a_rules_list_is_refused_with_a_sentence(
    tmp_path: Path,
) -> None:
    # `kneepoint demo --rules FILE` adds FILE's `rules:` to the demo's: refused before
    # anything starts when the file is missing, not YAML, or has no `rules:` list.
    not_yaml = tmp_path / "bad.yaml"
    not_yaml.write_text("rules: [unclosed\n")
    no_list = tmp_path / "no-list.yaml"
    no_list.write_text("rules: {name: x}\n")
    for path, said in (
        (tmp_path / "missing.yaml", "cannot be read as YAML"),
        (not_yaml, "cannot be read as YAML"),
        (no_list, "expected a `rules:` list"),
    ):
        result = CliRunner().invoke(app, ["demo", "--rules", str(path), "--no-browser"])
        assert result.exit_code == 2, result.output
        assert said in result.output and "Traceback" not in result.output
