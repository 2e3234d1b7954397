"""Speculative decoding: acceptance, length, per-position rates, expected speedup, verdict."""

from __future__ import annotations

import streamlit as st

from app import data, filters, fleet_data
from app import tables as t
from app.fleet import at_fleet_size, worst_first
from app.format import show
from app.plots import chart
from dashboards.charts import bars, lines
from kneepoint import catalogue

view_filter = filters.current(data.replica_names())
st.title("Speculative decoding")
view = data.view(view_filter.range_seconds, data.now())
every = [r for r in view.status["replicas"] if r["spec_decode_acceptance_rate"] is not None]
drafting = [r for r in every if not view_filter.replicas or r["name"] in view_filter.replicas]
if not drafting:
    st.info("No replica ran speculative decoding in this time range.")
# A fleet: one table, the least speedup first and paged; tiles for the sidebar's replicas.
fleet = at_fleet_size(len(every))
if fleet:
    st.subheader(f"Drafting replicas ({len(every):,}), the least speedup first")
    t.people_table(
        worst_first(
            [
                {
                    "replica": r["name"],
                    "verdict": view.rows[r["name"]]["spec_verdict"],
                    "spec_expected_speedup": view.rows[r["name"]]["spec_expected_speedup"],
                    "spec_decode_acceptance_rate": r["spec_decode_acceptance_rate"],
                    "spec_decode_mean_acceptance_length": r["spec_decode_mean_acceptance_length"],
                }
                for r in every
            ],
            [("spec_expected_speedup", "lower"), ("spec_decode_acceptance_rate", "lower")],
        ),
        {
            "replica": t.text("Replica"),
            "spec_expected_speedup": t.ratio("Expected speedup", digits=2),
            "spec_decode_acceptance_rate": t.percent("Acceptance rate"),
            "spec_decode_mean_acceptance_length": t.number(
                "Mean acceptance length", "tok", digits=2
            ),
            "verdict": t.text("Verdict"),
        },
        identity="replica",
        matters=("spec_expected_speedup",),
    )
for replica in drafting if not fleet or view_filter.replicas else ():
    extra = view.rows[replica["name"]]
    st.subheader(f"{replica['name']}: {extra['spec_verdict'] or 'no verdict'}")
    a, b, c = st.columns(3)
    a.metric(
        "Acceptance rate",
        show(replica["spec_decode_acceptance_rate"], "%"),
        help=catalogue.help_text("spec_decode_acceptance_rate"),
    )
    b.metric(
        "Mean acceptance length",
        show(replica["spec_decode_mean_acceptance_length"], "tok", 2),
        help=catalogue.help_text("spec_decode_mean_acceptance_length"),
    )
    c.metric(
        "Expected speedup",
        show(extra["spec_expected_speedup"], "×", 2),
        help=catalogue.help_text("spec_expected_speedup"),
    )
    positions = replica["spec_decode_per_position_acceptance"] or []
    if positions:
        chart(
            bars(
                [f"position {i}" for i in range(len(positions))],
                positions,
                "Acceptance by draft position",
                percent=True,
                x_title="draft position (token)",
                y_title="accepted",
            )
        )
TITLE = "Acceptance rate over time"
# A fleet's chart comes from the database whatever the number drafting: the view builds
# no per-replica series above the threshold (kneepoint/views.py), as the other pages decide.
if at_fleet_size(len(view.status["replicas"])):
    # The database computes a fleet's chart (app/fleet_data.py): its distribution, the
    # least accepting and the sidebar's replicas, never every replica's series.
    end = data.now()
    start = end - view_filter.range_seconds
    mine = view_filter.replicas
    if fleet_data.replica_chart("spec_acceptance", start, end, "lower", mine).size:
        chart(
            fleet_data.replica_lines(
                "spec_acceptance",
                start,
                end,
                TITLE,
                percent=True,
                y_title="accepted",
                worse="lower",
                chosen=mine,
            )
        )
else:
    series = view.series.dropna(subset=["spec_acceptance"])
    if not series.empty:  # a small fleet's: every replica, as before
        chart(
            lines(series, "spec_acceptance", TITLE, percent=True, y_title="accepted", worse="lower")
        )
