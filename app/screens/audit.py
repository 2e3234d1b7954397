"""Audit: every mutation, sign-in and refusal (admin only; `kneepoint audit` prints the same)."""

from __future__ import annotations

import streamlit as st

from app import auth, data, filters
from app import tables as t

auth.require_page("admin", "The Audit page")
view = filters.current(data.replica_names())
st.title("Audit")
st.caption(
    "Who did what, when and from where: silences created and expired, test messages, runs "
    "imported and deleted, reports sent, sign-ins and every refusal, newest first. Kept "
    "for retention.audit."
)
end = data.now()
entries = data.audit_entries(end - view.range_seconds)
if not entries:
    st.info(f"Nothing was recorded in the last {view.range_label}.")
else:
    t.people_table(
        [e.as_dict() for e in entries],
        {
            "ts": t.time("Time"),
            "actor": t.text("Who"),
            "role": t.text("Role"),
            "via": t.text("Via", help="The web app, the CLI or the API."),
            "address": t.text("From address"),
            "action": t.text("Action"),
            "outcome": t.badge("Outcome"),
            "subject": t.text("Subject"),
            "before": t.text("Before"),
            "after": t.text("After"),
            "detail": t.text("Detail"),
        },
        identity="action",
        matters=("outcome", "ts"),
    )
