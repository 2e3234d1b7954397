"""A fleet's distribution over time, the data of a chart at fleet size, pure pandas: the
median and the bad-side tail across series per time bucket, and the worst series. The
database computes the same at fleet size (kneepoint/store/fleet_series.py); the chart
draws it (dashboards/charts.py). Kept out of the drawing module so the store never imports
Plotly."""

from __future__ import annotations

from typing import Literal, NamedTuple

import pandas as pd

# Above this many series (replicas, GPUs) a chart draws the fleet's distribution, and pages
# show one paged table instead of a block of tiles per replica (app/screens): at 300 replicas
# one trace (and one tile block) per replica kept Chromium's renderer busy for minutes.
FLEET_THRESHOLD = 8
WORST = 3  # the worst series named in a fleet chart, by the metric's direction over the range
CHOSEN_LIMIT = 12  # the sidebar's replicas drawn as their own lines, at most
MAX_POINTS = 300  # time buckets of a fleet chart, at most
# Bucket widths, the narrowest that keeps MAX_POINTS and holds a series' sample spacing.
BUCKETS = tuple(
    pd.Timedelta(w)
    for w in ("1s", "5s", "15s", "30s", "1min", "5min", "15min", "30min", "1h", "3h", "6h", "1D")
)
MEDIAN = "fleet median"
WORST_PREFIX = "worst: "

Worse = Literal["higher", "lower"]


def tail_name(worse: Worse) -> str:
    """The quantile on the bad side: p95 where high is bad, p5 where low is."""
    return "fleet p95" if worse == "higher" else "fleet p5"


class Fleet(NamedTuple):
    """A fleet chart's data, computed before drawing (the database computes it at fleet
    size: kneepoint/store/fleet_series.py): how many series it sums up (those with a
    value), the distribution per bucket (`time`, MEDIAN and the tail, as `distribution`
    gives it), the worst series' names, worst first, and the rows (`time`, the series'
    name column, the value) of the series drawn as their own lines (worst and chosen)."""

    size: int
    spread: pd.DataFrame
    worst: list[str]
    rows: pd.DataFrame


def width_for(span: pd.Timedelta, spacing: pd.Timedelta | None) -> pd.Timedelta:
    """The narrowest of BUCKETS that gives at most MAX_POINTS buckets over `span` and is no
    narrower than a series' sample `spacing` (when known)."""
    least = span / MAX_POINTS
    if spacing is not None and pd.notna(spacing):
        least = max(least, pd.Timedelta(spacing))
    return next((w for w in BUCKETS if w >= least), BUCKETS[-1])


def bucket_width(frame: pd.DataFrame, color: str) -> pd.Timedelta:
    """A width from BUCKETS (width_for): at most MAX_POINTS buckets over the frame's span,
    and no narrower than one series' median sample spacing (replicas are scraped at
    different instants; a bucket holds about one sample of each)."""
    times = frame["time"]
    span = pd.Timestamp(times.max()) - pd.Timestamp(times.min())
    first = frame.loc[frame[color] == frame[color].iloc[0], "time"].sort_values()
    return width_for(span, first.diff().median())


def distribution(
    frame: pd.DataFrame,
    y: str,
    color: str,
    worse: Worse = "higher",
    width: pd.Timedelta | None = None,
) -> pd.DataFrame:
    """Per time bucket (`width`, bucket_width's by default; `time` is the bucket's start):
    each series' mean in it, then the median and the bad-side tail (tail_name) across
    series. Missing values are left out, not counted as zero."""
    tail = tail_name(worse)
    values = frame[["time", color]].assign(value=pd.to_numeric(frame[y], errors="coerce"))
    values = values.dropna(subset=["value"])
    if values.empty:
        return pd.DataFrame({"time": [], MEDIAN: [], tail: []})
    if width is None:
        width = bucket_width(values, color)
    per = values.assign(time=values["time"].dt.floor(width)).groupby(["time", color])["value"]
    across = per.mean().groupby(level="time")
    out = pd.DataFrame({MEDIAN: across.quantile(0.5), tail: across.quantile(tail_quantile(worse))})
    return out.reset_index()


def tail_quantile(worse: Worse) -> float:
    """0.95 where high is bad, 0.05 where low is."""
    return 0.95 if worse == "higher" else 0.05


def worst(
    frame: pd.DataFrame, y: str, color: str, worse: Worse = "higher", k: int = WORST
) -> list[str]:
    """The `k` series whose mean of `y` over the frame is worst (highest, or lowest where
    `worse` is "lower"); ties by name. Series with no value are not ranked."""
    means = pd.to_numeric(frame[y], errors="coerce").groupby(frame[color]).mean()
    return ranked_worst(means, worse, k)


def ranked_worst(means: pd.Series, worse: Worse = "higher", k: int = WORST) -> list[str]:
    """The `k` worst of `means` (a mean per series, indexed by name), worst first; means
    equal to TIE_DIGITS significant digits are a tie, ranked by name; no mean (NaN) is not
    ranked."""
    known = pd.to_numeric(means, errors="coerce").dropna()
    # A sum's last bits depend on its order (the database sums in its own): equal series
    # must tie wherever their mean was computed.
    rounded = [float(f"{value:.{TIE_DIGITS}g}") for value in known.to_numpy()]
    ranked = pd.DataFrame({"name": known.index.astype(str), "mean": rounded})
    ranked = ranked.sort_values(["mean", "name"], ascending=[worse == "lower", True])
    return [str(name) for name in ranked["name"].head(k)]


TIE_DIGITS = 12
