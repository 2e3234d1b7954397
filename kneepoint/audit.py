"""The audit trail: every mutation, sign-in and refusal, stored with who, when, what (before
and after) and from which address.

A mutation records its entry in the same transaction as the writes it makes through the
session `mutation` yields, so for those an entry exists exactly when the change was
committed. Effects outside that session (a test message sent through the outbox's own
transactions, a report file written) have happened before the entry is committed; a crash
in between leaves them without one. A refusal is recorded in a transaction of its own,
since the action it refused writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from kneepoint.auth import Identity, Refused, Role, require
from kneepoint.secrets import scrub
from kneepoint.store.models import AuditRow

# A transaction that commits when its block ends without error (a sessionmaker's .begin).
Begin = Callable[[], AbstractContextManager[Session]]


@dataclass
class Change:
    """What a mutation did, filled in by it: the subject and its state before and after."""

    subject: str
    before: Any = None
    after: Any = None
    detail: str = ""


@dataclass(frozen=True)
class Entry:
    ts: float
    actor: str
    role: str | None
    via: str
    address: str | None
    action: str
    outcome: str
    subject: str
    before: Any = None
    after: Any = None
    detail: str = ""
    id: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ts": self.ts,
            "actor": self.actor,
            "role": self.role,
            "via": self.via,
            "address": self.address,
            "action": self.action,
            "outcome": self.outcome,
            "subject": self.subject,
            "before": self.before,
            "after": self.after,
            "detail": self.detail,
        }


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, default=str)


def record(
    session: Session,
    who: Identity,
    action: str,
    outcome: str,
    change: Change,
    now: float,
) -> None:
    session.add(
        AuditRow(
            ts=now,
            actor=who.name,
            role=who.role,
            via=who.via,
            address=who.address,
            action=action,
            outcome=outcome,
            subject=change.subject[:200],
            before=_json(change.before),
            after=_json(change.after),
            detail=change.detail,
        )
    )


@contextmanager
def mutation(
    begin: Begin,
    who: Identity,
    needed: Role,
    action: str,
    subject: str,
    now: float,
) -> Iterator[tuple[Session, Change]]:
    """Check the role, then run the caller's change and its audit entry in one transaction.

    Refused (recorded, then raised) unless `who` holds `needed`; the change may also raise
    Refused for a policy of its own. A change that raises anything else is rolled back and
    recorded as failed with the error, then the error is re-raised.
    """
    change = Change(subject)
    try:
        require(who, needed, _words(action))
    except Refused as refusal:
        change.detail = str(refusal)
        with begin() as session:
            record(session, who, action, "refused", change, now)
        raise
    try:
        with begin() as session:
            yield session, change
            record(session, who, action, "done", change, now)
    except Refused as refused:  # the change's own policy said no (a silence too broad)
        change.detail = str(refused)
        with begin() as session:
            record(session, who, action, "refused", change, now)
        raise
    except Exception as error:
        change.detail = scrub(f"{type(error).__name__}: {error}")[:500]
        with begin() as session:
            record(session, who, action, "failed", change, now)
        raise


def refusal(begin: Begin, who: Identity, action: str, subject: str, why: str, now: float) -> None:
    """Record a refusal decided outside `mutation` (a silence too broad, a file too big)."""
    with begin() as session:
        record(session, who, action, "refused", Change(subject, detail=why), now)


def sign_in(begin: Begin, who: Identity, now: float) -> None:
    """Record a sign-in, or a refused one (no role), once per browser session."""
    outcome = "done" if who.role else "refused"
    with begin() as session:
        record(session, who, "sign-in", outcome, Change(who.via, detail=who.why_not), now)


def entries(session: Session, since: float, limit: int = 1000) -> list[Entry]:
    """The newest entries since `since`, newest first, at most `limit`."""
    rows = session.scalars(
        select(AuditRow).where(AuditRow.ts >= since).order_by(AuditRow.ts.desc()).limit(limit)
    )
    return [
        Entry(
            r.ts,
            r.actor,
            r.role,
            r.via,
            r.address,
            r.action,
            r.outcome,
            r.subject,
            None if r.before is None else json.loads(r.before),
            None if r.after is None else json.loads(r.after),
            r.detail,
            r.id,
        )
        for r in rows
    ]


def _words(action: str) -> str:
    """`silence.create` as a sentence's subject: "Creating a silence" style names."""
    return ACTION_NAMES.get(action, action)


ACTION_NAMES = {
    "silence.create": "Creating a silence",
    "silence.expire": "Expiring a silence",
    "channel.test": "Sending a test message",
    "run.import": "Importing knee runs",
    "run.sweep": "Storing a sweep",
    "whatif.calibrate": "Calibrating a replica",
    "run.delete": "Deleting a knee run",
    "report.send": "Sending the weekly review",
    "audit.read": "Reading the audit trail",
    "annotation.create": "Posting an annotation",
}
