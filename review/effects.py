"""The predicted effect of each recommendation: the what-if change its knob stands for,
replayed through the replica's calibrated twin over the review's week (kneepoint.whatif), or
the reason there is no prediction (no calibration, an untrusted one, a change the twin does
not model). The What-if page formats its numbers with the same functions."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy.orm import Session

from kneepoint import catalogue
from kneepoint.config import Config
from kneepoint.whatif import parse_changes, whatif_replica
from review.recommend import Recommendation
from review.render import value

log = logging.getLogger(__name__)

# The numbers a prediction is read by: key of `whatif --json`'s measured / baseline /
# predicted objects, label, unit (as review.render.value takes it; kneepoint/catalogue.py).
METRICS: tuple[tuple[str, str, str], ...] = catalogue.effect_metrics()

# Why a recommendation without a what-if change has no prediction.
NOT_MODELLED = "no prediction: the twin has no change for this (it replays engine settings, "
NOT_MODELLED += "GPUs, replicas and traffic growth)"

# (replica, change) -> `whatif --json` as a dict; raises ValueError (kneepoint.whatif's
# WhatIfError and UntrustedProfile are ValueErrors) with the reason there is no prediction.
Predictor = Callable[[str, Mapping[str, Any]], dict[str, Any]]


def number(value: Any) -> float | None:
    """A finite number, or None (no data: never NaN or infinity on a page)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def flags(change: Mapping[str, Any]) -> str:
    """A change as the engine's flags read: {"kv_cache_dtype": "fp8"} → --kv-cache-dtype fp8."""
    parts = []
    for key, setting in change.items():
        if key == "replicas":
            parts.append(f"{setting} replicas")
        elif key == "growth":
            parts.append(f"traffic ×{setting:g}")
        elif key == "num_speculative_tokens" and setting == 0:
            parts.append("no drafter")
        else:
            text = str(setting).lower() if isinstance(setting, bool) else str(setting)
            parts.append(f"--{key.replace('_', '-')} {text}")
    return ", ".join(parts)


def bound(result: Mapping[str, Any], key: str, side: str = "predicted") -> float | None:
    """The relative error bound of `side`'s number for `key` (0.3 for ±30 %): the wider side
    of its `bounds` [low, high] (the calibration's error and the baseline's, in quadrature;
    kneepoint/whatif/predict.py); None where it gives none."""
    numbers = result.get(side) or {}
    middle = number(numbers.get(key))
    entry = (numbers.get("bounds") or {}).get(key)
    if not middle or not isinstance(entry, list | tuple) or len(entry) != 2:
        return None
    low, high = number(entry[0]), number(entry[1])
    if low is None or high is None:
        return None
    return max(high - middle, middle - low) / abs(middle)


def describe(result: Mapping[str, Any]) -> str:
    """`predicted: preemptions 340 → 12 ±30 %, TTFT p99 2.10 s → 800 ms ±12 %, …`: measured
    this week → predicted under the change, with the calibration's error; a number the week
    or the twin does not give is left out."""
    measured = result.get("measured") or {}
    predicted = result.get("predicted") or {}
    parts = []
    for key, label, unit in METRICS:
        before, after = number(measured.get(key)), number(predicted.get(key))
        if after is None:
            continue
        error = bound(result, key)
        spread = "" if error is None else f" ±{error:.0%}".replace("%", " %")
        parts.append(f"{label} {value(before, unit)} → {value(after, unit)}{spread}")
    if not parts:
        return "no prediction: the replay gave no numbers for this week"
    return "predicted: " + ", ".join(parts)


def effect(rec: Recommendation, predictor: Predictor) -> str:
    """The predicted effect of one recommendation, or why there is none."""
    if not rec.change:
        return NOT_MODELLED
    if rec.replica == "fleet":
        return "no prediction: the what-if replays one replica's traffic, not the fleet's"
    try:
        result = predictor(rec.replica, rec.change)
    except ValueError as error:  # WhatIfError: no calibration, untrusted, no history, …
        return f"no prediction for {flags(rec.change)}: {error}"
    except Exception as error:  # a fault in the replay: the review still goes out, saying so
        log.exception("what-if for %s %s failed", rec.replica, rec.change)
        return f"no prediction for {flags(rec.change)}: the replay failed ({type(error).__name__})"
    return f"{describe(result)} (with {flags(rec.change)})"


def with_effects(recs: list[Recommendation], predictor: Predictor) -> list[Recommendation]:
    """Each recommendation with its predicted effect (or why there is none)."""
    return [replace(rec, effect=effect(rec, predictor)) for rec in recs]


def store_predictor(session: Session, config: Config, now: float, since: float) -> Predictor:
    """Predictions from the store: the replica's newest calibration fitted by `now` replays
    the window of `since` seconds to `now` (kneepoint.whatif.whatif_replica), which raises
    WhatIfError (a ValueError) saying why when there is no calibration, an untrusted one, no
    history or a change that cannot apply. Each replica's baseline (the window replayed
    unchanged) is computed at its first recommendation and shared by the others (the
    process's baseline cache, kneepoint.whatif.predict.baseline_replay)."""

    def predict(replica: str, change: Mapping[str, Any]) -> dict[str, Any]:
        result = whatif_replica(
            session,
            config,
            replica,
            parse_changes(change),
            now - since,
            now,
            knees=False,  # no effect reads a knee (catalogue.effect_metrics)
        )
        return result.as_dict()

    return predict
