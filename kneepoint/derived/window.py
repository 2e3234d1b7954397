"""What happened in a window, from stored rows: counter increases, window histograms, and
the latest gauges. Replicas' windows merge into the fleet's, so every number is computed
the same way for one replica and for the fleet."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from kneepoint.counters import increase
from kneepoint.derived.latency import window_histogram
from kneepoint.samples import HISTOGRAMS, REPLICA_COUNTERS, Histogram
from kneepoint.store.codec import decode_floats, decode_histogram


@dataclass
class Window:
    seconds: float | None = None  # between the first and last sample (None: fewer than two)
    deltas: dict[str, float | None] = field(default_factory=dict)
    per_position: list[float] | None = None
    histograms: dict[str, Histogram | None] = field(default_factory=dict)


def replica_window(frame: pd.DataFrame, layouts: dict[int, tuple[float, ...]]) -> Window:
    """The window of one replica's rows (ordered by time)."""
    if len(frame) < 2:
        return Window(histograms=dict.fromkeys(HISTOGRAMS))
    times = frame.ts
    window = Window(seconds=float(times.iloc[-1] - times.iloc[0]))
    for name in REPLICA_COUNTERS:
        window.deltas[name] = series_increase(frame[name])
    # Only rows at the window's ends and around resets change an increase: decode just those.
    edges = sorted({0, len(frame) - 1, *_around_resets(frame)})
    for name in HISTOGRAMS:
        column = frame[f"hist_{name}"].iloc[edges]
        decoded = [None if _missing(text) else decode_histogram(text, layouts) for text in column]
        window.histograms[name] = window_histogram(decoded)
    texts = frame.accepted_per_position.iloc[edges]
    positions = [decode_floats(None if _missing(t) else t) for t in texts]
    known = [p for p in positions if p]
    if len(known) >= 2 and all(len(p) == len(known[-1]) for p in known):
        window.per_position = [
            increase([p[i] for p in known]) or 0.0 for i in range(len(known[-1]))
        ]
    return window


def series_increase(values: pd.Series) -> float | None:
    """counters.increase() over a column, vectorized: None without two known values."""
    known = values.dropna().astype(float)
    if len(known) < 2:
        return None
    steps = known.diff().iloc[1:]
    return float(steps.where(steps >= 0, known.iloc[1:]).sum())


def _around_resets(frame: pd.DataFrame) -> list[int]:
    """Positions of the rows on both sides of an engine restart (any counter going down)."""
    counters = frame[list(REPLICA_COUNTERS)].astype(float)
    went_down = (counters.diff() < 0).any(axis=1).to_numpy()
    positions: list[int] = []
    for index in went_down.nonzero()[0]:
        positions += [int(index) - 1, int(index)]
    return positions


def merge(windows: Sequence[Window]) -> Window:
    """The fleet's window: increases and histograms added up over replicas."""
    merged = Window()
    spans = [w.seconds for w in windows if w.seconds is not None]
    merged.seconds = max(spans) if spans else None
    for name in REPLICA_COUNTERS:
        known = [w.deltas.get(name) for w in windows if w.deltas.get(name) is not None]
        merged.deltas[name] = sum(v for v in known if v is not None) if known else None
    for name in HISTOGRAMS:
        merged.histograms[name] = _add([w.histograms.get(name) for w in windows])
    lists = [w.per_position for w in windows if w.per_position]
    if lists and all(len(p) == len(lists[0]) for p in lists):
        merged.per_position = [sum(values) for values in zip(*lists, strict=True)]
    return merged


def _add(histograms: Sequence[Histogram | None]) -> Histogram | None:
    known = [h for h in histograms if h is not None]
    if not known or any(h.bounds != known[0].bounds for h in known):
        return known[0] if len(known) == 1 else None
    counts = tuple(sum(values) for values in zip(*(h.counts for h in known), strict=True))
    return Histogram(known[0].bounds, counts, sum(h.total for h in known))


def _values(column: pd.Series) -> list[float | None]:
    return [None if _missing(v) else float(v) for v in column]


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
