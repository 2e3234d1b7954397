"""How a page shows a chart: full width, drawn in SVG, the modebar's camera saving a PNG named
after it, and a small "CSV" button under it with the chart's data (dashboards/charts.py
data_csv)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import streamlit as st

from dashboards.charts import config, data_csv, file_stem


def in_svg(figure: go.Figure) -> go.Figure:
    """The figure with its WebGL line traces (scattergl) drawn as SVG ones (scatter): the
    same lines. plotly.express picks WebGL above 1,000 points (the demo's 4 replicas × 321),
    and a browser without a GPU draws WebGL in software: 4 such charts took 16–19 s in
    headless Chromium where the SVG ones took 0.4–2.5 s (2 loaded cores). Charts at fleet
    size draw a few traces (dashboards/charts.py fleet_figure), so SVG stays light."""
    if not any(trace.type == "scattergl" for trace in figure.data):
        return figure
    spec = figure.to_plotly_json()
    for trace in spec["data"]:
        if trace.get("type") == "scattergl":
            trace["type"] = "scatter"
    return go.Figure(spec)


def chart(figure: go.Figure, where: Any = None) -> None:
    """Show `figure` in `where` (a column or container; the page by default)."""
    where = st if where is None else where
    where.plotly_chart(in_svg(figure), width="stretch", config=config(figure))
    stem = file_stem(figure)
    where.download_button(
        "CSV",
        data=lambda: data_csv(figure),  # written only when asked for
        file_name=f"{stem}.csv",
        mime="text/csv",
        icon=":material/download:",
        type="tertiary",
        on_click="ignore",
        help="This chart's data as CSV (the PNG is the camera in the chart's toolbar).",
    )
