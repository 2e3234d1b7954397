"""SLOs: compliance and error budget over each SLO's window, burn rates per alert window, and
the maintenance windows budgets leave out."""

from __future__ import annotations

from datetime import UTC, datetime

import streamlit as st

from alerts import maintenance
from alerts.slo import BURN_WINDOWS, window_label
from alerts.slo_replay import replay_proposal
from app import data, filters, insight
from app import tables as t
from app.format import clock, show
from kneepoint import causes
from kneepoint.config import Maintenance

filters.current(data.replica_names())
st.title("SLOs")
st.caption(
    "Latency objectives over the fleet, from vLLM's histograms: the share of requests at or "
    "under the threshold (a bucket bound). Availability objectives: the share of requests that "
    "did not fail (finished in error or aborted, or a 5xx from the API server) with stalled "
    "engine time counted as wholly failed. Burn rate: the bad share over a window ÷ the share "
    "the objective allows; at 1 the budget lasts exactly the SLO window. Budgets and burn "
    "rates leave maintenance windows out (below)."
)
now = data.now()
reports = data.slo_reports(now)
if reports:
    st.caption(
        f"As of {clock(data.slo_minute(now), now)}: recomputed each minute, as the burn-rate "
        "alerts are."
    )
asked = st.query_params.get("slo")  # an SLO's burn-rate alert links here with its SLO: first
reports = sorted(reports, key=lambda r: r.slo.name != asked)
if not reports:
    st.info("No SLO is configured (`slos:` in kneepoint.yaml).")
# Every burning SLO's likely cause in one cached call per data version (warmed for each new
# one: its onset moves with the tick); only asked for when one burns.
found = insight.slo_causes(now) if any(r.burning for r in reports) else {}
for r in reports:
    s = r.slo
    if s.kind == "availability":
        goal = f"availability ≥ {s.objective:.2%}"
    else:
        goal = f"{s.metric} ≤ {s.threshold:g} s for {s.objective:.2%}"
    st.subheader(f"{s.name}: {goal} over {window_label(s.window)}")
    if r.problem:
        st.error(r.problem)
        continue
    a, b, c = st.columns(3)
    a.metric(
        "Compliance",
        show(r.budget.compliance, "%", 3),
        help="Requests within the threshold (availability: that did not fail, stalled time "
        "counted as failed) ÷ all requests over the SLO window, maintenance windows left out.",
    )
    b.metric(
        "Error budget left",
        show(r.budget.budget_left, "%"),
        help="1 − bad share ÷ allowed share (1 − objective); negative: overspent. "
        "Maintenance windows are left out.",
    )
    c.metric(
        "Burning",
        ", ".join(window_label(w.long) for w in r.burning) or "no",
        help="Alert windows whose long and short burn rates both exceed their factor.",
    )
    if r.burning:  # why it burns (kneepoint/causes.py), and what to do (docs/reference/runbooks.md)
        cause = found.get(s.name)
        if cause is None:  # not among the cached reports' burns (never expected): its own
            began = causes.burn_onset(now, [w.long for w in r.burning])  # the changes before
            cause = insight.cause(now, None, began)
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
    t.people_table(
        rows,
        {
            "alert window": t.text("Window", help="The alert's long window / short window."),
            "severity": t.badge("Severity"),
            "factor": t.ratio(
                "Fires above", "budget", help="Both burn rates must exceed this factor."
            ),
            "long burn rate": t.ratio(
                "Long-window burn", "budget", help="1× spends the budget in exactly the SLO window."
            ),
            "short burn rate": t.ratio("Short-window burn", "budget"),
            "firing": t.yes_no("Firing"),
        },
        identity="alert window",
        matters=("firing", "long burn rate"),
    )


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _schedule(window: Maintenance) -> str:
    if window.cron is not None and window.duration is not None:
        return f"cron {window.cron} (UTC) for {window_label(window.duration)}"
    assert window.start is not None and window.end is not None
    return f"{_when(window.start.timestamp())} to {_when(window.end.timestamp())}"


windows = data.store()[0].maintenance  # `maintenance:` in kneepoint.yaml
if windows:
    st.subheader("Maintenance windows")
    st.caption(
        "While a window lasts, its replicas' alerts are evaluated but not sent (fleet-wide "
        "alerts, such as SLO burn rates, only under a window over every replica), and its time "
        "is left out of every SLO's error budget and burn rates."
    )
    for occurrence in maintenance.active(windows, now):
        st.warning(
            f"In maintenance now: {occurrence.name} until {_when(occurrence.end)}, "
            f"over {', '.join(occurrence.replicas) or 'every replica'}."
        )
    coming = maintenance.next_one(windows, now)
    st.info(
        f"Next: {coming.name} from {_when(coming.start)} to {_when(coming.end)}."
        if coming
        else "No window to come."
    )
    t.people_table(
        [
            {
                "window": w.name,
                "when": _schedule(w),
                "replicas": ", ".join(w.replicas) or "all",
                "now": any(o.name == w.name for o in maintenance.active(windows, now)),
            }
            for w in windows
        ],
        {
            "window": t.text("Window"),
            "when": t.text("When"),
            "replicas": t.text("Replicas"),
            "now": t.yes_no("Now", help="In maintenance now."),
        },
        identity="window",
        matters=("now", "when"),
    )


st.subheader("Replay a proposed SLO")
st.caption(
    "Would this SLO have been met over the stored history? Its compliance, the error budget it "
    "would have spent and the burn-rate alerts that would have fired (every 5 minutes), beside "
    "each configured SLO of the same kind and metric over the same window. A threshold between "
    "two bucket bounds gets the exact compliance at both bounds and an interpolated estimate."
)
with st.form("replay"):
    kind = st.selectbox("Kind", ["latency", "availability"])
    metric = st.selectbox("Metric (latency)", ["ttft", "itl", "e2e", "queue"])
    threshold = st.text_input("Threshold (latency)", "450ms")
    objective = st.number_input("Objective (%)", 0.001, 99.999, 99.5, format="%.3f")
    span = st.text_input("Window", "28d")
    asked_replay = st.form_submit_button("Replay")
if asked_replay:
    try:
        proposal = replay_proposal(kind, metric, threshold, objective, span)
    except ValueError as error:
        st.error(f"Not a valid SLO: {error}")
    else:
        for replayed in data.slo_replay(proposal, now, proposal.window):
            c, spent = replayed["compliance"], replayed["budget_spent"]
            st.markdown(f"**{replayed['role']}: {replayed['name']}**")
            if replayed["problem"]:
                st.warning(f"Cannot be judged: {replayed['problem']}")
                continue
            if c["exact"] is not None:
                a, b = st.columns(2)
                a.metric("Compliance (exact)", show(c["exact"], "%", 3))
                b.metric("Error budget spent", show(spent["exact"], "%"))
            else:
                a, b, e = st.columns(3)
                a.metric(f"Compliance at {c['lower_bound']:g} s", show(c["at_lower_bound"], "%", 3))
                b.metric(f"Compliance at {c['upper_bound']:g} s", show(c["at_upper_bound"], "%", 3))
                e.metric("Interpolated estimate", show(c["interpolated_estimate"], "%", 3))
                st.caption(
                    "The threshold is between two bucket bounds: the two are exact counts, the "
                    "interpolated estimate (linear within the bucket) is not."
                )
            for key, found in (replayed["alerts"] or {}).items():
                where = "" if key == "exact" else f" ({key.replace('_', ' ')})"
                fired = [
                    f"{f['severity']} {f['long_window']}/{f['short_window']} from "
                    f"{_when(f['start'])} to {_when(f['end']) if f['end'] else 'the end'}"
                    for f in found
                ]
                st.write(
                    f"Burn-rate alerts{where}: " + ("; ".join(fired) or "none would have fired")
                )
