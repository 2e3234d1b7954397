"""The headroom forecast as a chart: daily peaks, the fitted trend, the knee, and the range of
dates it crosses (kneepoint/forecast.py)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kneepoint.forecast import CROSSES, DAY, Forecast

LAYOUT = {"height": 300, "margin": {"l": 10, "r": 10, "t": 40, "b": 10}}


def _time(ts: float) -> pd.Timestamp:
    return pd.Timestamp(ts, unit="s", tz="UTC")


def headroom(forecast: Forecast) -> go.Figure:
    """One replica: its daily peaks (running + waiting), the trend line to the crossing (or a
    week past the last day), the knee, and the earliest–latest band when there is a date."""
    figure = go.Figure()
    days = [_time(d) for d in forecast.days]
    figure.add_trace(go.Scatter(x=days, y=list(forecast.peaks), mode="markers", name="daily peak"))
    if forecast.slope_per_day is not None and forecast.days:
        n = len(forecast.days)
        x_mean = sum((d - forecast.days[0]) / DAY for d in forecast.days) / n
        y_mean = sum(forecast.peaks) / n
        end = forecast.crossing if forecast.crossing is not None else forecast.days[-1] + 7 * DAY
        ends = (forecast.days[0], end)
        fitted = [
            y_mean + forecast.slope_per_day * ((t - forecast.days[0]) / DAY - x_mean) for t in ends
        ]
        figure.add_trace(
            go.Scatter(
                x=[_time(t) for t in ends], y=fitted, mode="lines", name="trend", line_dash="dot"
            )
        )
    if forecast.knee is not None:
        figure.add_hline(
            y=forecast.knee,
            line_dash="dash",
            line_color="firebrick",
            annotation_text=f"knee {forecast.knee}",
        )
    if forecast.verdict == CROSSES and forecast.earliest and forecast.latest:
        figure.add_vrect(
            x0=_time(forecast.earliest),
            x1=_time(forecast.latest),
            fillcolor="firebrick",
            opacity=0.12,
            line_width=0,
            annotation_text="crosses",
        )
    figure.update_layout(
        **LAYOUT,
        title=f"{forecast.replica}: daily peak vs knee",
        xaxis_title="day (UTC)",
        yaxis_title="peak concurrency (requests running + waiting)",
        legend_title_text="",
        hovermode="x unified",
    )
    figure.update_yaxes(rangemode="tozero")
    return figure
