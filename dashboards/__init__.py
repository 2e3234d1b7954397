"""Pure figure builders: a DataFrame (or the kernel's plain data) in, a Plotly figure out:
the pages' charts and markers (charts.py), the overview's fleet charts (overview.py), knee
curves (knee.py) and headroom forecasts (forecast.py). What belongs here is how a number
is drawn. What does not: Streamlit (the pages place the figures: app/plots.py), the store,
computing a number (kneepoint/), and exports for other tools (Grafana's dashboards are
alerts/grafana.py, beside the Prometheus rules they read)."""
