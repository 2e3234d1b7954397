"""The dead-man's switch: request `heartbeat.url` every `heartbeat.interval` while kneepoint
is healthy, and not while it is not, so a service expecting the requests (healthchecks.io,
Cronitor, an Alertmanager Watchdog receiver) raises the alarm when kneepoint is dead, stuck,
locked out of its database or out of disk: the failures kneepoint cannot report itself.

Healthy, for one beat, means all of (kneepoint/health.py judges the jobs):
- scraping: the scrape job succeeded within three scrape intervals (at least a minute);
- evaluation: the alerts job succeeded within three evaluation intervals, and the deliver
  job, once it has run, is neither failing nor overdue;
- the database: a write commits (the heartbeat's own job_health row).

Otherwise the beat is skipped: the reason is logged and raised, so job_health records it
as the heartbeat job's last error. The request is a GET with a total deadline (connect,
send and read together), so a receiver that trickles cannot hold the job. The URL is a
secret (its path is the check's key): logs and errors name only its scheme and host."""

from __future__ import annotations

import asyncio
import logging

import httpx
from sqlalchemy.orm import Session, sessionmaker

from kneepoint.clock import Clock
from kneepoint.config import Config
from kneepoint.health import check_jobs, check_write
from kneepoint.secrets import redact_url

log = logging.getLogger(__name__)
JOB = "heartbeat"
LONGEST_REQUEST = 10.0  # seconds, at most, for the whole request
WATCHED = ("scrape", "alerts")  # must have run, and recently
WATCHED_IF_RUN = ("deliver",)  # judged once they exist in job_health


class HeartbeatSkipped(RuntimeError):
    """kneepoint is not healthy: no beat was sent (the message says why)."""


class HeartbeatFailed(RuntimeError):
    """The receiver did not take the beat (the message never includes the URL's path)."""


def redacted(url: str) -> str:
    """The URL without its secret part: scheme://host[:port]/… (kneepoint/secrets.py)."""
    return redact_url(url, path=False)


def deadline(interval: float) -> float:
    """The whole request's time limit: at most LONGEST_REQUEST and half the interval."""
    return min(LONGEST_REQUEST, interval / 2)


def why_unhealthy(sessions: sessionmaker[Session], config: Config, now: float) -> list[str]:
    """What stands in the way of a beat now (empty: beat)."""
    reasons = []
    try:
        with sessions() as session:
            checks = {c.job: c for c in check_jobs(session, config, now)}
    except Exception as error:  # an unreadable database is a reason, not a crash
        return [f"the database cannot be read ({type(error).__name__})"]
    for job in WATCHED:
        check = checks.get(job)
        if check is None or check.last_success_at is None:
            reasons.append(f"the {job} job has not succeeded yet")
        elif not check.ok:
            reasons.append(f"the {job} job is {check.problem}")
    for job in WATCHED_IF_RUN:
        if job in checks and not checks[job].ok:
            reasons.append(f"the {job} job is {checks[job].problem}")
    if not reasons:
        problem = check_write(sessions, JOB, now)
        if problem is not None:
            reasons.append(f"the database cannot be written ({problem})")
    return reasons


def beat(url: str, seconds: float) -> int:
    """GET `url` within `seconds` in all; return the status code. Raise HeartbeatFailed
    (without the URL) on no answer or an answer that is not 2xx."""

    async def request() -> int:
        async with httpx.AsyncClient(timeout=seconds, follow_redirects=True) as client:
            response = await client.get(url)
            return response.status_code

    try:
        status = asyncio.run(asyncio.wait_for(request(), seconds))
    except TimeoutError:
        raise HeartbeatFailed(f"no answer from {redacted(url)} within {seconds:g}s") from None
    except httpx.HTTPError as error:
        raise HeartbeatFailed(f"{redacted(url)}: {type(error).__name__}") from None
    if not 200 <= status < 300:
        raise HeartbeatFailed(f"{redacted(url)} answered {status}")
    return status


def heartbeat_job(config: Config, sessions: sessionmaker[Session], clock: Clock) -> int:
    """One beat if kneepoint is healthy now; return the receiver's status code. Raise
    HeartbeatSkipped (why) when it is not, HeartbeatFailed when the receiver did not take
    it: either way the scheduler records the reason in job_health."""
    if config.heartbeat is None:
        raise HeartbeatSkipped("no heartbeat is configured")
    reasons = why_unhealthy(sessions, config, clock())
    if reasons:
        message = "; ".join(reasons)
        log.warning("heartbeat skipped: %s", message)
        raise HeartbeatSkipped(message)
    status = beat(config.heartbeat.url.reveal(), deadline(config.heartbeat.interval))
    log.debug("heartbeat to %s: %d", config.heartbeat.url, status)
    return status
