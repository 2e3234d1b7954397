"""Silences (matchers on an alert's labels, with a start, an end, an author and a comment) and
inhibition (a replica that is down mutes its other alerts: they are consequences)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from alerts.lifecycle import FIRING, Alert
from kneepoint.store.models import SilenceRow

DOWN_RULE = "target-down"


@dataclass(frozen=True)
class Silence:
    id: int
    matchers: dict[str, str]
    starts_at: float
    ends_at: float
    author: str
    comment: str

    def active(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(name) == value for name, value in self.matchers.items())


def labels_of(rule_name: str, replica: str, severity: str, extra: dict[str, str]) -> dict[str, str]:
    """An alert's labels, as silences match them and Alertmanager shows them."""
    return {"alertname": rule_name, "replica": replica or "fleet", "severity": severity, **extra}


def create(
    session: Session,
    matchers: dict[str, str],
    starts_at: float,
    ends_at: float,
    author: str,
    comment: str,
    now: float,
) -> int:
    if not matchers:
        raise ValueError("a silence needs at least one matcher (label=value)")
    if ends_at <= starts_at:
        raise ValueError("a silence must end after it starts")
    row = SilenceRow(
        matchers=json.dumps(matchers, sort_keys=True),
        starts_at=starts_at,
        ends_at=ends_at,
        author=author,
        comment=comment,
        created_at=now,
    )
    session.add(row)
    session.flush()
    return row.id


def broad(matchers: dict[str, str]) -> bool:
    """A silence naming no alertname and no replica (or only replica=fleet) mutes a whole
    class of alerts (every page, say): the app lets only an admin create one."""
    if "alertname" in matchers:
        return False
    # replica=fleet names every fleet-wide alert (the SLO burn rates): as broad as none.
    return matchers.get("replica", "fleet") == "fleet"


def get(session: Session, silence_id: int) -> Silence | None:
    row = session.get(SilenceRow, silence_id)
    if row is None:
        return None
    return Silence(
        row.id, json.loads(row.matchers), row.starts_at, row.ends_at, row.author, row.comment
    )


def expire(session: Session, silence_id: int, now: float) -> bool:
    """End a silence now; False when there is no such silence or it already ended."""
    row = session.get(SilenceRow, silence_id)
    if row is None or row.ends_at <= now:
        return False
    row.ends_at = max(now, row.starts_at)
    return True


def load(session: Session) -> list[Silence]:
    return [_silence(r) for r in session.scalars(select(SilenceRow).order_by(SilenceRow.id))]


def _silence(row: SilenceRow) -> Silence:
    matchers = json.loads(row.matchers)
    return Silence(row.id, matchers, row.starts_at, row.ends_at, row.author, row.comment)


def muted(
    labels: dict[str, str], silences: list[Silence], states: dict[str, Alert], now: float
) -> str | None:
    """Why an alert with these labels sends nothing now ("silenced by #3", "inhibited: …"),
    or None."""
    for silence in silences:
        if silence.active(now) and silence.matches(labels):
            return f"silenced by #{silence.id} ({silence.author}: {silence.comment})"
    replica = labels.get("replica")
    if labels.get("alertname") != DOWN_RULE and replica and replica != "fleet":
        for alert in states.values():
            if alert.rule == DOWN_RULE and alert.replica == replica and alert.state == FIRING:
                return f"inhibited: {replica} is down"
    return None
