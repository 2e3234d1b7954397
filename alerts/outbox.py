"""Nothing lost, nothing doubled: every notification is a row in the outbox before any
request is made, and leaves the pending state only when the platform took it (sent) or
refused it for good (failed); a silenced or inhibited one is kept as muted. Timeouts, 5xx
and 429 are retried with exponential backoff (honouring Retry-After); pending rows survive a
restart and go out after it; channels with a rate limit (DingTalk, WeCom) are held to it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import httpx
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from alerts import silences
from alerts.channels import Notice, Outgoing, channel
from alerts.engine import FIRING, RESOLVED, Alert, Transition
from kneepoint.config import Config, Rule
from kneepoint.store.models import NotificationRow

FIRST_RETRY = 10.0  # seconds; doubled per attempt
LONGEST_WAIT = 3600.0
# The page that explains a metric (the link in the message).
PAGES = {
    "kv_cache_occupancy": "capacity",
    "requests_waiting": "capacity",
    "requests_waiting_capacity": "capacity",
    "preemptions_per_second": "capacity",
    "recompute_share_of_prefill": "capacity",
    "prefix_cache_hit_rate": "prefix-cache",
    "prefix_cache_hit_rate_drop": "prefix-cache",
    "spec_expected_speedup": "spec-decode",
    "spec_decode_acceptance_rate": "spec-decode",
    "gpu_utilization": "gpus",
    "xid_errors": "gpus",
    "cost_per_million_tokens": "cost",
    "up": "health",
}


@dataclass(frozen=True)
class Result:
    """What a platform answered (status 0: no answer: timeout, refused connection)."""

    status: int
    body: str = ""
    retry_after: float | None = None


Sender = Callable[[Outgoing], Result]


def notice_for(change: Transition, rule: Rule, config: Config, now: float) -> Notice:
    alert = change.alert
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
        runbook=rule.runbook,
        dashboard_url=config.dashboard_url,
        page=PAGES.get(rule.metric, "overview"),
        labels=dict(rule.labels),
    )


def enqueue(
    session: Session,
    config: Config,
    rules: list[Rule],
    changes: list[Transition],
    now: float,
    states: dict[str, Alert] | None = None,
) -> int:
    """Put every firing and every resolution (of an alert that fired) in the outbox, once
    per channel of its rule; a silenced or inhibited one is logged as such and not sent.
    Return how many rows will be sent."""
    by_name = {rule.name: rule for rule in rules}
    configs = {c.name: c for c in config.channels}
    active = silences.load(session)
    added = 0
    groups: dict[tuple[str, str], list[Notice]] = {}  # (rule, status) -> notices to send
    for change in changes:
        # Firing (first time or a repeat_interval reminder), or resolved after it fired.
        news = change.after == FIRING or (change.after == RESOLVED and change.before == FIRING)
        rule = by_name.get(change.alert.rule)
        if not news or rule is None:
            continue
        notice = notice_for(change, rule, config, now)
        labels = silences.labels_of(rule.name, notice.replica, rule.severity, dict(rule.labels))
        why = silences.muted(labels, active, states or {}, now)
        if why is None:
            groups.setdefault((rule.name, notice.status), []).append(notice)
            continue
        for name in rule.channels:  # kept, so the log says why nothing was sent
            row = put(session, name, notice, now)
            row.state, row.last_error = "muted", why
    for (rule_name, _status), notices in groups.items():
        for name in by_name[rule_name].channels:
            spec = configs.get(name)
            grouped = spec is not None and channel(spec).groups and len(notices) > 1
            for notice in [group_of(notices)] if grouped else notices:
                put(session, name, notice, now)
                added += 1
    return added


def group_of(notices: list[Notice]) -> Notice:
    """One notice for the same rule's news on several replicas."""
    first = notices[0]
    members = [
        {"replica": n.replica, "value": n.value, "fingerprint": n.fingerprint} for n in notices
    ]
    return replace(first, members=members, since=min(n.since for n in notices))


def put(session: Session, channel_name: str, notice: Notice, now: float) -> NotificationRow:
    """One notice for one channel into the outbox, due now."""
    row = NotificationRow(
        channel=channel_name,
        fingerprint=notice.fingerprint,
        notice=json.dumps(asdict(notice)),
        state="pending",
        attempts=0,
        next_attempt_at=now,
        created_at=now,
    )
    session.add(row)
    session.flush()  # its id, for whoever waits on it
    return row


def trial_notice(config: Config, channel_name: str, now: float) -> Notice:
    """What `kneepoint alerts test` sends: a message that says it is a test."""
    return Notice(
        fingerprint=f"test-{int(now)}",
        rule="kneepoint-test",
        replica="",
        status=FIRING,
        severity="info",
        value=None,
        threshold=0.0,
        op="==",
        since=now,
        at=now,
        runbook=f"A test of channel {channel_name!r} from kneepoint; nothing is wrong.",
        dashboard_url=config.dashboard_url,
        page="alerts",
    )


def http_sender(timeout: float = 10.0) -> Sender:
    def send(request: Outgoing) -> Result:
        try:
            response = httpx.post(
                request.url,
                json=None if request.content is not None else request.json,
                content=request.content,
                headers=request.headers,
                timeout=timeout,
            )
        except httpx.HTTPError as error:
            return Result(0, f"{type(error).__name__}: {error}")
        after = response.headers.get("Retry-After")
        wait = float(after) if after and after.replace(".", "", 1).isdigit() else None
        return Result(response.status_code, response.text[:500], wait)

    return send


def refusal(kind: str, result: Result) -> str | None:
    """A 200 that still refused the message (the Chinese platforms answer 200 with an error
    code for a bad signature or token)."""
    if kind not in ("feishu", "dingtalk", "wecom") or not result.body:
        return None
    try:
        answer = json.loads(result.body)
    except json.JSONDecodeError:
        return None
    code = answer.get("code", answer.get("errcode", answer.get("StatusCode", 0)))
    return None if code in (0, None) else f"refused: {result.body[:200]}"


def deliver_due(session: Session, config: Config, now: float, send: Sender) -> dict[str, int]:
    """Send what is due, committing each outcome as it is known; count what was sent, what
    waits for a retry, what was refused, and what a rate limit held back."""
    counts = {"sent": 0, "retry": 0, "failed": 0, "held": 0}
    configs = {c.name: c for c in config.channels}
    due = session.scalars(
        select(NotificationRow)
        .where(NotificationRow.state == "pending", NotificationRow.next_attempt_at <= now)
        .order_by(NotificationRow.id)
    ).all()
    for row in due:
        spec = configs.get(row.channel)
        if spec is None:
            _fail(row, f"channel {row.channel!r} is no longer configured")
            counts["failed"] += 1
            continue
        target = channel(spec)
        if target.per_minute is not None:
            recent = session.scalar(
                select(func.count())
                .select_from(NotificationRow)
                .where(
                    NotificationRow.channel == row.channel,
                    NotificationRow.sent_at > now - 60,
                )
            )
            if (recent or 0) >= target.per_minute:
                row.next_attempt_at = now + 60 / target.per_minute
                counts["held"] += 1
                continue
        try:
            request = target.request(Notice(**json.loads(row.notice)), now)
        except ValueError as error:  # the channel's config lacks what it needs
            _fail(row, str(error))
            counts["failed"] += 1
            continue
        result = send(request)
        row.attempts += 1
        refused = refusal(spec.type, result) if 200 <= result.status < 300 else None
        if 200 <= result.status < 300 and refused is None:
            row.state, row.sent_at, row.last_error = "sent", now, None
            counts["sent"] += 1
        elif result.status in (0, 408, 429) or result.status >= 500:
            backoff = min(FIRST_RETRY * 2 ** (row.attempts - 1), LONGEST_WAIT)
            row.next_attempt_at = now + max(backoff, result.retry_after or 0.0)
            row.last_error = (
                f"HTTP {result.status}: {result.body[:200]}" if result.status else result.body
            )
            counts["retry"] += 1
        else:
            _fail(row, refused or f"HTTP {result.status}: {result.body[:200]}")
            counts["failed"] += 1
        session.commit()  # each outcome is kept the moment it is known
    session.commit()
    return counts


def _fail(row: NotificationRow, reason: str) -> None:
    row.state, row.last_error = "failed", reason


def channel_health(session: Session) -> dict[str, str]:
    """Per channel: "broken" when its latest settled notification was refused, else "ok"."""
    rows = session.scalars(
        select(NotificationRow)
        .where(NotificationRow.state.in_(["sent", "failed"]))
        .order_by(NotificationRow.id)
    ).all()
    health: dict[str, str] = {}
    for row in rows:
        health[row.channel] = "broken" if row.state == "failed" else "ok"
    return health


def send_trial(
    sessions: sessionmaker[Session], config: Config, channel_name: str, now: float
) -> tuple[str, str | None]:
    """A test message to one channel through the outbox, sent now: its state and error."""
    with sessions.begin() as session:
        row_id = put(session, channel_name, trial_notice(config, channel_name, now), now).id
    with sessions() as session:
        deliver_due(session, config, now, http_sender())
        row = session.get(NotificationRow, row_id)
        return (row.state, row.last_error) if row else ("missing", None)
