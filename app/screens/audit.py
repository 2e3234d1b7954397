"""Audit: every mutation, sign-in and refusal (admin only; `kneepoint audit` prints the same)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import auth, data, filters

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
    table = pd.DataFrame([e.as_dict() for e in entries])
    table["ts"] = pd.to_datetime(table["ts"], unit="s", utc=True)
    for column in ("before", "after"):
        table[column] = table[column].map(lambda v: "" if v is None else str(v))
    st.dataframe(
        table.rename(columns={"ts": "time"})[
            [
                "time",
                "actor",
                "role",
                "via",
                "address",
                "action",
                "outcome",
                "subject",
                "before",
                "after",
                "detail",
            ]
        ],
        hide_index=True,
        width="stretch",
    )
