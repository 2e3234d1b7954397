"""Generic chart builders: a DataFrame in, a Plotly figure out."""

from __future__ import annotations

from contextvars import ContextVar
from typing import NamedTuple

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

LAYOUT = {"height": 280, "margin": {"l": 10, "r": 10, "t": 40, "b": 10}}
CHANGES = "changes"  # the name of the markers' trace


class Marker(NamedTuple):
    """A change on the timeline (kneepoint/timeline.py) as charts mark it."""

    at: pd.Timestamp
    kind: str
    text: str  # shown on hover


# The changes every time-series chart marks, set once per page run (app/changes.py).
MARKERS: ContextVar[tuple[Marker, ...]] = ContextVar("kneepoint_chart_markers", default=())


def marked(figure: go.Figure, start: pd.Timestamp | None = None) -> go.Figure:
    """Mark MARKERS (those from `start` on) with dotted vertical lines, and a triangle at the
    top of each whose hover shows what changed."""
    shown = [m for m in MARKERS.get() if start is None or m.at >= start]
    if not shown:
        return figure
    for m in shown:
        figure.add_vline(x=m.at, line_dash="dot", line_width=1, line_color="slategray")
    figure.add_trace(
        go.Scatter(
            x=[m.at for m in shown],
            y=[1.0] * len(shown),
            yaxis="y2",
            mode="markers",
            name=CHANGES,
            text=[m.text for m in shown],
            customdata=[m.kind for m in shown],
            hovertemplate="%{text}<extra></extra>",
            marker={"symbol": "triangle-down", "size": 10, "color": "slategray"},
            showlegend=False,
        )
    )
    figure.update_layout(
        yaxis2={"overlaying": "y", "range": [0, 1.04], "visible": False, "fixedrange": True}
    )
    return figure


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
    times = frame["time"] if "time" in frame and len(frame) else None
    return marked(figure, None if times is None else pd.Timestamp(times.min()))


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
