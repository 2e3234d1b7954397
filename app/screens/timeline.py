"""Timeline: what changed, in the sidebar's range and replicas (kneepoint/timeline.py; the
same events mark every time-series chart, and `kneepoint timeline` prints them)."""

from __future__ import annotations

import streamlit as st

from app import changes, data, filters
from app import tables as t
from kneepoint.timeline import KINDS


def _words(kind: str) -> str:
    """A kind as people say it: scrape_outage → "scrape outage", gpu_xid → "GPU XID"."""
    return kind.replace("gpu_", "GPU ").replace("xid", "XID").replace("_", " ")


chosen = filters.current(data.replica_names())
st.title("Timeline")
st.caption(
    "Restarts, configuration changes, upgrades and engine changes, GPU events (XID, "
    "throttling, power "
    "capping, a GPU gone), scrape outages, hit-rate drops, prefill storms, alerts, silences "
    "and annotations, newest first. Post a deploy with `kneepoint annotate --replica R "
    '--text "prompt v42"` or the annotation API (docs/how-to/timeline.md).'
)
end = data.now()
found = changes.events(end - chosen.range_seconds, end, chosen.replicas)
kinds = st.multiselect(
    "Kinds", [k for k in KINDS if any(e.kind == k for e in found)], format_func=_words
)
shown = [e for e in found if not kinds or e.kind in kinds]
if not shown:
    st.info(f"No change in the last {chosen.range_label}.")
else:
    t.people_table(
        [
            {"at": e.at, "replica": e.replica or "fleet", "kind": e.kind, "detail": e.detail}
            for e in reversed(shown)
        ],
        {
            "at": t.time("Time"),
            "replica": t.text("Replica"),
            "kind": t.formatted("Kind", _words),
            "detail": t.text("Detail"),
        },
        identity="kind",
        matters=("at", "replica"),
    )
