"""The numbers behind the pages, beyond the status contract: slots, saturation, queues,
recompute rates, routing divergence, hit-rate drops and prefill storms, cost and energy.
Pure functions over a window and time series, used by the pages and the reports alike."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kneepoint.derived.ratios import ratio
from kneepoint.derived.window import Window
from kneepoint.samples import SATURATION

FINISH = ("stop", "length", "abort", "error", "repetition")


def sequence_slots(
    capacity_tokens: float | None, occupancy: float | None, running: float | None
) -> tuple[float | None, float | None, float | None]:
    """(live mean context, slots at that context, slots left): how many more agents fit.

    The mean context is the occupied tokens over the running sequences."""
    if not capacity_tokens or occupancy is None or not running:
        return None, None, None
    mean_context = occupancy * capacity_tokens / running
    if mean_context <= 0:
        return None, None, None
    slots = capacity_tokens / mean_context
    return mean_context, slots, max(0.0, slots - running)


def time_saturated(
    times: pd.Series,
    occupancy: pd.Series,
    saturated: pd.Series | None = None,
    ends_saturated: pd.Series | None = None,
    threshold: float = SATURATION,
) -> float | None:
    """Share of the window's time with KV occupancy above `threshold` (each sample holds
    until the next). A summary row's occupancy is its bucket's mean, so it brings its own
    `saturated` seconds (those since the row before it) and whether its own sample
    `ends_saturated`, which decides the span after it."""
    if len(times) < 2:
        return None
    above = occupancy > threshold
    if ends_saturated is not None:
        above = ends_saturated.astype(float).fillna(above.astype(float)) > 0
    spans = times.diff().iloc[1:]
    seconds = spans * above.shift(1).iloc[1:].astype(float)
    if saturated is not None:
        seconds = saturated.iloc[1:].astype(float).fillna(seconds)
    return float(seconds.sum() / spans.sum()) if spans.sum() > 0 else None


def requests_finished(window: Window) -> float | None:
    known = [window.deltas.get(f"requests_finished_{r}") for r in FINISH]
    values = [v for v in known if v is not None]
    return sum(values) if values else None


def finish_reasons(window: Window) -> dict[str, float | None]:
    return {reason: window.deltas.get(f"requests_finished_{reason}") for reason in FINISH}


@dataclass(frozen=True)
class Event:
    start: pd.Timestamp
    value: float
    baseline: float


def hit_rate_drops(series: pd.DataFrame, points: float = 0.30, baseline: str = "1h") -> list[Event]:
    """Starts of intervals where the hit rate fell more than `points` below its trailing
    baseline (the 90 % → 60 % slide). `series` has time and hit_rate columns."""
    frame = series.dropna(subset=["hit_rate"]).set_index("time").sort_index()
    if frame.empty:
        return []
    trailing = frame.hit_rate.rolling(baseline).mean().shift(1)
    dropped = frame.hit_rate < trailing - points
    return _starts(frame.hit_rate, trailing, dropped)


def prefill_storms(series: pd.DataFrame, factor: float = 3.0, baseline: str = "1h") -> list[Event]:
    """Starts of bursts of computed prompt tokens: above `factor` × their trailing median."""
    frame = series.dropna(subset=["computed_prompt_tokens_per_second"]).set_index("time")
    frame = frame.sort_index()
    if frame.empty:
        return []
    values = frame.computed_prompt_tokens_per_second
    trailing = values.rolling(baseline).median().shift(1)
    burst = values > factor * trailing.clip(lower=1.0)
    return _starts(values, trailing, burst)


def _starts(values: pd.Series, baseline: pd.Series, flags: pd.Series) -> list[Event]:
    events = []
    previous = False
    for when, flag in flags.items():
        if flag and not previous:
            events.append(Event(pd.Timestamp(when), float(values[when]), float(baseline[when])))
        previous = bool(flag)
    return events


def divergence(rates: dict[str, float | None]) -> float | None:
    """Spread of prefix hit rates across replicas (max − min): the routing signal."""
    known = [r for r in rates.values() if r is not None]
    return max(known) - min(known) if len(known) >= 2 else None


def energy(energy_joules: float | None, tokens: float | None) -> tuple[float | None, float | None]:
    """(kWh, joules per 1M tokens) from the DCGM energy counter's increase."""
    if energy_joules is None:
        return None, None
    per_million = ratio(energy_joules, tokens)
    return energy_joules / 3.6e6, None if per_million is None else per_million * 1e6


def idle_gpu_hours(busy: float | None, seconds: float | None, gpus: int) -> float | None:
    if busy is None or seconds is None:
        return None
    return (1.0 - busy) * seconds / 3600.0 * gpus
