from __future__ import annotations

import threading
import time
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import func, select

from collectors.jobs import Job, install, standard_jobs
from kneepoint.config import Config, Target
from kneepoint.store.db import open_store
from kneepoint.store.models import JobHealthRow, ReplicaSampleRow
from tests.conftest import VLLM_032, MetricsServer, Route


def wait_for(condition, timeout: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_jobs_run_on_schedule_and_record_their_health(
    metrics_server: MetricsServer, tmp_path: Path
) -> None:
    metrics_server.routes = {"/m": Route(VLLM_032.read_bytes())}
    config = Config(
        database=f"sqlite:///{tmp_path / 's.db'}",
        scrape_interval=0.2,
        targets=[Target(name="a", kind="vllm", url=metrics_server.url("/m"))],
    )
    sessions = open_store(config.database)
    failed = threading.Event()

    def broken() -> None:
        failed.set()
        raise RuntimeError("report template missing")

    scheduler = BackgroundScheduler()
    jobs = [*standard_jobs(config, sessions, time.time), Job("flaky", broken, 60)]
    install(scheduler, jobs, sessions)
    scheduler.start()
    try:

        def scraped_three_times() -> bool:
            with sessions() as session:
                count = session.scalar(select(func.count()).select_from(ReplicaSampleRow))
                return bool(count and count >= 3)

        assert wait_for(scraped_three_times)
        assert failed.wait(5)

        def health_recorded() -> bool:
            with sessions() as session:
                return session.get(JobHealthRow, "flaky") is not None

        assert wait_for(health_recorded)
    finally:
        scheduler.shutdown(wait=True)
    with sessions() as session:
        report = session.get(JobHealthRow, "flaky")
        scrape = session.get(JobHealthRow, "scrape")
        assert report is not None and scrape is not None
        assert report.failures >= 1
        assert report.last_error == "RuntimeError: report template missing"
        # Runs skipped because the previous was still going (a loaded machine at 0.2 s) are
        # the only failures a scrape may have here.
        assert scrape.runs - scrape.failures >= 3
        assert scrape.last_error in (None, "skipped: its previous run was still going")
    # The failing job did not stop the scrapes.
    assert metrics_server.hits["/m"] >= 3


def test_a_long_job_never_overlaps_itself(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 's.db'}")
    running = 0
    overlaps = 0
    runs = 0
    lock = threading.Lock()

    def slow() -> None:
        nonlocal running, overlaps, runs
        with lock:
            running += 1
            overlaps += running > 1
        time.sleep(0.5)
        with lock:
            running -= 1
            runs += 1

    scheduler = BackgroundScheduler()
    install(scheduler, [Job("slow", slow, 0.1)], sessions)
    scheduler.start()
    try:
        assert wait_for(lambda: runs >= 2, timeout=10)
    finally:
        scheduler.shutdown(wait=True)
    assert overlaps == 0


def test_a_skipped_run_is_recorded_as_collector_health(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 's.db'}")
    release = threading.Event()

    def stuck() -> None:
        release.wait(10)

    scheduler = BackgroundScheduler()
    install(scheduler, [Job("stuck", stuck, 0.1)], sessions)
    scheduler.start()

    def skipped() -> bool:
        with sessions() as session:
            row = session.get(JobHealthRow, "stuck")
            return row is not None and (row.last_error or "").startswith("skipped")

    try:
        assert wait_for(skipped, timeout=10)
    finally:
        release.set()
        scheduler.shutdown(wait=True)
