"""Headroom forecast: when does each replica's daily peak concurrency reach its knee?

Per replica and UTC day, the peak of requests running + waiting. Running alone cannot grow
past `--max-num-seqs` (a replica whose demand outgrew its cap would show a flat peak and
never cross), while a sweep's concurrency (the knee's scale) counts every request the
clients have in flight, queued or scheduled: running + waiting is that same number on the
server. Summary rows carry each gauge's peak over their bucket; their two peaks are added,
which can overstate a bucket where they were moments apart.

A least-squares line through the daily peaks gives the growth per day and its standard
error. A date is given only when the growth is positive and significant (one-sided t-test at
`CONFIDENCE`), there are at least `MIN_DAYS` days, the replica has a knee and the crossing
lies within `HORIZON_DAYS`; its range comes from the slope ± t × standard error (the line
pivoting on the days' mean), so a noisier history gives a wider range. Otherwise the verdict
says why there is no date."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd
from scipy import stats
from sqlalchemy import select
from sqlalchemy.orm import Session

from kneepoint.config import Config
from kneepoint.knee.detect import assess, knee_for_replica
from kneepoint.store import queries
from kneepoint.store.models import TargetRow
from kneepoint.store.runs import load_runs

DAY = 86400.0
HISTORY_DAYS = 28  # how far back the trend looks
# A week at least: weekday and weekend peaks differ, and a line through less than one cycle
# takes the weekend for a fall (or Monday for growth).
MIN_DAYS = 7
MIN_HOURS = 12  # a day counts once it has samples in this many hours (else its peak is low)
CONFIDENCE = 0.95  # one-sided: the growth must be positive at this confidence
HORIZON_DAYS = 365  # no date further out than this: a month of history says nothing about it

# Verdicts: why there is, or is not, a date.
CROSSES = "crosses"  # growing significantly: a date, with a range
PAST = "past"  # the latest day's peak (or the trend) is at or past the knee already
NO_KNEE = "no_knee"  # no stored run gives this replica a knee
TOO_FEW_DAYS = "too_few_days"
FLAT = "flat"  # no significant trend either way
FALLING = "falling"  # significantly falling
BEYOND = "beyond_horizon"  # growing, but the crossing is over HORIZON_DAYS away


@dataclass(frozen=True)
class Forecast:
    replica: str
    days: tuple[float, ...]  # each day's UTC midnight, epoch seconds
    peaks: tuple[float, ...]  # that day's peak of running + waiting requests
    knee: int | None
    verdict: str
    slope_per_day: float | None = None  # growth of the daily peak, requests per day
    slope_stderr: float | None = None
    crossing: float | None = None  # the day the fitted line reaches the knee (epoch seconds)
    earliest: float | None = None  # at the slope's upper bound
    latest: float | None = None  # at the slope's lower bound
    note: str = ""  # one sentence with the numbers

    @property
    def headroom(self) -> float | None:
        """The knee minus the latest day's peak (negative: past it)."""
        if self.knee is None or not self.peaks:
            return None
        return self.knee - self.peaks[-1]

    def as_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "knee": self.knee,
            "verdict": self.verdict,
            "latest_peak": self.peaks[-1] if self.peaks else None,
            "days": len(self.days),
            "slope_per_day": self.slope_per_day,
            "slope_stderr": self.slope_stderr,
            "crossing": _date(self.crossing),
            "earliest": _date(self.earliest),
            "latest": _date(self.latest),
            "note": self.note,
        }


def _date(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


def trend(
    replica: str,
    days: list[float] | tuple[float, ...],
    peaks: list[float] | tuple[float, ...],
    knee: int | None,
    min_days: int = MIN_DAYS,
    confidence: float = CONFIDENCE,
) -> Forecast:
    """The forecast from daily peaks (`days`: each day's start, epoch seconds, ascending)."""
    days, peaks = tuple(float(d) for d in days), tuple(float(p) for p in peaks)
    base = Forecast(replica, days, peaks, knee, TOO_FEW_DAYS)
    n = len(days)
    if n < min_days:
        return _with(base, TOO_FEW_DAYS, f"{n} day(s) of history, {min_days} needed for a trend")
    xs = [(d - days[0]) / DAY for d in days]
    x_mean, y_mean = sum(xs) / n, sum(peaks) / n
    sxx = sum((x - x_mean) ** 2 for x in xs)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, peaks, strict=True)) / sxx
    residuals = [y - (y_mean + slope * (x - x_mean)) for x, y in zip(xs, peaks, strict=True)]
    stderr = math.sqrt(sum(r * r for r in residuals) / (n - 2) / sxx)
    critical = float(stats.t.ppf(confidence, n - 2))
    t = math.inf if stderr == 0 and slope > 0 else (slope / stderr if stderr > 0 else 0.0)
    base = Forecast(replica, days, peaks, knee, TOO_FEW_DAYS, slope, stderr)
    growth = f"{slope:+.2f} ± {stderr:.2f} requests/day over {n} days"
    if knee is not None and peaks[-1] >= knee:
        return _with(
            base, PAST, f"peak {peaks[-1]:.0f} on the latest day, at or past the knee {knee}"
        )
    if t <= -critical:
        return _with(base, FALLING, f"daily peak falling ({growth}): no crossing")
    if t < critical:
        return _with(base, FLAT, f"no significant trend ({growth}): no date")
    if knee is None:
        return _with(base, NO_KNEE, f"daily peak growing ({growth}); no knee to reach")
    crossing_x = x_mean + (knee - y_mean) / slope
    last_x = xs[-1]
    if crossing_x <= last_x:
        return _with(base, PAST, f"the trend ({growth}) is at the knee {knee} already")
    if crossing_x - last_x > HORIZON_DAYS:
        return _with(
            base, BEYOND, f"growing ({growth}) but over {HORIZON_DAYS} days from the knee {knee}"
        )
    high, low = slope + critical * stderr, slope - critical * stderr  # low > 0: significant
    earliest_x = x_mean + (knee - y_mean) / high
    latest_x = x_mean + (knee - y_mean) / low
    at = days[0] + crossing_x * DAY
    earliest = days[0] + max(earliest_x, last_x) * DAY
    latest = days[0] + latest_x * DAY
    return Forecast(
        replica,
        days,
        peaks,
        knee,
        CROSSES,
        slope,
        stderr,
        at,
        earliest,
        latest,
        f"daily peak {peaks[-1]:.0f} growing {growth}: reaches the knee {knee} about "
        f"{_date(at)} (between {_date(earliest)} and {_date(latest)})",
    )


def _with(forecast: Forecast, verdict: str, note: str) -> Forecast:
    return Forecast(
        forecast.replica,
        forecast.days,
        forecast.peaks,
        forecast.knee,
        verdict,
        forecast.slope_per_day,
        forecast.slope_stderr,
        note=note,
    )


def daily_peaks(rows: pd.DataFrame, end: float) -> tuple[list[float], list[float]]:
    """Each whole UTC day before `end`'s day with samples in at least MIN_HOURS hours: its
    start and its peak of running + waiting. `rows`: one replica's ts, requests_running,
    requests_waiting and, where stored, their `_peak` columns."""
    if rows.empty:
        return [], []
    today = math.floor(end / DAY) * DAY
    frame = rows[rows.ts.astype(float) < today]
    if frame.empty:
        return [], []

    def gauge(name: str) -> pd.Series:
        values = frame[name].astype(float)
        peak = f"{name}_peak"
        return frame[peak].astype(float).fillna(values) if peak in frame else values

    running, waiting = gauge("requests_running"), gauge("requests_waiting")
    concurrency = running + waiting.fillna(0.0)
    ts = frame.ts.astype(float)
    table = pd.DataFrame(
        {"day": (ts // DAY) * DAY, "hour": ts // 3600, "concurrency": concurrency}
    ).dropna(subset=["concurrency"])
    days, peaks = [], []
    for day, group in table.groupby("day", sort=True):
        if group.hour.nunique() >= MIN_HOURS:
            days.append(float(day))  # type: ignore[arg-type]
            peaks.append(float(group.concurrency.max()))
    return days, peaks


def forecasts(
    session: Session, config: Config, now: float, history_days: int = HISTORY_DAYS
) -> list[Forecast]:
    """Every engine replica's forecast from the stored history before today (UTC)."""
    today = math.floor(now / DAY) * DAY
    start = today - history_days * DAY
    assessments = [assess(run, config.slos) for run in load_runs(session)]
    out = []
    targets = session.scalars(
        select(TargetRow).where(TargetRow.kind != "dcgm").order_by(TargetRow.name)
    ).all()
    if not targets:
        return []
    frame = queries.replica_frame(
        session,
        start,
        today,
        [t.id for t in targets],
        [
            "requests_running",
            "requests_running_peak",
            "requests_waiting",
            "requests_waiting_peak",
        ],
    )
    by_target = dict(iter(frame.groupby("target_id", sort=False))) if len(frame) else {}
    for target in targets:
        days, peaks = daily_peaks(by_target.get(target.id, frame.iloc[0:0]), now)
        models = json.loads(target.model_names) if target.model_names else []
        knee = knee_for_replica(target.name, models, assessments)
        out.append(trend(target.name, days, peaks, knee.knee_concurrency if knee else None))
    return out
