"""What an alert's message says, composed before it goes to the outbox: the news of each
transition (`notice_for`), a firing page's likely cause (kneepoint/causes.py) and the
timeline's changes before it (kneepoint/timeline.py), read ahead of the evaluation's writes
(`read_ahead`); then `enqueue` puts each message in the outbox (alerts/outbox.py), muted where
a silence or an inhibition covers it, grouped where its channel groups. The path points one
way: the evaluation composes here, this reads the status and the timeline, and the outbox
below only queues and delivers."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from sqlalchemy.orm import Session

from alerts import silences
from alerts.channels import Notice, channel
from alerts.lifecycle import FIRING, RESOLVED, Alert, Transition
from alerts.outbox import put, view_of
from kneepoint import catalogue, causes, runbooks, timeline
from kneepoint.config import Config, Rule
from kneepoint.timeline import Event

log = logging.getLogger(__name__)

CHANGES_BEFORE = 3600.0  # a firing message lists the timeline's events this long before it
MAX_CHANGES = 10  # the newest ones


def notice_for(
    change: Transition,
    rule: Rule,
    config: Config,
    now: float,
    engine_since: dict[str, float] | None = None,
) -> Notice:
    """The news of one transition. An ending with a note (the replica's engine no longer
    exposes the rule's metric) carries the note, and when that engine was first seen
    (`engine_since`: replica -> epoch seconds, alerts.values.engine_since) where that was
    after the alert began: an engine seen before it is no change that ended it."""
    alert = change.alert
    note = (change.note or "") if change.after == RESOLVED else ""
    began = alert.pending_since if alert.pending_since is not None else alert.fired_at
    changed = (engine_since or {}).get(alert.replica) if note else None
    if changed is not None and (began is None or changed <= began):
        changed = None
    return Notice(
        fingerprint=alert.fingerprint,
        rule=rule.name,
        replica=alert.replica,
        status=change.after,
        severity=rule.severity,
        value=alert.value,
        threshold=rule.threshold,
        op=rule.op,
        since=alert.fired_at or now,
        at=now,
        runbook=runbook_line(rule, config),
        dashboard_url=config.dashboard_url,
        page=view_of(rule.metric)[0],
        slo=view_of(rule.metric)[1],
        labels=dict(rule.labels),
        note=note,
        engine_since=changed,
    )


def enqueue(
    session: Session,
    config: Config,
    rules: list[Rule],
    changes: list[Transition],
    now: float,
    states: dict[str, Alert] | None = None,
    ahead: ReadAhead | None = None,
    engine_since: dict[str, float] | None = None,
) -> int:
    """Put every firing and every resolution (of an alert that fired) in the outbox, once
    per channel of its rule; a silenced or inhibited one is logged as such and not sent.
    Return how many rows will be sent. `ahead`: the messages' reads done before the caller
    wrote anything (read_ahead). An ending without a recovery carries its transition's note
    (and `engine_since`: notice_for), and is grouped only with endings of the same why."""
    by_name = {rule.name: rule for rule in rules}
    configs = {c.name: c for c in config.channels}
    active = silences.load(session)
    added = 0
    # (rule, status, note, engine first seen) -> notices to send: one message never mixes
    # recoveries with endings that are none, nor endings for different reasons.
    groups: dict[tuple[str, str, str, float | None], list[Notice]] = {}
    ahead = ahead or ReadAhead()
    seen, known = ahead.seen, ahead.known
    for change in changes:
        # Firing (first time or a repeat_interval reminder), or resolved after it fired.
        news = change.after == FIRING or (change.after == RESOLVED and change.before == FIRING)
        rule = by_name.get(change.alert.rule)
        if not news or rule is None:
            continue
        notice = notice_for(change, rule, config, now, engine_since)
        if notice.status == FIRING:
            notice = replace(notice, changes=changes_before(session, config, notice, seen))
            if rule.severity == "page" or catalogue.burn_slo(rule.metric) is not None:
                began = causes.onset(rule.metric, now, change.alert.pending_since)
                cause = cause_of(session, config, notice, now, known, began)
                notice = replace(notice, cause=cause)
        labels = silences.labels_of(rule.name, notice.replica, rule.severity, dict(rule.labels))
        why = silences.muted(labels, active, states or {}, now)
        if why is None:
            key = (rule.name, notice.status, notice.note, notice.engine_since)
            groups.setdefault(key, []).append(notice)
            continue
        for name in rule.channels:  # kept, so the log says why nothing was sent
            row = put(session, name, notice, now)
            row.state, row.last_error = "muted", why
    for (rule_name, *_), notices in groups.items():
        for name in by_name[rule_name].channels:
            spec = configs.get(name)
            grouped = spec is not None and channel(spec).groups and len(notices) > 1
            for notice in [group_of(notices)] if grouped else notices:
                put(session, name, notice, now)
                added += 1
    return added


@dataclass
class ReadAhead:
    """The reads firing messages make: timeline events per replica and time, and the
    cause's signals (once per evaluation)."""

    seen: dict[tuple[str, float], list[Event]] = field(default_factory=dict)
    known: dict[str, causes.Signals | None] = field(default_factory=dict)


def read_ahead(
    session: Session, config: Config, rules: list[Rule], changes: list[Transition], now: float
) -> ReadAhead:
    """Make the timeline and cause reads of the firing messages `changes` would send, before
    the evaluation writes anything. On SQLite the first write takes the database's write
    lock until the commit, and these reads (a view of the fleet, an hour of timeline) then
    held it for seconds: long enough, on a loaded machine, for a scrape round to fail with
    `database is locked` in the round where alerts fired."""
    ahead = ReadAhead()
    by_name = {rule.name: rule for rule in rules}
    for change in changes:
        rule = by_name.get(change.alert.rule)
        if change.after != FIRING or rule is None:
            continue
        notice = notice_for(change, rule, config, now)
        changes_before(session, config, notice, ahead.seen)
        if rule.severity == "page" or catalogue.burn_slo(rule.metric) is not None:
            began = causes.onset(rule.metric, now, change.alert.pending_since)
            cause_of(session, config, notice, now, ahead.known, began)
    return ahead


def runbook_line(rule: Rule, config: Config) -> str:
    """The rule's runbook line and the link to its section on the Alerts page
    (kneepoint/runbooks.py, docs/reference/runbooks.md), where it has one."""
    link = runbooks.url(config.dashboard_url, rule.name)
    return f"{rule.runbook} {link}".strip() if link else rule.runbook


def cause_of(
    session: Session,
    config: Config,
    notice: Notice,
    now: float,
    known: dict[str, causes.Signals | None],
    began: causes.Onset | None = None,
) -> str:
    """The likely cause with its evidence (kneepoint/causes.py) for a page or an SLO burn:
    the alert's replica, or the whole fleet for a fleet alert, weighing only the changes
    before its trouble began (`began`: causes.onset; None: now). The replicas' signals are
    read once per evaluation, the changes once per onset; signals that cannot be read cost
    the line, never the message."""
    began = began or causes.Onset(now)
    if "signals" not in known:
        try:
            with session.begin_nested():
                known["signals"] = causes.gather(session, config, now)
        except Exception:
            log.exception("reading the likely cause's signals failed")
            known["signals"] = None
    signals = known["signals"]
    if signals is None:
        return ""
    if began.at < now:  # another hour of changes: the one before this trouble's onset
        key = f"signals@{began.at}"
        if key not in known:
            with session.begin_nested():
                events = causes.changes_before(session, config, began.at)
            known[key] = replace(signals, events=events)
        signals = known[key] or signals
    return causes.classify(signals, notice.replica or None, began).line()


def changes_before(
    session: Session,
    config: Config,
    notice: Notice,
    seen: dict[tuple[str, float], list[Event]],
) -> tuple[str, ...]:
    """The timeline's events on the alert's replica (all, for a fleet alert) in the
    CHANGES_BEFORE seconds before it fired, newest MAX_CHANGES, one line each; not the
    alert's own firing. A timeline that cannot be read costs the lines, never the message."""
    key = (notice.replica, notice.since)
    if key not in seen:
        try:
            with session.begin_nested():
                seen[key] = timeline.events(
                    session,
                    config,
                    notice.since - CHANGES_BEFORE,
                    notice.since,
                    notice.replica or None,
                )
        except Exception:
            log.exception("reading the timeline for %s failed", notice.where)
            seen[key] = []
    own = f"{notice.rule} fired"
    found = [
        e
        for e in seen[key]
        if not (e.kind == "alert_firing" and e.detail.startswith(own) and e.at == notice.since)
    ]
    lines = [event.line() for event in found[-MAX_CHANGES:]]
    if len(found) > MAX_CHANGES:
        lines.insert(0, f"({len(found) - MAX_CHANGES} earlier not shown)")
    return tuple(lines)


def group_of(notices: list[Notice]) -> Notice:
    """One notice for the same rule's news on several replicas."""
    first = notices[0]
    members = [
        {"replica": n.replica, "value": n.value, "fingerprint": n.fingerprint} for n in notices
    ]
    changes = tuple(dict.fromkeys(line for n in notices for line in n.changes))
    return replace(first, members=members, since=min(n.since for n in notices), changes=changes)
