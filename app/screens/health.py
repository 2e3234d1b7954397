"""Collector health: each target's last scrape and error, the collectors and their leader,
the scheduler's jobs, recent errors."""

from __future__ import annotations

import streamlit as st

from app import data, filters
from kneepoint.health import collectors

view = filters.current(data.replica_names())
st.title("Collector health")
end = data.now()
targets, jobs, errors = data.health(end - view.range_seconds, end)

st.subheader("Targets")
if targets.empty:
    st.info("Nothing has been scraped yet.")
else:
    st.dataframe(targets, hide_index=True, width="stretch")

st.subheader("Collectors")
config, sessions = data.store()
with sessions() as session:
    members, leader = collectors(session, config, end)
if not members:
    st.info("No collector has registered yet.")
else:
    if leader is not None:
        st.caption(f"Leader: **{leader}** (alert evaluation, delivery, rollups, the report).")
    elif str(config.database).startswith("sqlite"):
        st.caption("SQLite: no election; every collector scrapes every target and runs every job.")
    else:
        st.warning("No collector holds the leadership: alerts are not being evaluated.")
    st.dataframe(members, hide_index=True, width="stretch")

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
