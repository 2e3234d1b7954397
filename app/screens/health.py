"""Collector health: each target's last scrape and error (a target put to sleep on purpose
is "asleep", as `kneepoint status` says, not trouble), the collectors and their leader, the
scheduler's jobs, recent errors."""

from __future__ import annotations

import streamlit as st

from app import data, filters
from app import tables as t
from app.format import is_empty
from collectors.engines import ENGINE_NAMES
from kneepoint.health import collectors

view = filters.current(data.replica_names())
st.title("Collector health")
end = data.now()
targets, jobs, errors = data.health(end - view.range_seconds, end)

st.subheader("Targets")
if targets.empty:
    st.info("Nothing has been scraped yet.")
else:

    def state(up: object, stale: bool, sleep: object) -> str | None:
        # Asleep on purpose (vLLM's sleep mode), as the status says: up, and not trouble.
        if is_empty(up):
            return None
        if stale:
            return "stale"
        if not up:
            return "down"
        return "up" if is_empty(sleep) or sleep == "awake" else f"asleep ({sleep})"

    t.people_table(
        targets.assign(
            state=[
                state(up, stale, sleep)
                for up, stale, sleep in zip(targets.up, targets.stale, targets.sleep, strict=True)
            ],
            engine=[None if is_empty(e) else ENGINE_NAMES.get(e, e) for e in targets.engine],
        ),
        {
            "target": t.text("Target"),
            "state": t.badge(
                "State",
                help="stale: not scraped lately (counted as down); asleep: put to sleep on "
                "purpose (vLLM's sleep mode), neither down nor stalled; –: never scraped.",
            ),
            "kind": t.text("Kind"),
            "engine": t.text("Engine"),
            "generation": t.text("Generation"),
            "last scrape": t.time("Last scrape"),
            "failures in a row": t.number("Failures in a row", digits=0),
            "last error": t.text("Last error"),
            "url": t.text("URL"),
        },
        identity="target",
        matters=("state", "failures in a row"),
    )

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
    t.people_table(
        [{**m, "state": "live" if m["live"] else "gone"} for m in members],
        {
            "id": t.text("Collector"),
            "host": t.text("Host"),
            "pid": t.text("PID"),
            "state": t.badge("State", help="gone: not seen within the collector lease."),
            "leader": t.yes_no("Leader"),
            "last_seen_at": t.time("Last seen"),
            "started_at": t.time("Started", absolute=False),
            "leader_since": t.time("Leader since", absolute=False),
            "targets": t.number("Targets", digits=0, help="Targets it held at its last round."),
        },
        identity="id",
        matters=("state", "last_seen_at"),
    )

st.subheader("Scheduled jobs")
if jobs.empty:
    st.info("No scheduled job has run yet (is `kneepoint serve` or `kneepoint collect` running?).")
else:
    t.people_table(
        jobs,
        {
            "job": t.text("Job"),
            "runs": t.number("Runs", digits=0),
            "failures": t.number("Failures", digits=0),
            "last run": t.time("Last run"),
            "last error": t.text("Last error"),
        },
        identity="job",
        matters=("failures", "last run"),
    )

st.subheader(f"Scrape errors, last {view.range_label}")
if errors.empty:
    st.success("No scrape errors in this time range.")
else:
    t.people_table(
        errors.iloc[::-1],  # newest first
        {"time": t.time("Time"), "target": t.text("Target"), "error": t.text("Error")},
        identity="target",
        matters=("time",),
    )
