"""Generic chart builders: a DataFrame in, a Plotly figure out."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

LAYOUT = {"height": 280, "margin": {"l": 10, "r": 10, "t": 40, "b": 10}}


def lines(
    frame: pd.DataFrame,
    y: str,
    title: str,
    color: str = "replica",
    percent: bool = False,
    unit: str = "",
) -> go.Figure:
    """One line per `color` value of column `y` over time."""
    figure = px.line(frame, x="time", y=y, color=color, title=title)
    figure.update_layout(**LAYOUT, legend_title_text="", xaxis_title=None, yaxis_title=unit)
    if percent:
        figure.update_yaxes(tickformat=".0%", rangemode="tozero")
    return figure


def events(figure: go.Figure, starts: list[pd.Timestamp], label: str) -> go.Figure:
    """Mark event start times (drops, storms) with vertical lines."""
    for start in starts:
        figure.add_vline(x=start, line_dash="dot", line_color="firebrick")
    if starts:
        figure.add_annotation(x=starts[0], y=1, yref="paper", text=label, showarrow=False)
    return figure


def bars(labels: list[str], values: list[float], title: str, percent: bool = False) -> go.Figure:
    figure = go.Figure(go.Bar(x=labels, y=values))
    figure.update_layout(**LAYOUT, title=title)
    if percent:
        figure.update_yaxes(tickformat=".0%", range=[0, 1])
    return figure
