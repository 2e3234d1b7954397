"""Charts of the Overview page."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboards.charts import lines

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
    return lines(series, column, TITLES.get(column, column), percent=column == "kv_cache_occupancy")
