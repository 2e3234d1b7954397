"""report.schedule: the weekly review is written on its cron line and its summary and link
reach the configured channels through the outbox."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import yaml
from apscheduler.schedulers.background import BackgroundScheduler

from alerts.outbox import deliver_due, http_sender
from collectors.jobs import install, report_job, standard_jobs
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from tests.alerts.conftest import Receiver


def test_the_scheduled_report_is_written_and_posted(
    demo_week: tuple[Path, float], receiver: Receiver, tmp_path: Path
) -> None:
    config_file, now = demo_week
    raw = yaml.safe_load(config_file.read_text())
    raw["channels"] = [{"name": "review", "type": "slack", "url": receiver.url("/slack")}]
    raw["report"] = {"schedule": "0 9 * * MON", "channels": ["review"], "output_dir": str(tmp_path)}
    settings_file = tmp_path / "kneepoint.yaml"
    settings_file.write_text(yaml.safe_dump(raw))
    config = load_config(settings_file)
    sessions = open_store(config.database)

    report_job(config, sessions, lambda: now)
    with sessions() as session:
        deliver_due(session, config, now, http_sender())
    (page,) = tmp_path.glob("kneepoint-report-*.html")
    assert (tmp_path / page.with_suffix(".md").name).exists()
    (message,) = [r for r in receiver.received if r.path == "/slack"]
    text = json.loads(message.body)["text"]
    assert text.startswith("[REPORT] Weekly capacity review\n")
    assert "recommendations:" in text and "fleet: Prefix-cache hits are lost to routing" in text
    assert f"Report: {page}" in text
    assert "page=weekly-review" in text


def test_the_report_runs_on_its_cron_line_not_at_start(demo_week: tuple[Path, float]) -> None:
    config_file, _ = demo_week
    config = load_config(config_file)
    scheduler = BackgroundScheduler(timezone=UTC)
    install(
        scheduler,
        standard_jobs(config, open_store(config.database), lambda: 0.0),
        open_store(config.database),
    )
    scheduler.start(paused=True)
    try:
        job = scheduler.get_job("report")
        when = job.next_run_time
    finally:
        scheduler.shutdown(wait=False)
    # The default schedule, "0 9 * * MON": the coming Monday at 09:00 UTC.
    assert (when.weekday(), when.hour, when.minute) == (0, 9, 0)
    assert when > datetime.now(UTC)
