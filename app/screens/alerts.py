"""Alerts: what fires and what is pending now, and every state change in the time range."""

from __future__ import annotations

import streamlit as st

from app import data, filters

view = filters.current(data.replica_names())
st.title("Alerts")
st.caption(
    "Rules over the numbers the other pages show (last 5 minutes; drops against the last "
    "hour), evaluated every evaluation_interval by `kneepoint serve` or `kneepoint alerts "
    "eval`. Pending: breaching, waiting out its `for:`. Firing and resolved alerts go to their "
    "rules' channels through an outbox that retries until the platform takes or refuses them."
)
end = data.now()
current, history = data.alerts(end - view.range_seconds, end)
columns = ["state", "rule", "replica", "value", "threshold", "fired_at", "pending_since"]
firing = current[current.state == "firing"]
pending = current[current.state == "pending"]
a, b = st.columns(2)
a.metric("Firing", len(firing), help="Alerts whose condition held for their whole `for:`.")
b.metric("Pending", len(pending), help="Breaching now, not yet for their whole `for:`.")
if current.empty:
    st.success("Nothing is firing or pending.")
else:
    st.dataframe(current[columns], hide_index=True, width="stretch")
st.subheader(f"State changes, last {view.range_label}")
if history.empty:
    st.info("No alert changed state in this time range.")
else:
    shown = history[["ts", "rule", "replica", "before", "after", "value"]]
    st.dataframe(shown.rename(columns={"ts": "time"}), hide_index=True, width="stretch")

log, health = data.deliveries(end - view.range_seconds, end)
st.subheader("Channels")
if not health:
    st.info("No channel is configured (`channels:` in kneepoint.yaml).")
else:
    for column, (name, state) in zip(st.columns(len(health)), health.items(), strict=True):
        column.metric(
            name,
            state,
            help="broken: its latest message was refused (bad URL, token or signature); "
            "`kneepoint alerts test --channel NAME` sends a test message.",
        )
st.subheader(f"Delivery log, last {view.range_label}")
if log.empty:
    st.info("Nothing was sent in this time range.")
else:
    st.dataframe(log, hide_index=True, width="stretch")
