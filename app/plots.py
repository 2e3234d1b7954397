"""How a page shows a chart: full width, the modebar's camera saving a PNG named after it,
and a small "CSV" button under it with the chart's data (dashboards/charts.py data_csv)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import streamlit as st

from dashboards.charts import config, data_csv, file_stem


def chart(figure: go.Figure, where: Any = None) -> None:
    """Show `figure` in `where` (a column or container; the page by default)."""
    where = st if where is None else where
    where.plotly_chart(figure, width="stretch", config=config(figure))
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
