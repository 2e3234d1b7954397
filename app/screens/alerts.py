"""Alerts: what fires and what is pending now, and every state change in the time range."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from alerts.rules import effective_rules
from alerts.slo import burn_rules
from app import actions, data, filters, insight
from app import tables as t
from app.format import metric_text, metric_unit, metric_value
from kneepoint import causes, runbooks
from kneepoint.auth import Refused

view = filters.current(data.replica_names())
st.title("Alerts")
st.caption(
    "Rules over the numbers the other pages show (last 5 minutes; drops against the last "
    "hour), evaluated every evaluation_interval by `kneepoint serve` or `kneepoint alerts "
    "eval`. Pending: breaching, waiting out its `for:`. Firing and resolved alerts go to their "
    "rules' channels through an outbox that retries until the platform takes or refuses them."
)
asked = st.query_params.get("rule")  # the link in every alert message: its runbook first
if asked:
    section = runbooks.section_for(asked)
    if section is None:
        st.warning(f"No runbook for rule {asked!r}: a rule of the config's own.")
    else:
        st.markdown(runbooks.section(section).replace("## ", f"### Runbook: {asked} · ", 1))
end = data.now()
current, history = data.alerts(end - view.range_seconds, end)
config, _ = data.store()
rules = {r.name: r for r in (*effective_rules(config), *burn_rules(config.slos))}


def _readable(frame: pd.DataFrame) -> pd.DataFrame:
    """Each alert's value (and threshold) in its metric's unit, and its rule's severity."""
    units = [metric_unit(rules[r].metric) if r in rules else "" for r in frame.rule]
    readable = frame.assign(
        severity=[rules[r].severity if r in rules else None for r in frame.rule],
        value=[metric_text(v, u) for v, u in zip(frame.value, units, strict=True)],
    )
    if "threshold" in frame:
        readable["threshold"] = [
            f"{rules[r].op} {metric_value(x, u)}" if r in rules else metric_value(x, u)
            for r, x, u in zip(frame.rule, frame.threshold, units, strict=True)
        ]
    return readable


firing = current[current.state == "firing"]
pending = current[current.state == "pending"]
a, b = st.columns(2)
a.metric("Firing", len(firing), help="Alerts whose condition held for their whole `for:`.")
b.metric("Pending", len(pending), help="Breaching now, not yet for their whole `for:`.")
if current.empty:
    st.success("Nothing is firing or pending.")
else:
    shown = _readable(current).assign(
        since=current.fired_at.where(current.state == "firing", current.pending_since)
    )
    t.people_table(
        shown,
        {
            "state": t.badge("State"),
            "severity": t.badge("Severity"),
            "rule": t.text("Rule"),
            "replica": t.text("Replica"),
            "value": t.text("Value", help="The rule's number now, in its unit."),
            "threshold": t.text("Threshold", help="The rule's condition."),
            "since": t.time("Since", help="Firing: when it fired. Pending: when it began."),
        },
        identity="rule",
        matters=("state", "value"),
    )
    st.subheader("Likely causes")
    st.caption(
        "Per firing or pending alert, the likely cause over the last 15 minutes with its "
        "evidence: upstream (a stalled engine), hardware (XID, GPU events), software (a "
        "restart, config change or deploy in the hour before the alert went pending, or "
        "before an SLO burn's window began), load (concurrency at or past "
        "the knee), capacity (KV saturated, waiting for capacity, preemptions), else unknown."
    )
    # Every alert's cause in one cached call per data version (warmed for each new one).
    found = insight.alert_causes(end)
    for alert in current.itertuples():
        cause = found.get(str(alert.fingerprint))
        if cause is None:  # stored after the causes were read: its own, as of the same `end`
            replica = None if alert.replica == "fleet" else str(alert.replica)
            metric = rules[alert.rule].metric if alert.rule in rules else ""
            pending = alert.pending_since  # a Timestamp (app/data.py made the times readable)
            pending_since = None if pd.isna(pending) else pd.Timestamp(pending).timestamp()
            # Only the changes before its trouble began (its burn window, or when it went
            # pending).
            cause = insight.cause(end, replica, causes.onset(metric, end, pending_since))
        link = runbooks.url(".", str(alert.rule))  # relative: works under any base path
        book = f" · [runbook]({link})" if link else ""
        st.markdown(f"**{alert.rule}** on {alert.replica} ({alert.state}): {cause.line()}{book}")
st.subheader(f"State changes, last {view.range_label}")
if history.empty:
    st.info("No alert changed state in this time range.")
else:
    t.people_table(
        _readable(history),
        {
            "ts": t.time("Time"),
            "rule": t.text("Rule"),
            "replica": t.text("Replica"),
            "before": t.badge("From"),
            "after": t.badge("To"),
            "value": t.text("Value", help="The rule's number at the change, in its unit."),
        },
        identity="rule",
        matters=("after", "ts"),
    )

log, health = data.deliveries(end - view.range_seconds, end)
st.subheader("Channels")
if not health:
    st.info("No channel is configured (`channels:` in kneepoint.yaml).")
else:
    for column, (name, state) in zip(st.columns(len(health)), health.items(), strict=True):
        column.metric(
            name,
            state,
            help="broken: its latest message was refused (bad URL, token or signature).",
        )
        if column.button("Send a test message", key=f"test-{name}", help="Needs operator."):
            try:
                column.write(actions.send_test(name))
            except Refused as refused:
                column.error(str(refused))
st.subheader(f"Delivery log, last {view.range_label}")
if log.empty:
    st.info("Nothing was sent in this time range.")
else:
    t.people_table(
        log,
        {
            "created_at": t.time("Created"),
            "channel": t.text("Channel"),
            "state": t.badge("State"),
            "attempts": t.number("Attempts", digits=0),
            "sent_at": t.time("Sent", absolute=False),
            "next_attempt_at": t.time("Next attempt", absolute=False),
            "last_error": t.text("Last error"),
            "fingerprint": t.text("Alert fingerprint", help="Which alert (rule and replica)."),
        },
        identity="channel",
        matters=("state", "created_at"),
    )

st.subheader("Runbooks")
st.caption(
    "What each built-in rule's numbers mean, the likely causes and the one command or knob "
    "for each (docs/reference/runbooks.md). Every alert message links here with its rule."
)
names = list(runbooks.RUNBOOKS)
chosen = runbooks.section_for(asked) if asked else None
picked = st.selectbox(
    "Rule", names, index=names.index(chosen) if chosen in names else 0, key="runbook-rule"
)
with st.expander(f"Runbook: {picked}", expanded=False):
    st.markdown(runbooks.section(picked))

st.subheader("Silences")
every_silence = data.silence_list()
# Not the rounded `end`: a silence expired a moment ago (the Expire button reruns the page
# within the same second) has ended and is no longer offered for expiry.
moment = time.time()
active = [s for s in every_silence if s.ends_at > moment]
if not active:
    st.caption("No silence is active or scheduled.")
for silence in active:
    left, right = st.columns([4, 1])
    matchers = ", ".join(f"{k}={v}" for k, v in silence.matchers.items())
    left.text(f"#{silence.id} {matchers}, {silence.author}: {silence.comment}")  # typed text
    if right.button("Expire", key=f"expire-{silence.id}", help="Needs operator."):
        try:
            actions.expire_silence(silence.id)
        except Refused as refused:
            right.error(str(refused))
        else:
            st.rerun()
limit = data.limits().silence_max / 3600
with st.form("new-silence"):
    st.caption(
        "Alerts whose labels (alertname, replica, severity, and the rule's own) match "
        "every matcher send nothing while the silence lasts. Needs the operator role; one "
        "that names no alertname and no replica needs admin. You are its author."
    )
    matchers = st.text_input("Matchers", placeholder="alertname=kv-cache-saturated, replica=qwen-a")
    hours = st.number_input(
        "Hours", min_value=0.25, max_value=limit, value=min(2.0, limit), step=0.25
    )
    comment = st.text_input("Comment (required)")
    if st.form_submit_button("Silence"):
        try:
            number = actions.create_silence(matchers, hours, comment)
        except (ValueError, Refused) as error:
            st.error(str(error))
        else:
            st.success(f"Silence #{number} created.")

ended = [s for s in every_silence if s.ends_at <= moment]
if ended:
    with st.expander(f"Ended silences ({len(ended)}, kept for retention.silences)"):
        t.people_table(
            [
                {
                    "id": f"#{s.id}",
                    "matchers": ", ".join(f"{k}={v}" for k, v in s.matchers.items()),
                    "author": s.author,
                    "comment": s.comment,
                    "ended": s.ends_at,
                }
                for s in reversed(ended)
            ],
            {
                "id": t.text("Silence"),
                "matchers": t.text("Matchers"),
                "author": t.text("Author"),
                "comment": t.text("Comment"),
                "ended": t.time("Ended"),
            },
            identity="id",
            matters=("ended", "matchers"),
        )
