"""Knee charts: throughput and p99 latency against concurrency, several runs overlaid."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

THROUGHPUT, LATENCY = "output_tokens_per_second", "ttft_p99_seconds"


def knee_chart(
    curves: pd.DataFrame,
    markers: pd.DataFrame,
    slo_seconds: float | None = None,
    production: pd.DataFrame | None = None,
    production_peak: float | None = None,
    latency: str = LATENCY,
) -> go.Figure:
    """`curves`: run, concurrency, output_tokens_per_second and `latency` columns, one row
    per step; `markers`: run, kind ("knee" | "recommended"), concurrency,
    output_tokens_per_second; `production`: the same columns as curves for the live curve.
    Throughput on the left axis (solid), latency on the right (dashed), log-2 concurrency."""
    figure = go.Figure()
    palette = qualitative.Plotly
    for i, (run, rows) in enumerate(curves.groupby("run", sort=False)):
        color = palette[i % len(palette)]
        figure.add_trace(
            go.Scatter(
                x=rows["concurrency"],
                y=rows[THROUGHPUT],
                name=f"{run}: tok/s",
                mode="lines+markers",
                line={"color": color},
            )
        )
        figure.add_trace(
            go.Scatter(
                x=rows["concurrency"],
                y=rows[latency],
                name=f"{run}: {_latency_name(latency)}",
                mode="lines+markers",
                line={"color": color, "dash": "dash"},
                yaxis="y2",
            )
        )
    symbols = {"knee": "diamond", "recommended": "star"}
    for kind, rows in markers.groupby("kind", sort=False):
        figure.add_trace(
            go.Scatter(
                x=rows["concurrency"],
                y=rows[THROUGHPUT],
                name=str(kind),
                mode="markers",
                marker={"symbol": symbols.get(str(kind), "circle"), "size": 14, "color": "black"},
                text=rows["run"],
                hovertemplate="%{text}: " + str(kind) + " at %{x}<extra></extra>",
            )
        )
    if production is not None and not production.empty:
        figure.add_trace(
            go.Scatter(
                x=production["concurrency"],
                y=production[THROUGHPUT],
                name="production: tok/s",
                mode="markers",
                marker={"color": "seagreen", "size": 10, "symbol": "circle-open"},
            )
        )
    if production_peak is not None:
        figure.add_vline(
            x=production_peak,
            line_dash="dot",
            line_color="seagreen",
            annotation_text=f"production peak {production_peak:g}",
        )
    if slo_seconds is not None:
        figure.add_hline(
            y=slo_seconds,
            yref="y2",
            line_dash="dot",
            line_color="firebrick",
            annotation_text=f"SLO {slo_seconds * 1000:g} ms",
        )
    figure.update_layout(
        height=420,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        title="Throughput and latency against concurrency",
        xaxis={"title": "concurrency", "type": "log", "dtick": 0.30103},  # a tick per doubling
        yaxis={"title": "output tokens/s", "rangemode": "tozero"},
        yaxis2={
            "title": f"{_latency_name(latency)} (s)",
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
        },
        legend={"orientation": "h", "y": -0.2},
    )
    return figure


def _latency_name(column: str) -> str:
    return column.removesuffix("_seconds").replace("_", " ").upper().replace(" P", " p")
