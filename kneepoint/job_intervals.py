"""How often each of the collector's interval jobs runs, from the config alone: the one home
of these intervals. The scheduler installs its jobs with them (collectors/jobs.py) and
the health check judges a job overdue by them (kneepoint/health.py), so the health check
needs no scheduler and the two cannot disagree. The weekly report runs on a crontab line
(`report.schedule`), not an interval: it is not here."""

from __future__ import annotations

from kneepoint.config import Config

ROLLUP_EVERY = 300.0
DELIVER_EVERY = 5.0  # seconds between delivery rounds of the outbox
# A collector beats its membership this many times per lease (collectors/cluster.py), so a
# live one is never taken for gone over one late beat.
BEATS_PER_LEASE = 3


def beat_every(lease: float) -> float:
    """Seconds between a collector's membership beats."""
    return lease / BEATS_PER_LEASE


def job_intervals(config: Config) -> dict[str, float]:
    """Seconds between runs of each interval job, by job name (the scheduler's job ids)."""
    every = {
        "scrape": config.scrape_interval,
        "cluster": beat_every(config.collector.lease),
        "rollup": ROLLUP_EVERY,
        "alerts": config.evaluation_interval,
        "deliver": DELIVER_EVERY,
    }
    if config.heartbeat is not None:  # the dead-man's switch: collectors/heartbeat.py
        every["heartbeat"] = config.heartbeat.interval
    return every
