"""The collector's APScheduler jobs (`standard_jobs`): scrape and the membership beat on every
collector; roll up, evaluate the alerts, deliver the outbox, the weekly report (on its cron
line) and the heartbeat (where configured) on the leader only. With several collectors on one
PostgreSQL database, each scrapes its share and one leads the rest (collectors/cluster.py).
Every run's outcome is recorded as the job's health (job_health)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    JobEvent,
)
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import Table, bindparam, func, insert, update
from sqlalchemy.orm import Session, sessionmaker

from alerts.evaluate import evaluate_once
from alerts.outbox import deliver_due, http_sender
from collectors.cluster import NOT_LEADER, Cluster, serialize_evaluation
from collectors.collect import Outcome, collect_once
from collectors.discovery import current
from collectors.heartbeat import heartbeat_job
from collectors.prometheus_api import collect_from_prometheus
from kneepoint import malloc
from kneepoint.clock import Clock, system_clock
from kneepoint.config import Config
from kneepoint.job_intervals import job_intervals
from kneepoint.store.errors import StorageError, describe, is_storage_error
from kneepoint.store.models import JobHealthRow
from kneepoint.store.rollup import rollup_in_slices

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """A job for the scheduler: its id (the job_health row), what it runs, and when: every
    `every` seconds, or on its `cron` line (the weekly report)."""

    id: str
    func: Callable[[], object]
    every: float = 0.0  # seconds between runs…
    cron: str | None = None  # …or a crontab line (UTC) instead


def collect_round(
    config: Config,
    sessions: sessionmaker[Session],
    clock: Clock = system_clock,
    cluster: Cluster | None = None,
) -> list[Outcome]:
    """One collection round: scrape the targets, or read them from Prometheus when the
    config names one (`prometheus:`), with the targets `discovery:` finds added. With a
    `cluster` (several collectors on one PostgreSQL database), only this collector's share
    of them (collectors/cluster.py)."""
    if config.prometheus is not None:
        return collect_from_prometheus(
            _share(current(config, max_age=0.0), cluster), sessions, clock
        )
    return collect_once(_share(current(config, max_age=0.0), cluster), sessions, clock)


def _share(config: Config, cluster: Cluster | None) -> Config:
    if cluster is None:
        return config
    return config.model_copy(update={"targets": cluster.share(list(config.targets))})


def scrape_job(
    config: Config, sessions: sessionmaker[Session], clock: Clock, cluster: Cluster | None = None
) -> None:
    for outcome in collect_round(config, sessions, clock, cluster):
        if not outcome.ok:
            log.warning("scrape of %s failed: %s", outcome.target, outcome.error)


def rollup_job(config: Config, sessions: sessionmaker[Session], clock: Clock) -> None:
    """Roll up, expire and prune, committing slice by slice (the scrape writes between)."""
    result = rollup_in_slices(sessions, clock(), config.retention)
    log.debug("rollup: %s", result)


def alerts_job(config: Config, sessions: sessionmaker[Session], clock: Clock) -> None:
    """Evaluate the rules; what they send goes to the outbox, for `deliver_job` (so no
    receiver, however slow, ever holds evaluation up)."""
    with sessions.begin() as session:
        serialize_evaluation(session)  # two collectors that both think they lead: in turn
        evaluate_once(session, current(config), clock())


def deliver_job(config: Config, sessions: sessionmaker[Session], clock: Clock) -> None:
    with sessions() as session:
        counts = deliver_due(session, config, clock(), http_sender())
    if any(counts.values()):
        log.info("notifications: %s", ", ".join(f"{n} {k}" for k, n in counts.items() if n))


def standard_jobs(
    config: Config,
    sessions: sessionmaker[Session],
    clock: Clock,
    cluster: Cluster | None = None,
) -> list[Job]:
    """The collector's jobs. Scraping and the membership beat run on every collector;
    the rest on the leader only (collectors/cluster.py): on a follower they return
    NOT_LEADER at once, which is neither a run nor a failure in job_health."""
    cluster = cluster or Cluster(config, sessions, clock)
    every = job_intervals(config)

    def leading(func: Callable[[], object]) -> Callable[[], object]:
        return lambda: func() if cluster.is_leader() else NOT_LEADER

    jobs = [
        Job("scrape", lambda: scrape_job(config, sessions, clock, cluster), every["scrape"]),
        Job("cluster", cluster.beat, cluster.every),
        Job("rollup", leading(lambda: rollup_job(config, sessions, clock)), every["rollup"]),
        Job("alerts", leading(lambda: alerts_job(config, sessions, clock)), every["alerts"]),
        Job("deliver", leading(lambda: deliver_job(config, sessions, clock)), every["deliver"]),
        Job(
            "report",
            leading(lambda: report_job(config, sessions, clock)),
            cron=config.report.schedule,
        ),
    ]
    if "heartbeat" in every:  # the dead-man's switch: collectors/heartbeat.py
        beat = leading(lambda: heartbeat_job(config, sessions, clock))
        jobs.append(Job("heartbeat", beat, every["heartbeat"]))
    return jobs


def install_collector(
    scheduler: BaseScheduler,
    config: Config,
    sessions: sessionmaker[Session],
    clock: Clock = system_clock,
) -> Cluster:
    """Install the standard jobs of one collector; return its Cluster, whose `leave()`
    the caller runs at shutdown."""
    cluster = Cluster(config, sessions, clock)
    install(scheduler, standard_jobs(config, sessions, clock, cluster), sessions, clock)
    return cluster


def report_job(config: Config, sessions: sessionmaker[Session], clock: Clock) -> None:
    # Deferred: the review brings plotly, scipy and the what-if's twin (about 65 MiB), which
    # a collector should hold only on the day its weekly report runs, not from its start.
    from review.deliver import send_report

    with sessions.begin() as session:
        page, queued = send_report(session, current(config), clock())
    log.info("weekly report written to %s, %d messages queued", page, queued)


def install(
    scheduler: BaseScheduler,
    jobs: list[Job],
    sessions: sessionmaker[Session],
    clock: Clock = system_clock,
) -> None:
    """Add jobs (one instance each, coalesced) and record every run's outcome as health."""
    for job in jobs:
        if job.cron:  # on its schedule only: a restart must not send another report
            scheduler.add_job(
                guarded(job),
                CronTrigger.from_crontab(job.cron, timezone=UTC),
                id=job.id,
                name=job.id,
                replace_existing=True,
                coalesce=True,
                max_instances=1,
                misfire_grace_time=3600,
            )
            continue
        scheduler.add_job(
            guarded(job),
            IntervalTrigger(seconds=job.every),
            id=job.id,
            name=job.id,
            replace_existing=True,
            coalesce=True,
            max_instances=1,
            misfire_grace_time=max(1, int(job.every)),
            next_run_time=_now(scheduler),
        )
    scheduler.add_listener(
        lambda event: record_job_event(sessions, event, clock),
        EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES,
    )


def guarded(job: Job) -> Callable[[], object]:
    """The job's function, a database failure in it logged in one line and raised again as
    a StorageError carrying only that line (SQLAlchemy's own message holds the statement
    and its parameters, which logs and job_health must not). After the run, the memory its
    temporaries freed goes back to the system (malloc.after_job, at most every 30 s)."""

    def run() -> object:
        try:
            return job.func()
        except Exception as error:
            if not is_storage_error(error) or isinstance(error, StorageError):
                raise
            log.error("%s job: storage error: %s", job.id, describe(error))
            raise StorageError(describe(error)) from None
        finally:
            malloc.after_job()

    return run


# Job outcomes that could not be written (the database locked, full, read-only or gone):
# runs and failures by job, and the last error; added to the next outcome that is written.
_unrecorded: dict[str, tuple[int, int, str | None]] = {}
_unrecorded_lock = threading.Lock()


def record_job_event(sessions: sessionmaker[Session], event: JobEvent, clock: Clock) -> None:
    """A job's success or error lands in job_health instead of dying in a log. When the
    database cannot take it, it is logged, kept in memory and counted into the next outcome
    that can be written, so failed runs during a storage fault still show as failures."""
    if event.code == EVENT_JOB_EXECUTED and getattr(event, "retval", None) is NOT_LEADER:
        return  # a leader-only job on a follower: not run, not failed
    error = getattr(event, "exception", None)
    skipped = {
        EVENT_JOB_MISSED: "missed its run time",
        EVENT_JOB_MAX_INSTANCES: "skipped: its previous run was still going",
    }.get(event.code)
    failed = error is not None or skipped is not None
    message = skipped or (describe(error) if error is not None else None)
    now = clock()
    with _unrecorded_lock:
        runs, failures, last_error = _unrecorded.pop(event.job_id, (0, 0, None))
    runs, failures = runs + 1, failures + failed
    last_error = message if failed else last_error
    try:
        with sessions.begin() as session:
            _record_health(session, event.job_id, now, runs, failures, message if failed else None)
    except Exception as problem:  # the store is down: keep the outcome for the next write
        with _unrecorded_lock:
            more_runs, more_failures, newer = _unrecorded.pop(event.job_id, (0, 0, None))
            _unrecorded[event.job_id] = (
                runs + more_runs,
                failures + more_failures,
                newer or last_error,
            )
        log.warning(
            "%s job: its outcome could not be recorded (%s); kept for the next record",
            event.job_id,
            describe(problem),
        )


_JOB_HEALTH = cast(Table, JobHealthRow.__table__)
_ADD_RUNS = {
    "last_run_at": bindparam("now"),
    "runs": func.coalesce(_JOB_HEALTH.c.runs, 0) + bindparam("more_runs"),
    "failures": func.coalesce(_JOB_HEALTH.c.failures, 0) + bindparam("more_failures"),
}
_OF_JOB = _JOB_HEALTH.c.job_id == bindparam("job")
# A job's runs added to its row in one statement (every job run writes one: the ORM's load
# and flush cost several times as much), its last success or its last error with them.
_SUCCEEDED = (
    update(_JOB_HEALTH)
    .where(_OF_JOB)
    .values(**_ADD_RUNS, last_success_at=bindparam("now"), last_error=None)
)
_FAILED = update(_JOB_HEALTH).where(_OF_JOB).values(**_ADD_RUNS, last_error=bindparam("message"))


def _record_health(
    session: Session, job_id: str, now: float, runs: int, failures: int, error: str | None
) -> None:
    """Add `runs` and `failures` to the job's row (made the first time), ended by a success
    at `now` if `error` is None, else by that error."""
    connection = session.connection()
    values = {"job": job_id, "now": now, "more_runs": runs, "more_failures": failures}
    if error is None:
        updated = connection.execute(_SUCCEEDED, values)
    else:
        updated = connection.execute(_FAILED, {**values, "message": error})
    if updated.rowcount == 0:  # its first run
        connection.execute(
            insert(_JOB_HEALTH).values(
                job_id=job_id,
                last_run_at=now,
                last_success_at=now if error is None else None,
                last_error=error,
                runs=runs,
                failures=failures,
            )
        )


def _now(scheduler: BaseScheduler) -> datetime:
    return datetime.now(scheduler.timezone)
