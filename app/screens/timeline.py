"""Timeline: what changed, in the sidebar's range and replicas (kneepoint/timeline.py; the
same events mark every time-series chart, and `kneepoint timeline` prints them)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import changes, data, filters
from kneepoint.timeline import KINDS

chosen = filters.current(data.replica_names())
st.title("Timeline")
st.caption(
    "Restarts, configuration changes and upgrades, GPU events (XID, throttling, power "
    "capping, a GPU gone), scrape outages, hit-rate drops, prefill storms, alerts, silences "
    "and annotations, newest first. Post a deploy with `kneepoint annotate --replica R "
    '--text "prompt v42"` or the annotation API (README, Timeline).'
)
end = data.now()
found = changes.events(end - chosen.range_seconds, end, chosen.replicas)
kinds = st.multiselect("Kinds", [k for k in KINDS if any(e.kind == k for e in found)])
shown = [e for e in found if not kinds or e.kind in kinds]
if not shown:
    st.info(f"No change in the last {chosen.range_label}.")
else:
    table = pd.DataFrame(
        {
            "time": [pd.Timestamp(e.at, unit="s", tz="UTC") for e in shown],
            "replica": [e.replica or "fleet" for e in shown],
            "kind": [e.kind for e in shown],
            "detail": [e.detail for e in shown],
        }
    ).iloc[::-1]
    st.dataframe(table, hide_index=True, width="stretch")
