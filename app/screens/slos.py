"""SLOs: compliance and error budget over each SLO's window, burn rates per alert window."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from alerts.slo import BURN_WINDOWS, window_label
from app import data, filters, insight
from app.format import show

filters.current(data.replica_names())
st.title("SLOs")
st.caption(
    "Latency objectives over the fleet, from vLLM's histograms: the share of requests at or "
    "under the threshold (a bucket bound). Burn rate: the slow share over a window ÷ the share "
    "the objective allows; at 1 the budget lasts exactly the SLO window."
)
reports = data.slo_reports(data.now())
if not reports:
    st.info("No SLO is configured (`slos:` in kneepoint.yaml).")
for r in reports:
    s = r.slo
    goal = f"{s.metric} ≤ {s.threshold:g} s for {s.objective:.2%}"
    st.subheader(f"{s.name}: {goal} over {window_label(s.window)}")
    if r.problem:
        st.error(r.problem)
        continue
    a, b, c = st.columns(3)
    a.metric(
        "Compliance",
        show(r.budget.compliance, "%", 3),
        help="Requests within the threshold ÷ all requests over the SLO window.",
    )
    b.metric(
        "Error budget left",
        show(r.budget.budget_left, "%"),
        help="1 − slow share ÷ allowed share (1 − objective); negative: overspent.",
    )
    c.metric(
        "Burning",
        ", ".join(window_label(w.long) for w in r.burning) or "no",
        help="Alert windows whose long and short burn rates both exceed their factor.",
    )
    if r.burning:  # why it burns (kneepoint/causes.py), and what to do (docs/runbooks.md)
        cause = insight.cause(data.now())
        st.warning(f"Likely cause: {cause.line()} · [runbook](./?page=alerts&rule=slo-burn)")
    rows = [
        {
            "alert window": f"{window_label(w.long)} / {window_label(w.short)}",
            "severity": w.severity,
            "factor": w.factor(s.window),
            "long burn rate": r.rates.get(w.long),
            "short burn rate": r.rates.get(w.short),
            "firing": w in r.burning,
        }
        for w in BURN_WINDOWS
    ]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
