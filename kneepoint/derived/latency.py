"""Latency quantiles from histogram buckets over a window, as PromQL's histogram_quantile."""

from __future__ import annotations

import math
from collections.abc import Sequence

from kneepoint.counters import increase
from kneepoint.samples import Histogram

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def window_histogram(samples: Sequence[Histogram | None]) -> Histogram | None:
    """The histogram of what happened between the first and last sample (resets handled)."""
    known = [h for h in samples if h is not None]
    if len(known) < 2:
        return None
    bounds = known[-1].bounds
    same = [h for h in known if h.bounds == bounds]  # buckets changed: use the newest layout
    if len(same) < 2:
        return None
    counts: list[float] = []
    for index in range(len(bounds)):
        delta = increase([h.counts[index] for h in same]) or 0.0
        counts.append(max(delta, counts[-1] if counts else 0.0))  # keep it cumulative
    total = increase([h.total for h in same]) or 0.0
    return Histogram(bounds, tuple(counts), total)


def histogram_quantile(q: float, histogram: Histogram | None) -> float | None:
    """PromQL's histogram_quantile: linear interpolation inside the first bucket whose
    cumulative count reaches q × total; in the +Inf bucket, the highest finite bound."""
    if histogram is None or not histogram.counts or histogram.count <= 0:
        return None
    bounds, counts = histogram.bounds, histogram.counts
    rank = q * histogram.count
    index = next(i for i, cumulative in enumerate(counts) if cumulative >= rank)
    if math.isinf(bounds[index]):
        return bounds[index - 1] if index > 0 else None
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    start = bounds[index - 1] if index > 0 else 0.0
    below = counts[index - 1] if index > 0 else 0.0
    inside = counts[index] - below
    if inside <= 0:
        return start
    return start + (bounds[index] - start) * (rank - below) / inside


def quantiles(histogram: Histogram | None) -> dict[str, float | None] | None:
    """p50, p90 and p99 of a window's histogram; None when nothing was observed."""
    if histogram is None or histogram.count <= 0:
        return None
    return {name: histogram_quantile(q, histogram) for name, q in QUANTILES.items()}
