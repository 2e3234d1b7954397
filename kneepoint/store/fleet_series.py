"""A fleet chart's data computed by the database (issue 25): never every replica's series in
Python.

At fleet size a chart draws the fleet's median and bad-side tail per time bucket, the worst
few series and the sidebar's chosen ones (dashboards/charts.py fleet_figure). Here the
database computes, from exactly the rows queries.replica_frame (or gpu_frame) reads through
the summary tiers: each row's value as kneepoint/series.py computes it (a gauge as stored; a
counter's increase over the seconds since the series' previous row, a fall being a reset
whose new value is the increase; a ratio of two counters' increases), each series' mean per
bucket, then across series per bucket the median and the tail quantile (linear
interpolation between the two ranks around q·(n−1), as pandas' `quantile`; window functions,
one SQL text on SQLite and PostgreSQL), and each series' mean over the range. Only those
(one row per bucket and one per series) come back, then the rows of the few series drawn as
their own lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import pandas as pd
from sqlalchemy import (
    ColumnElement,
    Float,
    Integer,
    Table,
    case,
    cast,
    func,
    literal,
    select,
    union_all,
)
from sqlalchemy.orm import Session

from kneepoint.distribution import (
    MEDIAN,
    WORST,
    Fleet,
    Worse,
    ranked_worst,
    tail_name,
    tail_quantile,
    width_for,
)
from kneepoint.series import COLUMNS as SERIES_COLUMNS
from kneepoint.series import SERIES, gpu_series, replica_series
from kneepoint.series import resample as resampled
from kneepoint.store import queries
from kneepoint.store.models import RAW, GpuRow

Kind = Literal["gauge", "rate", "ratio"]


class Metric(NamedTuple):
    """How a chart's column is computed from stored columns, as kneepoint/series.py does:
    a gauge as stored, a counter's per-second rate, or a ratio of two counters' increases
    (no value where the second did not increase)."""

    kind: Kind
    columns: tuple[str, ...]
    resample: int = 0  # seconds: a ratio of the increases summed per interval first


# The replica chart columns (kneepoint/series.py SERIES_COLUMNS) a fleet chart may draw.
REPLICA_METRICS: dict[str, Metric] = {
    **{
        column: Metric("rate" if is_counter else "gauge", (stored,))
        for column, (stored, is_counter) in SERIES.items()
    },
    "hit_rate": Metric("ratio", ("prefix_cache_hits", "prefix_cache_queries")),
    "spec_acceptance": Metric("ratio", ("spec_decode_accepted_tokens", "spec_decode_draft_tokens")),
}
# The columns kneepoint/series.py `resample` recomputes from summed increases: a ratio of
# two counters' increases, or of one's to the seconds ("ts": its increase is the seconds).
RESAMPLED: dict[str, Metric] = {
    "hit_rate": REPLICA_METRICS["hit_rate"],
    "computed_prompt_tokens_per_second": Metric("ratio", ("prompt_tokens_local_compute", "ts")),
}
# GPU readings are gauges, charted as stored (kneepoint/series.py gpu_series).
GPU_COLUMNS = ("utilization", "gr_engine_active", "dram_active", "power_watts", "temperature_c")


class Source(NamedTuple):
    samples: Table
    rollups: Table
    key: str


REPLICAS = Source(queries.REPLICA_SAMPLES, queries.REPLICA_ROLLUPS, "target_id")
GPUS = Source(queries.GPU_SAMPLES, queries.GPU_ROLLUPS, "gpu_id")


def replica_fleet(
    session: Session,
    start: float,
    end: float,
    column: str,
    scrape_interval: float,
    worse: Worse = "higher",
    chosen: Sequence[str] = (),
    k: int = WORST,
    resample: int = 0,
) -> Fleet:
    """The fleet chart of replica series `column` (REPLICA_METRICS) over [start, end]: the
    rows read are replica_frame's; the rows drawn are those of the `k` worst and `chosen`.
    With `resample` seconds, of each replica's series resampled first as
    kneepoint/series.py `resample` does (a ratio or rate of the increases summed per
    interval; RESAMPLED: those it recomputes)."""
    names = {row.id: name for name, row in queries.targets(session).items()}
    metric = REPLICA_METRICS[column]
    if resample:
        metric = RESAMPLED[column]._replace(resample=resample)
    fleet, ids = _fleet(
        session, REPLICAS, names, start, end, metric, scrape_interval, worse, k, chosen
    )
    if not ids:
        return fleet._replace(rows=pd.DataFrame({"time": [], "replica": [], column: []}))
    frame = queries.replica_frame(session, start, end, target_ids=ids, columns=SERIES_COLUMNS)
    rows = replica_series(frame, names)
    if resample:
        rows = resampled(rows, f"{resample}s")
    return fleet._replace(rows=rows[["time", "replica", column]])


def gpu_fleet(
    session: Session,
    start: float,
    end: float,
    column: str,
    scrape_interval: float,
    worse: Worse = "higher",
    chosen: Sequence[str] = (),
    k: int = WORST,
) -> Fleet:
    """The fleet chart of GPU reading `column` (GPU_COLUMNS) over [start, end], the GPUs
    named "host/index" as gpu_series names them; the rows read are gpu_frame's."""
    if column not in GPU_COLUMNS:
        raise ValueError(f"not a GPU gauge: {column}")
    identity = queries.read_frame(
        session, select(GpuRow.id.label("gpu_id"), GpuRow.host, GpuRow.gpu_index)
    )
    names = {
        int(i): f"{host}/{index}"
        for i, host, index in zip(identity.gpu_id, identity.host, identity.gpu_index, strict=True)
    }
    fleet, ids = _fleet(
        session, GPUS, names, start, end, Metric("gauge", (column,)), scrape_interval, worse, k,
        chosen,
    )  # fmt: skip
    if not ids:
        return fleet._replace(rows=pd.DataFrame({"time": [], "gpu": [], column: []}))
    wanted = list(dict.fromkeys([column, "power_watts"]))  # gpu_series reads power
    readings = queries._tiered(
        session, GPUS.samples, GPUS.rollups, GPUS.key, ids, start, end, wanted, None
    )
    frame = identity.merge(readings, on="gpu_id", how="inner", sort=False)
    rows = gpu_series(frame.sort_values(["gpu_id", "ts"], kind="stable", ignore_index=True))
    return fleet._replace(rows=rows[["time", "gpu", column]])


def _fleet(
    session: Session,
    source: Source,
    names: dict[int, str],
    start: float,
    end: float,
    metric: Metric,
    scrape_interval: float,
    worse: Worse,
    k: int,
    chosen: Sequence[str],
) -> tuple[Fleet, list[int]]:
    """The distribution and the worst (rows left empty), and the keys whose rows to draw."""
    coarsest = queries.coarsest_for(end - start)
    reach = queries.reach(session, source.rollups) if coarsest else {}
    pieces = queries.plan(start, end, reach, coarsest)
    every = max(spacing(pieces, scrape_interval), pd.Timedelta(seconds=metric.resample))
    width = width_for(pd.Timedelta(seconds=end - start), every)
    query = fleet_query(session, source, list(names), start, end, metric, pieces, width, worse)
    found = queries.read_frame(session, query)
    buckets = found[found.kind == "bucket"].sort_values("bucket")
    tail = tail_name(worse)
    spread = pd.DataFrame(
        {
            "time": pd.to_datetime(buckets["bucket"].astype(float), unit="s", utc=True),
            MEDIAN: buckets["median"].astype(float),
            tail: buckets["tail"].astype(float),
        }
    ).reset_index(drop=True)
    series = found[found.kind == "series"]
    means = pd.Series(
        series["median"].astype(float).to_numpy(),
        index=[names.get(int(key), str(int(key))) for key in series["key"]],
    )
    named = ranked_worst(means, worse, k)
    drawn = set(named) | set(chosen)
    ids = sorted(key for key, name in names.items() if name in drawn)
    fleet = Fleet(size=int(means.notna().sum()), spread=spread, worst=named, rows=pd.DataFrame())
    return fleet, ids


def spacing(pieces: list[queries.Piece], scrape_interval: float) -> pd.Timedelta:
    """A series' sample spacing, known without reading rows: the resolution of the piece
    that covers most of the range (a summary tier's), or the scrape interval for samples."""
    if not pieces:
        return pd.Timedelta(seconds=scrape_interval)
    _, _, resolution = max(pieces, key=lambda p: p[1] - p[0])
    return pd.Timedelta(
        seconds=max(float(resolution), scrape_interval) if resolution != RAW else scrape_interval
    )


def fleet_query(
    session: Session,
    source: Source,
    keys: list[int],
    start: float,
    end: float,
    metric: Metric,
    pieces: list[queries.Piece],
    width: pd.Timedelta,
    worse: Worse,
) -> Any:
    """One statement: rows `kind` "bucket" (`bucket` start in seconds, `median`, `tail`)
    and "series" (`key`, its mean over the range in `median`; NULL where it has no value)."""
    key = source.key
    stored = [c for c in metric.columns if c != "ts"]
    rows = queries._range_rows(
        source.samples, source.rollups, key, keys, start, end, stored, pieces
    )
    seconds = max(1, int(width.total_seconds()))
    if metric.resample:
        intervals = _intervals(session, rows, key, metric)
        at, value = intervals.c.at, intervals.c.v
        keyed = intervals.c[key]
    else:
        at, value, keyed = rows.c.ts, _value(rows, key, metric), rows.c[key]
    values = select(
        keyed.label("key"),
        queries._bucket_of(session, at, seconds).label("bucket"),
        value.label("v"),
    ).subquery("values")
    per = (
        select(
            values.c.key,
            values.c.bucket,
            func.avg(values.c.v).label("v"),
            func.sum(values.c.v).label("s"),
            func.count(values.c.v).label("c"),
        )
        .group_by(values.c.key, values.c.bucket)
        .cte("per")
    )
    ranked = (
        select(
            per.c.bucket,
            per.c.v,
            func.row_number().over(partition_by=per.c.bucket, order_by=per.c.v).label("rn"),
            func.count().over(partition_by=per.c.bucket).label("n"),
        )
        .where(per.c.v.is_not(None))
        .subquery("ranked")
    )
    buckets = select(
        literal("bucket").label("kind"),
        ranked.c.bucket.label("bucket"),
        literal(None, Float).label("key"),
        _quantile(session, ranked, 0.5).label("median"),
        _quantile(session, ranked, tail_quantile(worse)).label("tail"),
    ).group_by(ranked.c.bucket)
    means = select(
        literal("series").label("kind"),
        literal(None, Float).label("bucket"),
        per.c.key.label("key"),
        # sum / count of every value: pandas' mean of the series' rows (NULL: no value).
        (func.sum(per.c.s) / cast(func.sum(per.c.c), Float)).label("median"),
        literal(None, Float).label("tail"),
    ).group_by(per.c.key)
    return union_all(buckets, means)


def _value(rows: Any, key: str, metric: Metric) -> ColumnElement[Any]:
    """A row's value as kneepoint/series.py replica_series computes it."""
    order = {"partition_by": rows.c[key], "order_by": rows.c.ts}
    if metric.kind == "gauge":
        return rows.c[metric.columns[0]]

    def increase(column: str) -> ColumnElement[Any]:
        step = rows.c[column] - func.lag(rows.c[column]).over(**order)
        return case((step < 0, rows.c[column]), else_=step)

    if metric.kind == "rate":
        return increase(metric.columns[0]) / (rows.c.ts - func.lag(rows.c.ts).over(**order))
    part, whole = (increase(c) for c in metric.columns)
    return case((whole > 0, part / whole))


def _intervals(session: Session, rows: Any, key: str, metric: Metric) -> Any:
    """Each key's `metric.resample`-second intervals (`at`, their start), as
    kneepoint/series.py `resample` computes them: the ratio of the increases summed over
    the interval (a sum of no value is 0), none where the second sums to 0 or less."""
    order = {"partition_by": rows.c[key], "order_by": rows.c.ts}

    def increase(column: str) -> ColumnElement[Any]:
        step = rows.c[column] - func.lag(rows.c[column]).over(**order)
        return case((step < 0, rows.c[column]), else_=step)

    part, whole = metric.columns
    steps = select(
        rows.c[key],
        queries._bucket_of(session, rows.c.ts, metric.resample).label("at"),
        increase(part).label("part"),
        increase(whole).label("whole"),
    ).subquery("steps")
    summed = func.coalesce(func.sum(steps.c.whole), 0.0)
    ratio = case((summed > 0, func.coalesce(func.sum(steps.c.part), 0.0) / summed))
    return (
        select(steps.c[key], steps.c.at, ratio.label("v"))
        .group_by(steps.c[key], steps.c.at)
        .subquery("intervals")
    )


def _quantile(session: Session, ranked: Any, q: float) -> ColumnElement[Any]:
    """The `q` quantile of a bucket's values, interpolated linearly between the values
    ranked floor(q·(n−1)) and the next (0-based), as pandas' quantile."""
    position = q * (ranked.c.n - 1)
    low = _floor(session, position)
    at_low = func.max(case((ranked.c.rn - 1 == low, ranked.c.v)))
    at_next = func.max(case((ranked.c.rn - 1 == low + 1, ranked.c.v)))
    fraction = func.max(position - low)
    return at_low + fraction * (func.coalesce(at_next, at_low) - at_low)


def _floor(session: Session, value: Any) -> Any:
    """floor() on each database: SQLite has it only when built with its math functions
    (and `value` is never negative here, so CAST's truncation is the floor)."""
    if session.get_bind().dialect.name == "postgresql":
        return func.floor(value)
    return cast(value, Integer)
