"""What happened in a window, from stored rows: counter increases, window histograms, and
the latest gauges. Replicas' windows merge into the fleet's, so every number is computed
the same way for one replica and for the fleet."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kneepoint.counters import increase
from kneepoint.derived.latency import window_histogram
from kneepoint.samples import HISTOGRAMS, LOAD_HISTOGRAMS, REPLICA_COUNTERS, Histogram
from kneepoint.store.codec import decode_floats, decode_histogram

# The histograms a window holds: the latency ones and the load ones (tokens per step, read by
# kneepoint/derived/saturation.py); a frame read without a load histogram's column has none.
WINDOW_HISTOGRAMS = (*HISTOGRAMS, *LOAD_HISTOGRAMS)


@dataclass
class Window:
    seconds: float | None = None  # between the first and last sample (None: fewer than two)
    deltas: dict[str, float | None] = field(default_factory=dict)
    per_position: list[float] | None = None
    histograms: dict[str, Histogram | None] = field(default_factory=dict)


EdgeReader = Callable[[pd.DataFrame], pd.DataFrame]


def frame_windows(
    frame: pd.DataFrame,
    layouts: dict[int, tuple[float, ...]],
    read_edges: EdgeReader | None = None,
) -> dict[int, Window]:
    """Every replica's window from rows ordered by target and time, in a few vectorized
    steps for all of them (pages read 50 replicas × days of rows).

    Histograms and per-position counts are needed only at the edge rows; when `frame` was
    read without them, `read_edges` gets those rows (target_id, ts) and returns them whole."""
    if frame.empty:
        return {}
    counters = list(REPLICA_COUNTERS)
    groups = frame.target_id
    steps, totals, enough = _increases(frame, counters)
    with np.errstate(invalid="ignore"):
        went_down = np.asarray((steps < 0).any(axis=1))
    spans = frame.groupby("target_id").ts.agg(["min", "max"]).to_dict("index")
    windows: dict[int, Window] = {}
    edges: list[int] = []
    # Each target's first and last row, for all targets in one step (by target, as before).
    bounds = pd.Series(range(len(frame)), index=frame.index).groupby(groups).agg(["first", "last"])
    for target_id, first, last in zip(
        bounds.index.tolist(), bounds["first"].tolist(), bounds["last"].tolist(), strict=True
    ):
        if first == last:
            windows[int(target_id)] = Window(histograms=dict.fromkeys(WINDOW_HISTOGRAMS))
            continue
        span = spans[target_id]
        window = Window(seconds=float(span["max"] - span["min"]))
        for name in counters:
            known = enough[target_id][name]
            window.deltas[name] = float(totals[target_id][name]) if known else None
        resets = [int(i) for i in went_down[first : last + 1].nonzero()[0] + first]
        edges += sorted({first, last, *resets, *(i - 1 for i in resets)})
        windows[int(target_id)] = window
    edge_rows = frame.iloc[edges]
    if read_edges is not None:
        edge_rows = read_edges(edge_rows[["target_id", "ts"]])
    if edge_rows.empty:
        return windows
    # Every target's edge rows in time order, each column converted once for all of them.
    edge_rows = edge_rows.sort_values(["target_id", "ts"], kind="stable")
    ids = edge_rows.target_id.tolist()
    texts = {
        name: edge_rows[f"hist_{name}"].tolist()
        for name in WINDOW_HISTOGRAMS
        if name in HISTOGRAMS or f"hist_{name}" in edge_rows
    }
    per_position = edge_rows.accepted_per_position.tolist()
    start = 0
    for end in range(1, len(ids) + 1):
        if end < len(ids) and ids[end] == ids[start]:
            continue
        mine = {name: column[start:end] for name, column in texts.items()}
        _fill_from_edges(windows[int(ids[start])], mine, per_position[start:end], layouts)
        start = end
    return windows


def _increases(
    frame: pd.DataFrame, counters: list[str]
) -> tuple[np.ndarray, dict[int, dict[str, float]], dict[int, dict[str, bool]]]:
    """Per target of `frame`: each counter's steps between rows (a row × counter array, NaN
    at a target's first row), its total increase, and whether it is known at two rows at
    least (column by column: the same for any subset of the counters).

    Where each target's rows are together (frames are ordered by target and time), the
    forward fill and the steps are a few numpy passes over all targets at once, and only the
    totals are a pandas group sum (its compensated summation, as before): an evaluation round
    reads every replica's window, and each pandas group step cost a millisecond or more."""
    values = frame[counters].to_numpy(dtype=float)
    ids = frame.target_id.to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else np.array([], int)
    if len(starts) != len(pd.unique(ids)):  # a target's rows apart: pandas' groups
        return _grouped_increases(frame, counters)
    rows = np.arange(len(values))
    first = np.zeros(len(values), dtype=bool)
    first[starts] = True
    group_start = np.maximum.accumulate(np.where(first, rows, 0))
    known = ~np.isnan(values)
    # Each row's latest known value within its target (its group's forward fill).
    latest = np.maximum.accumulate(np.where(known, rows[:, None], -1), axis=0)
    inside = latest >= group_start[:, None]
    filled = np.where(inside, values[np.where(inside, latest, 0), np.arange(len(counters))], np.nan)
    steps = np.full_like(filled, np.nan)
    steps[1:] = filled[1:] - filled[:-1]
    steps[first] = np.nan
    # A counter that went down was reset: its new value is the increase (counters.increase).
    with np.errstate(invalid="ignore"):
        reset = steps < 0
    increases = np.where(reset, filled, steps)
    increases[np.isnan(increases)] = 0.0
    summed = pd.DataFrame(increases, columns=counters).groupby(ids, sort=False).sum()
    totals = {
        target_id: dict(zip(counters, row, strict=True))
        for target_id, row in zip(summed.index.tolist(), summed.to_numpy().tolist(), strict=True)
    }
    counts = np.add.reduceat(known, starts, axis=0) if len(starts) else known[:0]
    enough = {
        target_id: dict(zip(counters, (counts[n] >= 2).tolist(), strict=True))
        for n, target_id in enumerate(ids[starts].tolist())
    }
    return steps, totals, enough


def _grouped_increases(
    frame: pd.DataFrame, counters: list[str]
) -> tuple[np.ndarray, dict[int, dict[str, float]], dict[int, dict[str, bool]]]:
    """_increases with pandas' groups, for a frame whose targets' rows are not together."""
    values = frame[counters].astype(float)
    groups = frame.target_id
    filled = values.groupby(groups).ffill()
    steps = filled.groupby(groups).diff()
    increases = steps.where(steps.isna() | (steps >= 0), filled).fillna(0.0)
    totals = increases.groupby(groups).sum().to_dict("index")
    enough = (values.notna().groupby(groups).sum() >= 2).to_dict("index")
    return steps.to_numpy(), totals, enough


def counter_deltas(
    frame: pd.DataFrame, counters: Sequence[str]
) -> dict[int, dict[str, float | None]]:
    """The `deltas` frame_windows gives each target for these counters alone (a target with
    one row: none), without its histograms: for a caller that needs a few increases only."""
    if frame.empty:
        return {}
    _, totals, enough = _increases(frame, list(counters))
    sizes = frame.groupby("target_id").size().to_dict()
    return {
        int(target_id): {
            name: float(totals[target_id][name]) if enough[target_id][name] else None
            for name in counters
        }
        if size >= 2
        else {}
        for target_id, size in sizes.items()
    }


def _fill_from_edges(
    window: Window,
    histograms: dict[str, list[Any]],
    per_position: list[Any],
    layouts: dict[int, tuple[float, ...]],
) -> None:
    """Histograms and per-position counters need only the rows at the ends and around
    resets (given in time order): their increases are exact from those alone."""
    for name in WINDOW_HISTOGRAMS:
        if name not in histograms:
            window.histograms[name] = None
            continue
        decoded = [
            None if _missing(text) else decode_histogram(text, layouts) for text in histograms[name]
        ]
        window.histograms[name] = window_histogram(decoded)
    positions = [decode_floats(None if _missing(t) else t) for t in per_position]
    known = [p for p in positions if p]
    if len(known) >= 2 and all(len(p) == len(known[-1]) for p in known):
        window.per_position = [
            increase([p[i] for p in known]) or 0.0 for i in range(len(known[-1]))
        ]


def merge(windows: Sequence[Window]) -> Window:
    """The fleet's window: increases and histograms added up over replicas."""
    merged = Window()
    spans = [w.seconds for w in windows if w.seconds is not None]
    merged.seconds = max(spans) if spans else None
    for name in REPLICA_COUNTERS:
        known = [w.deltas.get(name) for w in windows if w.deltas.get(name) is not None]
        merged.deltas[name] = sum(v for v in known if v is not None) if known else None
    for name in WINDOW_HISTOGRAMS:
        merged.histograms[name] = _add([w.histograms.get(name) for w in windows])
    lists = [w.per_position for w in windows if w.per_position]
    if lists and all(len(p) == len(lists[0]) for p in lists):
        merged.per_position = [sum(values) for values in zip(*lists, strict=True)]
    return merged


def _add(histograms: Sequence[Histogram | None]) -> Histogram | None:
    known = [h for h in histograms if h is not None]
    if not known:
        return None
    if any(h.bounds != known[0].bounds for h in known):
        # Engines bucket differently (a vLLM and an SGLang replica): a cumulative count is
        # exact at any of its own bounds, so the fleet's is exact at the bounds all share.
        shared = set(known[0].bounds).intersection(*(h.bounds for h in known[1:]))
        bounds = tuple(sorted(shared))
        known = [
            Histogram(bounds, tuple(h.counts[h.bounds.index(b)] for b in bounds), h.total)
            for h in known
        ]
    counts = tuple(sum(values) for values in zip(*(h.counts for h in known), strict=True))
    return Histogram(known[0].bounds, counts, sum(h.total for h in known))


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
