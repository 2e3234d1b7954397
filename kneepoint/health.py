"""The collector's own health: is each scheduled job running on time without failing, and
can the database be read and written? Read by `kneepoint health`, the built-in
`alert-pipeline-failing` rule and the heartbeat (collectors/heartbeat.py), so all three
judge a job the same way.

A job is failing when its last run raised (recorded in job_health by the scheduler), and
overdue when it has a known interval and its last success is older than three intervals
(at least a minute, so one slow round is not an outage). A run skipped because the previous
one was still going, or missed, is not a failure by itself: it shows up as overdue when it
lasts.

With several collectors on one PostgreSQL database (collectors/cluster.py), job_health is
the cluster's: the scrape job's row is written by every collector, the leader-only jobs'
(alerts, deliver, rollup, report, heartbeat) by whoever leads, and a follower skipping them
writes nothing, so they are judged by the leader's runs alone: after a takeover, overdue
only if no new leader ran them within three intervals. `collectors` lists the members.

Not here: the replicas' health. Whether a replica is up, stale or stalled is
kneepoint/status.py's, and the fleet's one-word verdict is kneepoint/fleet_status.py's."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from kneepoint.config import Config
from kneepoint.job_intervals import job_intervals
from kneepoint.store import queries
from kneepoint.store.membership import membership
from kneepoint.store.models import JobHealthRow

OVERDUE_INTERVALS = 3.0
OVERDUE_AT_LEAST = 60.0
# What the scheduler's listener (collectors/jobs.record_job_event) records for a run
# that did not happen, as opposed to one that raised.
NOT_RUN = ("skipped:", "missed its run time")
# Jobs that must have run for the collector to be healthy at all.
REQUIRED = ("scrape",)


@dataclass(frozen=True)
class JobCheck:
    job: str
    every: float | None  # expected seconds between runs (None: on a cron schedule, or unknown)
    last_run_at: float | None
    last_success_at: float | None
    last_error: str | None
    runs: int
    failures: int
    problem: str | None  # None: healthy

    @property
    def ok(self) -> bool:
        return self.problem is None


def intervals(config: Config) -> dict[str, float]:
    """Seconds between each interval job's runs, as the scheduler sets them
    (kneepoint/job_intervals.py, so a new or retimed job is judged by its own interval). A
    cron job (the report) and unknown jobs have none: they are judged only by whether their
    last run failed."""
    return {job: every for job, every in job_intervals(config).items() if every > 0}


def overdue_after(every: float) -> float:
    return max(OVERDUE_INTERVALS * every, OVERDUE_AT_LEAST)


def check_job(row: JobHealthRow, every: float | None, now: float) -> JobCheck:
    problem = None
    error = row.last_error
    if error and not error.startswith(NOT_RUN):
        problem = f"failing: {error}"
    elif every is not None:
        if row.last_success_at is None:
            problem = "overdue: it has never succeeded"
        elif now - row.last_success_at > overdue_after(every):
            problem = (
                f"overdue: last success {now - row.last_success_at:.0f}s ago "
                f"(runs every {every:g}s)"
            )
    return JobCheck(
        row.job_id,
        every,
        row.last_run_at,
        row.last_success_at,
        row.last_error,
        row.runs or 0,
        row.failures or 0,
        problem,
    )


def check_jobs(session: Session, config: Config, now: float) -> list[JobCheck]:
    """Every job recorded in job_health, plus the required ones that never ran."""
    every = intervals(config)
    checks = [check_job(row, every.get(row.job_id), now) for row in queries.job_health(session)]
    seen = {c.job for c in checks}
    for job in REQUIRED:
        if job not in seen:
            checks.append(JobCheck(job, every.get(job), None, None, None, 0, 0, "never ran"))
    return checks


def check_database(sessions: sessionmaker[Session]) -> str | None:
    """None when the database answers a query, else why not (one line)."""
    try:
        with sessions() as session:
            session.execute(text("SELECT 1")).scalar()
            queries.job_health(session)
    except Exception as error:  # any driver error is the answer, not a crash
        return _one_line(error)
    return None


def check_write(sessions: sessionmaker[Session], job: str, now: float) -> str | None:
    """None when a write to the database commits (the job's own job_health row's
    last_run_at), else why not: a locked, full, read-only or vanished database."""
    try:
        with sessions.begin() as session:
            row = session.get(JobHealthRow, job)
            if row is None:
                row = JobHealthRow(job_id=job, runs=0, failures=0)
                session.add(row)
            row.last_run_at = now
    except Exception as error:  # any driver error is the answer, not a crash
        return _one_line(error)
    return None


def _one_line(error: BaseException) -> str:
    text_ = str(getattr(error, "orig", None) or error).strip().splitlines()
    return f"{type(error).__name__}: {text_[0] if text_ else ''}"


def collectors(session: Session, config: Config, now: float) -> tuple[list[dict], str | None]:
    """Each recorded collector (host, pid, started, last seen, live or gone, leader, how
    many targets it held at its last round) and the leader's id: None off PostgreSQL (no
    election: every collector runs every job) or while no collector holds the lock."""
    members = membership(session, config.collector.lease, now)
    rows = [
        {
            "id": m.id,
            "host": m.host,
            "pid": m.pid,
            "started_at": m.started_at,
            "last_seen_at": m.last_seen_at,
            "seen_seconds_ago": round(now - m.last_seen_at, 1),
            "live": m.live,
            "leader": m.leader,
            "leader_since": m.leader_since,
            "targets": m.targets,
        }
        for m in members
    ]
    leader = next((m.id for m in members if m.leader), None)
    return rows, leader
