"""Knee charts: throughput and p99 latency against concurrency, several runs overlaid; on a
shared throughput axis (tok/s), or each run as a share of its own peak so a small replica's
knee is as visible as a big one's."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

THROUGHPUT, LATENCY = "output_tokens_per_second", "ttft_p99_seconds"
SHARE = "share_of_peak"  # normalize(): THROUGHPUT ÷ the run's highest THROUGHPUT


def normalize(curves: pd.DataFrame, markers: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`curves` and `markers` with SHARE: each step's throughput as a share of its run's peak
    (1.0 at the peak; a run without a positive peak has none)."""
    peaks = curves.groupby("run", sort=False)[THROUGHPUT].max()
    peaks = peaks.where(peaks > 0)

    def share(frame: pd.DataFrame) -> pd.DataFrame:
        out = frame.copy()
        out[SHARE] = out[THROUGHPUT] / out["run"].map(peaks)
        return out

    return share(curves), share(markers)


def knee_chart(
    curves: pd.DataFrame,
    markers: pd.DataFrame,
    slo_seconds: float | None = None,
    production: pd.DataFrame | None = None,
    production_peak: float | None = None,
    latency: str = LATENCY,
    normalized: bool = False,
) -> go.Figure:
    """`curves`: run, concurrency, output_tokens_per_second and `latency` columns, one row
    per step; `markers`: run, kind ("knee" | "recommended"), concurrency,
    output_tokens_per_second; `production`: the same columns as curves for the live curve.
    Throughput on the left axis (solid), latency on the right (dashed), log-2 concurrency.
    `normalized`: throughput as a share of each run's peak (normalize()); the production
    curve, which has no run's peak to share, is left out (its peak's line stays)."""
    figure = go.Figure()
    palette = qualitative.Plotly
    y = THROUGHPUT
    if normalized:
        curves, markers = normalize(curves, markers)
        y = SHARE
        production = None
    for i, (run, rows) in enumerate(curves.groupby("run", sort=False)):
        color = palette[i % len(palette)]
        figure.add_trace(
            go.Scatter(
                x=rows["concurrency"],
                y=rows[y],
                name=f"{run}: {'% of peak' if normalized else 'tok/s'}",
                mode="lines+markers",
                line={"color": color},
                customdata=rows[THROUGHPUT],
                hovertemplate=(
                    "%{y:.0%} of peak (%{customdata:,.0f} tok/s)" if normalized else None
                ),
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
                y=rows[y],
                name=str(kind),
                mode="markers",
                marker={
                    "symbol": symbols.get(str(kind), "circle"),
                    "size": 14,
                    "color": "#d97706",  # amber with a white rim: seen on light and dark
                    "line": {"color": "white", "width": 1},
                },
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
        # Short enough for a phone's width (a Plotly title does not wrap).
        title="Throughput (% of peak) & latency" if normalized else "Throughput & latency",
        hovermode="x unified",
        # a tick per doubling
        xaxis={"title": "concurrency (requests in flight)", "type": "log", "dtick": 0.30103},
        yaxis={
            "title": "throughput (% of the run's peak)"
            if normalized
            else "throughput (output tok/s)",
            "rangemode": "tozero",
            **({"tickformat": ".0%"} if normalized else {}),
        },
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
