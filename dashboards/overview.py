"""Charts of the Overview page."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from dashboards.charts import fleet_lines, lines
from kneepoint.distribution import Fleet, Worse

TITLES = {
    "kv_cache_occupancy": "KV-cache occupancy",
    "requests_running": "Running requests",
    "requests_waiting": "Waiting requests",
    "prompt_tokens_per_second": "Prompt tokens / s",
    "generation_tokens_per_second": "Generated tokens / s",
    "preemptions_per_second": "Preemptions / s",
}


# The y axis of each: what is counted, and its unit.
AXES = {
    "kv_cache_occupancy": ("KV-cache occupancy", "%"),
    "requests_running": ("running", "requests"),
    "requests_waiting": ("waiting", "requests"),
    "prompt_tokens_per_second": ("prompt", "tok/s"),
    "generation_tokens_per_second": ("generated", "tok/s"),
    "preemptions_per_second": ("preemptions", "1/s"),
}


# Which way each is bad, for a fleet chart's tail and worst replicas (charts.fleet_figure):
# little generated or prompt throughput is the stalled replica; the rest are bad when high.
WORSE: dict[str, Worse] = {
    "generation_tokens_per_second": "lower",
    "prompt_tokens_per_second": "lower",
}


def replica_lines(series: pd.DataFrame, column: str, chosen: Sequence[str] = ()) -> go.Figure:
    """One line per replica of `column` over time (only `chosen`, when any are); above
    distribution.FLEET_THRESHOLD replicas the fleet's median, tail and worst replicas, with the
    `chosen` ones as their own lines (charts.lines)."""
    name, unit = AXES.get(column, (column, ""))
    return lines(
        series,
        column,
        TITLES.get(column, column),
        percent=unit == "%",
        unit="" if unit == "%" else unit,
        y_title=name,
        worse=WORSE.get(column, "higher"),
        chosen=chosen,
    )


def fleet_replica_lines(fleet: Fleet, column: str, chosen: Sequence[str] = ()) -> go.Figure:
    """replica_lines' fleet figure from a distribution already computed (the database's:
    kneepoint/store/fleet_series.py), with the same titles, axes and bad side."""
    name, unit = AXES.get(column, (column, ""))
    return fleet_lines(
        fleet,
        column,
        TITLES.get(column, column),
        percent=unit == "%",
        unit="" if unit == "%" else unit,
        y_title=name,
        worse=WORSE.get(column, "higher"),
        chosen=chosen,
    )
