"""The outbox: every notification is a row before any request is made, and each row is sent
by one sender at a time, in order per channel and alert.

What it promises, exactly:

- At least once. A row leaves `pending` only as `sent` (a 2xx the platform did not refuse),
  `failed` (refused for good: a 4xx other than 408/429, a 200 with an error code, an invalid
  or unsupported URL, a message that cannot be built, an unexpected error while sending it),
  `muted` (silenced or inhibited, never sent), `superseded` (a later row on the same channel
  carries news of all its alerts) or `expired` (a firing message still unsent after the
  channel's `max_age`, logged). Refused connections, the deadline, 408, 429 and 5xx are
  retried with exponential backoff (Retry-After honoured, up to an hour); pending rows
  survive a restart.
- One sender per row. A sender claims rows in one short transaction (`BEGIN IMMEDIATE` on
  SQLite, `SELECT … FOR UPDATE SKIP LOCKED` on PostgreSQL): a lease, `claimed_by` and
  `claimed_until`. No one else sends a row while its lease runs (the collector's deliver
  job, `kneepoint alerts eval`, the app's test button alike); a lease left by a sender that
  died expires and the row is taken over.
- Duplicates only where the outcome of a send was never known: the sender died between the
  request and the commit of its outcome, or the platform did not answer within the deadline.
  Such a row keeps `maybe_sent` set, and its next send is counted in `resends` (an upper
  bound: a sender that died before its request also counts). Every request carries an
  `Idempotency-Key` header, `kneepoint-<row id>-<created ms>`, the same on every retry; the
  generic webhook's receivers can use it. PagerDuty deduplicates by `dedup_key` (the alert's
  fingerprint) and Alertmanager by the alert's labels, so re-sends to them are harmless; the
  chat platforms have no such key and would show a duplicate.
- Order per (channel, alert): a row is sent only when no earlier row carrying one of its
  alerts is still pending on that channel; a newer row supersedes an older unsent one, so an
  alert's resolution never goes out before, or without replacing, its unsent firing. A
  muted firing (silenced or inhibited when it was made) supersedes nothing: the unsent
  firing before it is still sent.
- Bounded: one send takes at most its deadline (alerts/channels/send.py); channels are sent
  at the same time (each channel's rows one after another); a channel that does not answer
  gives up its other rows for the round, and no send starts after two deadlines, so a round
  lasts at most three deadlines however slow a channel is, and holds no other channel."""

from __future__ import annotations

import json
import logging
import queue
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from alerts.channels import Notice, Outgoing, channel
from alerts.channels.send import DEADLINE, Result, Sender, http_sender, scrub, where
from alerts.lifecycle import FIRING
from kneepoint import catalogue
from kneepoint.config import Channel as ChannelConfig
from kneepoint.config import Config, url_problem
from kneepoint.secrets import scrub as scrub_secrets
from kneepoint.store.models import NotificationRow

__all__ = [
    "Result",
    "Sender",
    "channel_health",
    "deliver_due",
    "http_sender",
    "put",
    "send_trial",
]

log = logging.getLogger(__name__)

FIRST_RETRY = 10.0  # seconds; doubled per attempt
LONGEST_WAIT = 3600.0
LEASE_MARGIN = 60.0  # a lease outlives the sends it covers by this much (the commit after)
PER_ROUND = 20  # rows per channel per round; the rest wait for the next round
ROUND_BUDGET = 2  # deadlines: after this long a round starts no new send
MAX_PENDING = 1000  # pending rows looked at per round, oldest first
COUNTS = ("sent", "retry", "failed", "held", "superseded", "expired")
# The page that explains a metric (the link in the message; the Overview's alert list too).
PAGES = catalogue.pages()


def view_of(metric: str) -> tuple[str, str]:
    """The page that explains a rule's metric, and the SLO it is about ("" but for an SLO's
    burn rate, which the SLOs page explains)."""
    slo = catalogue.burn_slo(metric)
    if slo is not None:
        return "slos", slo
    return PAGES.get(metric, "overview"), ""


def put(session: Session, channel_name: str, notice: Notice, now: float) -> NotificationRow:
    """One notice for one channel into the outbox, due now."""
    keys = [str(m["fingerprint"]) for m in notice.members] or [notice.fingerprint]
    row = NotificationRow(
        channel=channel_name,
        fingerprint=notice.fingerprint,
        notice=json.dumps(asdict(notice)),
        state="pending",
        attempts=0,
        next_attempt_at=now,
        created_at=now,
        maybe_sent=False,
        resends=0,
        alert_keys=" ".join(keys),
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


def refusal(kind: str, result: Result) -> str | None:
    """A 200 that still refused the message (the Chinese platforms answer 200 with an error
    code for a bad signature or token)."""
    if kind not in ("feishu", "dingtalk", "wecom") or not result.body:
        return None
    try:
        answer = json.loads(result.body)
    except json.JSONDecodeError:
        return None
    if not isinstance(answer, dict):
        return None
    code = answer.get("code", answer.get("errcode", answer.get("StatusCode", 0)))
    return None if code in (0, None) else f"refused: {scrub_secrets(result.body)[:200]}"


class Refused(Exception):
    """A row that can never be sent as it is (its message or URL); the reason is safe to
    store and show."""


@dataclass
class Claim:
    """A row this sender holds, and the request that delivers it."""

    row_id: int
    channel: str
    kind: str
    request: Outgoing
    maybe_sent_before: bool  # an earlier send's outcome was never known
    result: Result | None = field(default=None)


def deliver_due(
    session: Session, config: Config, now: float, send: Sender, deadline: float = DEADLINE
) -> dict[str, int]:
    """One delivery round: claim what is due, send it (channels at the same time), and
    commit each outcome the moment it is known. Count each outcome of the round."""
    counts = dict.fromkeys(COUNTS, 0)
    token = uuid.uuid4().hex
    claims = _claim_due(session, config, now, token, deadline, counts)
    by_channel: dict[str, list[Claim]] = {}
    for claim in claims:
        by_channel.setdefault(claim.channel, []).append(claim)
    for claim in _send_all(by_channel, send, ROUND_BUDGET * deadline):
        _settle(session, claim, token, now, counts)
    return counts


def _send_all(
    by_channel: dict[str, list[Claim]], send: Sender, budget: float = float("inf")
) -> Iterable[Claim]:
    """Each channel's rows in order on its own thread; yield each claim as its send ends. A
    claim whose `result` is None was given up unsent: its channel did not answer, or the
    round had used its `budget` of seconds, so a slow channel holds no later round long."""
    if not by_channel:
        return
    done: queue.Queue[Claim] = queue.Queue()
    began = time.monotonic()

    def one_channel(claims: list[Claim]) -> None:
        answered = True
        for claim in claims:
            if answered and time.monotonic() - began < budget:
                try:
                    claim.result = send(claim.request)
                except Exception as error:  # this row only: refused, with why
                    text_ = scrub(f"{type(error).__name__}: {error}", claim.request.url)
                    claim.result = Result(0, text_, permanent=True)
                answered = claim.result.status != 0 or claim.result.permanent
            done.put(claim)

    total = sum(len(c) for c in by_channel.values())
    with ThreadPoolExecutor(max_workers=min(len(by_channel), 16)) as pool:
        for claims in by_channel.values():
            pool.submit(one_channel, claims)
        for _ in range(total):
            yield done.get()


def _lock(session: Session) -> str:
    """Start the claiming transaction; on SQLite it takes the write lock first, so claims
    are decided on what no other sender can change meanwhile."""
    session.commit()
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        session.execute(text("BEGIN IMMEDIATE"))
    return dialect


def _claim_due(
    session: Session,
    config: Config,
    now: float,
    token: str,
    deadline: float,
    counts: dict[str, int],
) -> list[Claim]:
    free = (NotificationRow.claimed_until.is_(None)) | (NotificationRow.claimed_until <= now)
    workable = select(NotificationRow.id).where(NotificationRow.state == "pending", free)
    if session.scalar(workable.limit(1)) is None:  # nothing to decide: take no write lock
        session.commit()
        return []
    dialect = _lock(session)
    query = (
        select(NotificationRow)
        .where(NotificationRow.state == "pending")
        .order_by(NotificationRow.id)
        .limit(MAX_PENDING)
    )
    if dialect == "postgresql":  # rows another sender is deciding on are left to it
        query = query.with_for_update(skip_locked=True)
    mine = list(session.scalars(query))
    if not mine:
        session.commit()
        return []
    first, last = mine[0].id, mine[-1].id
    # Every pending row up to the last of mine, locked by me or not: they hold back the later
    # rows of their alerts.
    waiting = session.execute(
        select(
            NotificationRow.id,
            NotificationRow.channel,
            NotificationRow.fingerprint,
            NotificationRow.alert_keys,
        ).where(NotificationRow.state == "pending", NotificationRow.id <= last)
    ).all()
    holding: dict[tuple[str, str], list[int]] = {}
    for row_id, name, fingerprint, keys in waiting:
        for key in _keys(fingerprint, keys):
            holding.setdefault((name, key), []).append(row_id)
    # The newest row of each (channel, alert) since the oldest of mine, whatever its state,
    # but for a muted firing: it carries no news to the channel, so it must not take the
    # place of an unsent firing (that news was due when it was made). A muted resolution
    # does: the alert is over, and its end is muted.
    newest: dict[tuple[str, str], int] = {}
    for row_id, name, fingerprint, keys, state, notice in session.execute(
        select(
            NotificationRow.id,
            NotificationRow.channel,
            NotificationRow.fingerprint,
            NotificationRow.alert_keys,
            NotificationRow.state,
            NotificationRow.notice,
        ).where(NotificationRow.id > first, NotificationRow.channel.in_({r.channel for r in mine}))
    ):
        if state == "muted" and json.loads(notice).get("status") == FIRING:
            continue
        for key in _keys(fingerprint, keys):
            newest[(name, key)] = max(newest.get((name, key), 0), row_id)

    configs = {c.name: c for c in config.channels}
    settled: set[int] = set()
    claims: list[Claim] = []
    per_channel: dict[str, int] = {}
    sent_recently: dict[str, int] = {}
    for row in mine:
        if row.claimed_until is not None and row.claimed_until > now:
            continue  # another sender's, still running
        try:
            claim = _consider(
                session,
                row,
                configs.get(row.channel),
                now,
                holding,
                newest,
                settled,
                per_channel,
                sent_recently,
                counts,
            )
        except Refused as why:
            _fail(row, str(why))
            counts["failed"] += 1
            settled.add(row.id)
            continue
        except Exception as error:  # this row only: refused, with why
            _fail(row, f"could not be prepared: {type(error).__name__}: {error}"[:500])
            counts["failed"] += 1
            settled.add(row.id)
            log.exception("notification #%d could not be prepared", row.id)
            continue
        if claim is None:
            continue
        per_channel[row.channel] = per_channel.get(row.channel, 0) + 1
        # No send starts after ROUND_BUDGET deadlines and each ends within one: the lease
        # outlasts the round, and its commits.
        row.claimed_by = token
        row.claimed_until = now + (ROUND_BUDGET + 1) * deadline + LEASE_MARGIN
        if row.maybe_sent:
            row.resends = (row.resends or 0) + 1
            log.warning(
                "notification #%d to %s is sent again after a send whose outcome was never "
                "known: the platform may get it twice (counted in resends)",
                row.id,
                row.channel,
            )
        row.maybe_sent = True
        claims.append(claim)
    session.commit()
    return claims


def _consider(
    session: Session,
    row: NotificationRow,
    spec: ChannelConfig | None,
    now: float,
    holding: dict[tuple[str, str], list[int]],
    newest: dict[tuple[str, str], int],
    settled: set[int],
    per_channel: dict[str, int],
    sent_recently: dict[str, int],
    counts: dict[str, int],
) -> Claim | None:
    """Settle a row that must not be sent (superseded, expired), or say it must wait (not
    due, held back by an earlier row, over a rate limit), or prepare its claim."""
    if spec is None:
        raise Refused(f"channel {row.channel!r} is no longer configured")
    keys = _keys(row.fingerprint, row.alert_keys)
    newer = [newest.get((row.channel, key), 0) for key in keys]
    if all(n > row.id for n in newer):
        row.state, row.last_error = "superseded", f"superseded by #{min(newer)}"
        row.claimed_by = row.claimed_until = None
        counts["superseded"] += 1
        settled.add(row.id)
        return None
    notice = Notice(**json.loads(row.notice))
    if notice.status == FIRING and now - row.created_at > spec.max_age:
        age = now - row.created_at
        row.state = "expired"
        row.last_error = f"expired: not delivered within {spec.max_age:g}s ({age:.0f}s old)"
        row.claimed_by = row.claimed_until = None
        log.warning(
            "notification #%d to %s dropped as stale: %s", row.id, row.channel, row.last_error
        )
        counts["expired"] += 1
        settled.add(row.id)
        return None
    if row.next_attempt_at > now:
        return None
    for key in keys:
        if any(i < row.id and i not in settled for i in holding.get((row.channel, key), [])):
            return None  # an earlier row of this alert goes first
    target = channel(spec)
    if target.per_minute is not None:
        if row.channel not in sent_recently:
            sent_recently[row.channel] = (
                session.scalar(
                    select(func.count())
                    .select_from(NotificationRow)
                    .where(
                        NotificationRow.channel == row.channel, NotificationRow.sent_at > now - 60
                    )
                )
                or 0
            )
        if sent_recently[row.channel] + per_channel.get(row.channel, 0) >= target.per_minute:
            row.next_attempt_at = now + 60 / target.per_minute
            counts["held"] += 1
            return None
    if per_channel.get(row.channel, 0) >= PER_ROUND:
        return None  # the next round sends it
    return Claim(
        row.id, row.channel, spec.type, prepare(row, notice, spec, now), bool(row.maybe_sent)
    )


def prepare(row: NotificationRow, notice: Notice, spec: ChannelConfig, now: float) -> Outgoing:
    """The request for a row: built by its channel, checked, given its idempotency key."""
    try:
        request = channel(spec).request(notice, now)
    except ValueError as error:  # the channel's config lacks what it needs
        raise Refused(str(error)) from None
    problem = url_problem(request.url)
    if problem:
        raise Refused(f"invalid URL ({where(request.url)}): {problem}")
    key = f"kneepoint-{row.id}-{int(row.created_at * 1000)}"
    return replace(request, headers={**request.headers, "Idempotency-Key": key})


def _keys(fingerprint: str, keys: str | None) -> list[str]:
    return keys.split() if keys else [fingerprint]


def _settle(session: Session, claim: Claim, token: str, now: float, counts: dict[str, int]) -> None:
    """Commit one send's outcome, if the row is still this sender's (a lease that ran out
    may have passed it to another)."""
    try:
        row = session.scalar(
            select(NotificationRow)
            .where(NotificationRow.id == claim.row_id, NotificationRow.claimed_by == token)
            .execution_options(populate_existing=True)
        )
        if row is None or row.state != "pending":
            log.warning("notification #%d: the lease ran out before its outcome", claim.row_id)
            session.rollback()
            return
        row.claimed_by = row.claimed_until = None
        result = claim.result
        if result is None:  # not tried: its channel did not answer this round
            row.maybe_sent = claim.maybe_sent_before
            if claim.maybe_sent_before:
                row.resends = max(0, (row.resends or 0) - 1)
            session.commit()
            return
        counts[outcome(row, result, claim.kind, now)] += 1
        session.commit()  # each outcome is kept the moment it is known
    except Exception:  # the row stays claimed; its lease runs out and it is sent again
        session.rollback()
        log.exception("notification #%d: its outcome could not be stored", claim.row_id)


def outcome(row: NotificationRow, result: Result, kind: str, now: float) -> str:
    """Apply one send's result to its row; say which count it falls in."""
    row.attempts = (row.attempts or 0) + 1
    refused = refusal(kind, result) if 200 <= result.status < 300 else None
    if 200 <= result.status < 300 and refused is None:
        row.state, row.sent_at, row.last_error, row.maybe_sent = "sent", now, None, False
        return "sent"
    if not result.permanent and (result.status in (0, 408, 429) or result.status >= 500):
        backoff = min(FIRST_RETRY * 2 ** (row.attempts - 1), LONGEST_WAIT)
        row.next_attempt_at = now + max(backoff, result.retry_after or 0.0)
        row.last_error = _error(result)
        row.maybe_sent = result.maybe_delivered  # an answer says it was not delivered
        return "retry"
    row.maybe_sent = False
    _fail(row, refused or _error(result))
    return "failed"


def _error(result: Result) -> str:
    """What a send's result stores as the row's error: the status and the start of the
    answer, any secret of the config masked in it before it is cut (a platform may echo
    its URL or token back)."""
    body = scrub_secrets(result.body)
    return f"HTTP {result.status}: {body[:200]}" if result.status else body


def _fail(row: NotificationRow, reason: str) -> None:
    row.state, row.last_error = "failed", scrub_secrets(reason)
    row.claimed_by = row.claimed_until = None


def channel_health(session: Session) -> dict[str, str]:
    """Per channel: "broken" when its latest settled notification was refused, else "ok"."""
    latest = (
        select(func.max(NotificationRow.id).label("id"))
        .where(NotificationRow.state.in_(["sent", "failed"]))
        .group_by(NotificationRow.channel)
        .subquery()
    )
    rows = session.execute(
        select(NotificationRow.channel, NotificationRow.state).join(
            latest, NotificationRow.id == latest.c.id
        )
    ).all()
    return {name: "broken" if state == "failed" else "ok" for name, state in rows}


def send_trial(
    sessions: sessionmaker[Session],
    config: Config,
    channel_name: str,
    now: float,
    send: Sender | None = None,
) -> tuple[str, str | None]:
    """A test message to one channel, sent now: this row only, not the rest of the outbox.
    It is claimed as it is written, so no other sender takes it; left pending, the regular
    delivery retries it. Its state and error."""
    token = uuid.uuid4().hex
    spec = next((c for c in config.channels if c.name == channel_name), None)
    with sessions.begin() as session:
        notice = trial_notice(config, channel_name, now)
        row = put(session, channel_name, notice, now)
        row_id = row.id
        try:
            if spec is None:
                raise Refused(f"channel {channel_name!r} is not configured")
            request = prepare(row, notice, spec, now)
        except Exception as error:  # Refused, or a channel's bug: this row refused, with why
            why = str(error) if isinstance(error, Refused) else f"{type(error).__name__}: {error}"
            why = scrub_secrets(why)[:500]  # scrubbed before the cut, so no half secret survives it
            _fail(row, why)
            return "failed", why
        row.claimed_by, row.claimed_until = token, now + DEADLINE + LEASE_MARGIN
        row.maybe_sent = True
    claim = Claim(row_id, channel_name, spec.type, request, False)
    (claim,) = _send_all({channel_name: [claim]}, send or http_sender())
    with sessions() as session:
        _settle(session, claim, token, now, dict.fromkeys(COUNTS, 0))
        stored = session.get(NotificationRow, row_id)
        return (stored.state, stored.last_error) if stored else ("missing", None)
