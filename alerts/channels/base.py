"""What every channel shares: the notice (what an alert says), its short text, the size limit
and the HTTP request a platform wants."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from kneepoint.config import Channel as ChannelConfig
from kneepoint.secrets import redact_url, revealed

REPORT = "report"  # a Notice's status when it carries a scheduled report, not an alert


@dataclass(frozen=True)
class Notice:
    """One alert's news: it fires, or it resolved."""

    fingerprint: str
    rule: str
    replica: str  # "" for the fleet
    status: str  # firing | resolved
    severity: str
    value: float | None
    threshold: float
    op: str
    since: float  # when it started firing
    at: float  # when this news happened
    runbook: str = ""
    dashboard_url: str = "http://localhost:8501"
    page: str = "overview"
    slo: str = ""  # an SLO burn's SLO: the link opens the SLOs page on it
    labels: dict[str, str] = field(default_factory=dict)
    # A group: the same rule's news for several replicas in one evaluation, one message.
    members: list[dict[str, Any]] = field(default_factory=list)
    # What changed in the hour before it fired (kneepoint/timeline.py), one line each, and
    # the likely cause with its evidence (kneepoint/causes.py): shown on every channel.
    changes: tuple[str, ...] = ()
    cause: str = ""
    # An ending that is no recovery: why kneepoint can no longer measure the alert
    # (alerts.lifecycle.Transition.note: the replica's engine does not expose the rule's
    # metric), and when the engine that took over was first seen (epoch seconds; None: not
    # known, or not after the alert began). Its status stays "resolved", which is what closes
    # it on PagerDuty and Alertmanager, but no message calls it resolved: "ENDED", and why.
    note: str = ""
    engine_since: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.changes, tuple):  # a list, as stored in the outbox's JSON
            object.__setattr__(self, "changes", tuple(self.changes))

    def split(self) -> list[Notice]:
        """The group's alerts one by one (each with its own replica, value, fingerprint)."""
        if not self.members:
            return [self]
        return [
            replace(
                self,
                replica=m["replica"],
                value=m["value"],
                fingerprint=m["fingerprint"],
                members=[],
            )
            for m in self.members
        ]

    @property
    def ended(self) -> bool:
        """Did the alert end without a recovery (no longer measured, not fixed)?"""
        return self.status == "resolved" and bool(self.note)

    @property
    def where(self) -> str:
        return self.replica or "the fleet"

    @property
    def link(self) -> str:
        """The page, replica and time range that explain it."""
        query: dict[str, str] = {"page": self.page, "range": "1h"}
        if self.replica and not self.members:
            query["replica"] = self.replica
        if self.slo:
            query["slo"] = self.slo
        return f"{self.dashboard_url.rstrip('/')}/?{urlencode(query)}"

    def title(self) -> str:
        if self.status == REPORT:
            return f"[REPORT] {self.rule}"
        if self.ended:
            mark = "ENDED"
        else:
            mark = "RESOLVED" if self.status == "resolved" else self.severity.upper()
        where = f"{len(self.members)} replicas" if self.members else self.where
        return f"[{mark}] {self.rule} on {where}"

    def text(self) -> str:
        if self.status == REPORT:  # a scheduled report: its summary and the page's link
            return "\n".join([self.title(), self.runbook, self.link])
        since = datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%d %H:%M UTC")
        # An ended alert has no value because it is no longer measured, not for a gap.
        missing = "not measured" if self.ended else "no data"
        if self.members:
            values = ", ".join(
                f"{m['replica'] or 'fleet'} {_value(m['value'], missing)}" for m in self.members
            )
        else:
            values = _value(self.value, missing)
        word = "values" if self.members else "value"
        detail = f"{word} {values} (threshold {self.op} {_number(self.threshold)}), since {since}"
        # The why of an ending comes right after the title: the line a short view shows.
        lines = [self.title(), *([self.ending()] if self.ended else []), detail, self.link]
        if self.runbook and self.status == "firing":
            lines.append(f"runbook: {self.runbook}")
        return "\n".join(lines + self.context())

    def ending(self) -> str:
        """The line that says an alert ended without a recovery, and why ("" otherwise)."""
        if not self.ended:
            return ""
        changed = ""
        if self.engine_since is not None:
            at = datetime.fromtimestamp(self.engine_since, UTC).strftime("%Y-%m-%d %H:%M UTC")
            # A fleet alert's time is its latest replica's change (alerts.values.engine_since).
            whose = "the replica's engine" if self.replica else "the last replica's engine"
            changed = f" ({whose} changed at {at})"
        return (
            "Ended without a recovery: kneepoint can no longer measure it, "
            f"{self.note}{changed}. The problem may still be there."
        )

    def context(self) -> list[str]:
        """The likely cause and the changes before it fired, as lines of the message."""
        lines = [f"likely cause: {self.cause}"] if self.cause else []
        if self.changes:
            lines.append("changes in the hour before:")
            lines += [f"- {change}" for change in self.changes]
        return lines


def _value(value: float | None, missing: str = "no data") -> str:
    return missing if value is None else _number(value)


def _number(value: float) -> str:
    """A number as people write it: 0.9, 12.5, 3,400, 1,869,330,000; never 1.869e+09."""
    if value == 0 or 1e-3 <= abs(value) < 1e3:
        return f"{value:.4g}"
    if abs(value) >= 1e3:  # .4g would say 1e+04 for 9,999.5
        return f"{value:,.0f}"
    return f"{value:.6f}".rstrip("0").rstrip(".") or "0"  # tiny: 0.000123


@dataclass(frozen=True)
class Outgoing:
    """An HTTP request to make, built just before it is sent: its URL and headers hold the
    channel's secrets revealed, so its repr shows only the URL's scheme and host."""

    url: str
    json: Any
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None  # a body sent as is (signed bodies), instead of `json`

    def __repr__(self) -> str:
        return f"Outgoing({redact_url(self.url, path=False)!r}, headers={sorted(self.headers)})"


class Channel(ABC):
    max_chars = 4000  # the platform's message size limit, with room for the envelope
    groups = True  # several alerts of one rule in one message (not where each is an incident)
    per_minute: int | None = None  # the platform's rate limit, when it has one

    def __init__(self, config: ChannelConfig) -> None:
        self.config = config

    @property
    def url(self) -> str:
        """The channel's URL, revealed: for the request only (kneepoint/secrets.py)."""
        if not self.config.url:
            raise ValueError(f"channel {self.config.name!r} ({self.config.type}) needs a url")
        return self.config.url.reveal()

    @property
    def headers(self) -> dict[str, str]:
        """The channel's extra headers, revealed: for the request only."""
        return revealed(self.config.headers)

    def short(self, notice: Notice) -> str:
        """The notice's text cut to the platform's limit (the link and title come first)."""
        text = notice.text()
        return text if len(text) <= self.max_chars else text[: self.max_chars - 1] + "…"

    @abstractmethod
    def request(self, notice: Notice, now: float) -> Outgoing:
        """The request that delivers `notice` (signed with `now` where the platform asks)."""
