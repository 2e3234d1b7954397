"""Charts of the Overview page."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

TITLES = {
    "kv_cache_occupancy": "KV-cache occupancy",
    "requests_running": "Running requests",
    "requests_waiting": "Waiting requests",
    "prompt_tokens_per_second": "Prompt tokens / s",
    "generation_tokens_per_second": "Generated tokens / s",
    "preemptions_per_second": "Preemptions / s",
}


def replica_lines(series: pd.DataFrame, column: str) -> go.Figure:
    """One line per replica of `column` over time."""
    figure = px.line(series, x="time", y=column, color="replica", title=TITLES.get(column, column))
    figure.update_layout(
        height=280,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        legend_title_text="",
        xaxis_title=None,
        yaxis_title=None,
    )
    if column == "kv_cache_occupancy":
        figure.update_yaxes(tickformat=".0%", range=[0, 1.05])
    return figure
