"""Collector health: each target's last scrape and error, the scheduler's jobs, recent errors."""

from __future__ import annotations

import streamlit as st

from app import data, filters

view = filters.current(data.replica_names())
st.title("Collector health")
end = data.now()
targets, jobs, errors = data.health(end - view.range_seconds, end)

st.subheader("Targets")
if targets.empty:
    st.info("Nothing has been scraped yet.")
else:
    st.dataframe(targets, hide_index=True, width="stretch")

st.subheader("Scheduled jobs")
if jobs.empty:
    st.info("No scheduled job has run yet (is `kneepoint serve` or `kneepoint collect` running?).")
else:
    st.dataframe(jobs, hide_index=True, width="stretch")

st.subheader(f"Scrape errors, last {view.range_label}")
if errors.empty:
    st.success("No scrape errors in this time range.")
else:
    st.dataframe(errors, hide_index=True, width="stretch")
