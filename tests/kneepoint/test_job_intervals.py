"""The collector's job intervals have one home (kneepoint/job_intervals.py): the scheduler
installs its jobs with them and the health check judges a job overdue by them, without
building the scheduler's jobs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from collectors.jobs import standard_jobs
from kneepoint.config import Collector, Config, Heartbeat
from kneepoint.health import intervals
from kneepoint.job_intervals import job_intervals
from kneepoint.store.db import open_store


@pytest.mark.parametrize("heartbeat", [None, Heartbeat(url="http://beat.invalid/", interval=45)])
def test_the_health_check_judges_each_job_by_the_interval_the_scheduler_gives_it(
    tmp_path: Path, heartbeat: Heartbeat | None
) -> None:
    config = Config(
        database=f"sqlite:///{tmp_path / 's.db'}",
        scrape_interval=7.0,
        evaluation_interval=11.0,
        collector=Collector(lease=36.0),
        heartbeat=heartbeat,
    )
    jobs = standard_jobs(config, open_store(config.database), time.time)  # built, never run
    scheduled = {job.id: job.every for job in jobs if not job.cron}
    assert job_intervals(config) == scheduled
    assert intervals(config) == scheduled
    assert ("heartbeat" in scheduled) == (heartbeat is not None)
    assert {job.id for job in jobs if job.cron} == {"report"}  # judged by failures alone
