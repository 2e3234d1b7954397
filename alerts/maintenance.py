"""Maintenance windows (`maintenance:` in the config): when they last, whom they cover, and the
time they take out of a range.

A one-off window lasts from `start` to `end`; a recurring one starts at every time its `cron`
line (five fields, UTC, read by APScheduler's CronTrigger) names and lasts `duration`, so a
window starting at 23:30 with a 2h duration runs to 01:30 the next day. Windows are
half-open, [start, end): a window ending at 02:00 no longer covers 02:00.

While a window covers a replica (its `replicas`, or every replica when it names none), the
replica's alerts are still evaluated and their states stored, but nothing is sent for them;
fleet-wide alerts (the SLO burn rates) are muted only by a window over every replica. Its time
is left out of every SLO's budget and burn rates (alerts/evaluate.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from apscheduler.triggers.cron import CronTrigger

from kneepoint.config import Maintenance

Interval = tuple[float, float]


@dataclass(frozen=True)
class Occurrence:
    """One time a window lasts."""

    name: str
    start: float
    end: float
    replicas: tuple[str, ...]  # empty: every replica

    def covers(self, replica: str) -> bool:
        """Does it cover this replica ("" is the fleet: only a window over every replica)?"""
        return not self.replicas or (bool(replica) and replica in self.replicas)

    def active(self, now: float) -> bool:
        return self.start <= now < self.end


def occurrences(windows: Sequence[Maintenance], since: float, until: float) -> list[Occurrence]:
    """Every occurrence of the windows that overlaps [since, until), by start."""
    found: list[Occurrence] = []
    for window in windows:
        replicas = tuple(window.replicas)
        if window.start is not None and window.end is not None:
            start, end = window.start.timestamp(), window.end.timestamp()
            if start < until and end > since:
                found.append(Occurrence(window.name, start, end, replicas))
            continue
        assert window.cron is not None and window.duration is not None  # config checked it
        for start in _fire_times(window.cron, since - window.duration, until):
            if start + window.duration > since:
                found.append(Occurrence(window.name, start, start + window.duration, replicas))
    return sorted(found, key=lambda o: (o.start, o.name))


def _fire_times(cron: str, since: float, until: float) -> Iterable[float]:
    """The cron line's times in (since, until)."""
    trigger = CronTrigger.from_crontab(cron, timezone=UTC)
    moment: datetime | None = trigger.get_next_fire_time(
        None, datetime.fromtimestamp(since, UTC) + timedelta(microseconds=1)
    )
    while moment is not None and moment.timestamp() < until:
        yield moment.timestamp()
        moment = trigger.get_next_fire_time(moment, moment)


def active(windows: Sequence[Maintenance], now: float) -> list[Occurrence]:
    """The occurrences lasting now."""
    return [o for o in occurrences(windows, now, now + 1e-6) if o.active(now)]


def next_one(
    windows: Sequence[Maintenance], now: float, horizon: float = 400 * 86400.0
) -> Occurrence | None:
    """The next occurrence to start after now (within a year or so), or None."""
    later = [o for o in occurrences(windows, now, now + horizon) if o.start > now]
    return later[0] if later else None


def covering(windows: Sequence[Maintenance], replica: str, now: float) -> Occurrence | None:
    """The window that mutes this replica's alerts now ("" is the fleet), or None."""
    return next((o for o in active(windows, now) if o.covers(replica)), None)


def excluded(
    windows: Sequence[Maintenance], replica: str, since: float, until: float
) -> list[Interval]:
    """The stretches of [since, until) a window covers for this replica, merged."""
    return merge(
        (max(o.start, since), min(o.end, until))
        for o in occurrences(windows, since, until)
        if o.covers(replica)
    )


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Overlapping or touching intervals joined, in order; empty ones dropped."""
    out: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def remaining(since: float, until: float, cut: Sequence[Interval]) -> list[Interval]:
    """[since, until) without the (merged, ordered) intervals `cut`."""
    out: list[Interval] = []
    at = since
    for start, end in cut:
        if start > at:
            out.append((at, min(start, until)))
        at = max(at, end)
        if at >= until:
            break
    if at < until:
        out.append((at, until))
    return [(a, b) for a, b in out if b > a]


def overlap(intervals: Sequence[Interval], since: float, until: float) -> float:
    """Seconds of the (merged) intervals within [since, until)."""
    return sum(max(0.0, min(b, until) - max(a, since)) for a, b in intervals)
