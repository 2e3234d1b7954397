"""Weekly review: the capacity review's report (kneepoint report), rendered, to download."""

from __future__ import annotations

import streamlit as st

from app import actions, data, filters
from app.format import GPU_BUSY_VS_LOAD
from app.plots import chart
from kneepoint.auth import Refused
from review.render import figures

filters.current(data.replica_names())
st.title("Weekly review")
now = data.now()
report, page, summary = data.weekly_report(now - now % 300)
st.download_button(
    "Download the report (HTML, works offline)",
    page,
    file_name="kneepoint-weekly-review.html",
    mime="text/html",
)
st.markdown(summary.split("\n", 1)[1])  # its own title is this page's
for figure in figures(report):
    chart(figure)
st.caption(
    "This week against the week before, computed as `kneepoint status` and every page compute "
    "their numbers. `kneepoint report` writes the same report; `report.schedule` sends it. "
    + GPU_BUSY_VS_LOAD
)
if st.button(
    "Send the review now",
    help="Writes it and posts its summary to report.channels. Needs operator.",
):
    try:
        st.success(actions.send_report())
    except Refused as refused:
        st.error(str(refused))
