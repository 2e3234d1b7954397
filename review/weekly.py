"""The weekly capacity review's numbers: per replica and fleet, this week against last week,
from the kernel the pages and `kneepoint status` use (views.build_view), so none can differ."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from sqlalchemy.orm import Session

from alerts.evaluate import slo_reports
from alerts.slo import Report as SloReport
from kneepoint import catalogue
from kneepoint.config import Config
from kneepoint.derived import details, saturation
from kneepoint.derived.latency import histogram_quantile, window_histogram
from kneepoint.forecast import Forecast
from kneepoint.knee.detect import assess, knee_for_replica
from kneepoint.store import queries
from kneepoint.store.runs import load_runs
from kneepoint.timeline import Event
from kneepoint.views import View, build_view

# What the report shows per replica: key, label, unit ("%" for fractions), and what it means;
# and the numbers it copies from the status's replica and from the page view's rows
# (kneepoint/catalogue.py).
ROWS: tuple[tuple[str, str, str, str], ...] = catalogue.weekly_rows()
REPLICA_KEYS = catalogue.weekly_keys("status")
VIEW_KEYS = catalogue.weekly_keys("view")


@dataclass
class Period:
    start: float
    end: float
    view: View
    replicas: dict[str, dict[str, Any]]
    fleet: dict[str, Any]
    slos: list[SloReport]
    intervals: dict[str, pd.DataFrame] = field(default_factory=dict)  # per replica, hourly


@dataclass
class WeeklyReport:
    generated_at: float
    since: float
    this: Period
    last: Period
    recommendations: list[Any] = field(default_factory=list)  # recommend.Recommendation
    forecasts: list[Forecast] = field(default_factory=list)  # headroom: daily peaks vs knee
    changes: list[Event] = field(default_factory=list)  # this week's timeline: chart markers


def period(session: Session, config: Config, end: float, window: float) -> Period:
    view = build_view(session, config, end, window, series=True)  # p95 occupancy, charts
    assessments = [assess(run, config.slos) for run in load_runs(session)]
    targets = queries.targets(session)
    replicas: dict[str, dict[str, Any]] = {}
    # Each replica's chart points found once (a comparison over every replica's points per
    # replica is a million steps at 1,000 replicas).
    points = view.series[["replica", "kv_cache_occupancy", "requests_running"]]
    by_replica = dict(iter(points.groupby("replica", sort=False))) if len(points) else {}
    for replica in view.status["replicas"]:
        name = replica["name"]
        page_row: Mapping[str, Any] = view.rows.get(name, {})  # read by the review's keys
        numbers = {key: replica.get(key) for key in REPLICA_KEYS}
        numbers.update({key: page_row.get(key) for key in VIEW_KEYS})
        own = by_replica.get(name, points.iloc[:0])
        occupancy = own["kv_cache_occupancy"].dropna()
        numbers["p95_kv_occupancy"] = float(occupancy.quantile(0.95)) if len(occupancy) else None
        running = own["requests_running"].dropna()
        numbers["running_at_cap_share"] = (
            float((running >= 0.95 * running.max()).mean())
            if len(running) and running.max() > 0
            else None
        )
        queue = page_row.get("queue_seconds") or {}
        numbers["queue_p99_seconds"] = queue.get("p99")
        knee = knee_for_replica(name, replica["model_names"] or [], assessments)
        numbers["knee_concurrency"] = knee.knee_concurrency if knee else None
        peak = numbers["peak_running"]
        numbers["headroom"] = (
            None if knee is None or peak is None else knee.knee_concurrency - peak  # type: ignore[operator]
        )
        numbers["itl_p99_seconds"] = (replica.get("itl_seconds") or {}).get("p99")
        numbers["ttft_p99_seconds"] = (replica.get("ttft_seconds") or {}).get("p99")
        # The week's saturation verdict in words: its reasons, "no", or None (not judged).
        numbers["replica_saturated"] = saturation.labels(replica["saturation"])
        replicas[name] = numbers
    rates = {name: numbers["prefix_cache_hit_rate"] for name, numbers in replicas.items()}
    # The fleet's status gives the same numbers the review copies from each replica's.
    fleet = {key: view.status["fleet"].get(key) for key in REPLICA_KEYS}
    fleet["hit_rate_divergence"] = details.divergence(rates)
    saturated = view.status["fleet"]["saturated_replicas"]
    fleet["replica_saturated"] = (
        None if saturated is None else f"{saturated} of {len(view.status['replicas'])} replicas"
    )
    result = Period(end - window, end, view, replicas, fleet, slo_reports(session, config, end))
    ids = {name: row.id for name, row in targets.items() if name in replicas}
    # One read for every replica (it was one query each: 1,000 a period at fleet size).
    frame = queries.replica_frame(
        session, end - window, end, list(ids.values()), columns=INTERVAL_COLUMNS
    )
    layouts = queries.histogram_layouts(session)
    mine = dict(iter(frame.groupby("target_id", sort=False))) if len(frame) else {}
    for name, target_id in ids.items():
        rows = mine.get(target_id, frame.iloc[:0])
        result.intervals[name] = _intervals(rows.reset_index(drop=True), layouts)
    return result


INTERVAL_COLUMNS = ("hist_itl", "request_prompt_tokens_sum", "request_prompt_tokens_count")


def intervals(session: Session, target_id: int, start: float, end: float) -> pd.DataFrame:
    """Per stored interval of one replica: its mean prompt length and its ITL p99 (from the
    histogram's increase), the evidence for an admission cap on prompt length."""
    frame = queries.replica_frame(session, start, end, [target_id], columns=INTERVAL_COLUMNS)
    return _intervals(frame, queries.histogram_layouts(session))


def _intervals(frame: pd.DataFrame, layouts: dict[int, tuple[float, ...]]) -> pd.DataFrame:
    """`intervals` from one replica's rows (replica_frame's, in time order)."""
    if len(frame) < 2:
        return pd.DataFrame(columns=["ts", "mean_prompt_tokens", "itl_p99_seconds"])
    itl = queries.histograms(frame.hist_itl, layouts)
    # Plain lists, not `.iloc` per row: at 1,000 replicas × a week that indexing was most of
    # the review's time (157 of 307 s in a profile); the arithmetic is the same floats.
    times = frame.ts.tolist()
    counts = frame.request_prompt_tokens_count.tolist()
    sums = frame.request_prompt_tokens_sum.tolist()
    rows = []
    for index in range(1, len(frame)):
        count = counts[index] - counts[index - 1]
        tokens = sums[index] - sums[index - 1]
        histogram = window_histogram([itl[index - 1], itl[index]])
        rows.append(
            {
                "ts": float(times[index]),
                "mean_prompt_tokens": tokens / count
                if count and count > 0 and tokens >= 0
                else None,
                "itl_p99_seconds": histogram_quantile(0.99, histogram),
            }
        )
    return pd.DataFrame(rows)
