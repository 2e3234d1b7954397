"""The passive knee: a replica's real curve from production data.

Each interval between two scrapes gives an observed concurrency (running requests, the mean
of its two ends), the generation tokens made in it, and the TTFT histogram's increase. The
intervals are binned by concurrency on the sweep ladder's powers of two, so the production
curve lies next to the replica's sweeps: per bin, tokens over time (time-weighted) and the
p99 TTFT of every request that got its first token there (PromQL's histogram_quantile)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
from sqlalchemy.orm import Session

from kneepoint.derived.latency import histogram_quantile
from kneepoint.samples import Histogram
from kneepoint.store import queries


@dataclass(frozen=True)
class ProductionPoint:
    concurrency: int  # the bin: 1, 2, 4, 8, … (intervals from 1/√2 to √2 times it)
    output_tokens_per_second: float
    ttft_p99_seconds: float | None
    seconds: float  # time spent at this concurrency

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ProductionCurve:
    points: tuple[ProductionPoint, ...]
    peak_concurrency: float | None

    def headroom(self, knee: int | None) -> float | None:
        """Concurrency left before the knee at the busiest moment (negative: past it)."""
        if knee is None or self.peak_concurrency is None:
            return None
        return knee - self.peak_concurrency


def ladder_bin(concurrency: float) -> int | None:
    """The power of two nearest on a log scale (1 for anything from half a request); None
    for an idle interval."""
    if concurrency < 0.5:
        return None
    return max(1, 2 ** round(math.log2(concurrency)))


def _delta(later: Histogram | None, earlier: Histogram | None) -> Histogram | None:
    if later is None or earlier is None or later.bounds != earlier.bounds:
        return None
    if later.count < earlier.count:  # the server restarted: the new counts are the increase
        return later
    counts = tuple(max(0.0, a - b) for a, b in zip(later.counts, earlier.counts, strict=True))
    return Histogram(later.bounds, counts, later.total - earlier.total)


def production_curve(rows: pd.DataFrame, ttft: list[Histogram | None]) -> ProductionCurve:
    """`rows`: one replica's ts, requests_running, generation_tokens (and optionally
    requests_running_peak from rollups) in time order; `ttft`: its decoded histograms."""
    if rows.empty:
        return ProductionCurve((), None)
    running = rows["requests_running"].astype(float).tolist()
    generated = rows["generation_tokens"].astype(float).tolist()
    ts = rows["ts"].astype(float).tolist()
    peaks = rows.get("requests_running_peak", rows["requests_running"]).astype(float)
    peak = float(pd.concat([peaks, rows["requests_running"].astype(float)]).max())
    bins: dict[int, dict[str, Any]] = {}
    for i in range(1, len(rows)):
        seconds = ts[i] - ts[i - 1]
        if seconds <= 0 or math.isnan(running[i]) or math.isnan(running[i - 1]):
            continue
        level = ladder_bin((running[i] + running[i - 1]) / 2)
        if level is None:
            continue
        made = generated[i] - generated[i - 1]
        if math.isnan(made):
            continue
        made = generated[i] if made < 0 else made  # a counter reset
        slot = bins.setdefault(level, {"seconds": 0.0, "tokens": 0.0, "ttft": None})
        slot["seconds"] += seconds
        slot["tokens"] += made
        delta = _delta(ttft[i], ttft[i - 1])
        if delta is not None:
            held = slot["ttft"]
            slot["ttft"] = (
                delta
                if held is None
                else Histogram(
                    delta.bounds,
                    tuple(a + b for a, b in zip(held.counts, delta.counts, strict=True)),
                    held.total + delta.total,
                )
                if held.bounds == delta.bounds
                else held
            )
    points = tuple(
        ProductionPoint(
            level,
            slot["tokens"] / slot["seconds"],
            histogram_quantile(0.99, slot["ttft"]),
            slot["seconds"],
        )
        for level, slot in sorted(bins.items())
    )
    return ProductionCurve(points, None if math.isnan(peak) else peak)


def replica_curve(session: Session, replica: str, start: float, end: float) -> ProductionCurve:
    """The production curve of one stored replica over [start, end]."""
    target = queries.targets(session).get(replica)
    if target is None:
        return ProductionCurve((), None)
    frame = queries.replica_frame(
        session,
        start,
        end,
        [target.id],
        ["requests_running", "requests_running_peak", "generation_tokens", "hist_ttft"],
    )
    ttft = queries.histograms(frame["hist_ttft"], queries.histogram_layouts(session))
    return production_curve(frame, ttft)
