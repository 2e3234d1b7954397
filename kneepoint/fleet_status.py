"""One status for the whole fleet, with its reasons: what the on-call landing page (the
Overview) says first. Pure: the caller reads the alerts, SLO reports and replica health and
passes them in (app/data.py does for the app).

The rule, exactly:

- **down** when either
  - an alert of severity `page` is firing (someone is being paged now), or
  - no replica is serving: at least one replica has been scraped, and every scraped replica
    is down (its last scrape failed), stale (not scraped within kneepoint.status.stale_after)
    or stalled (work present, no token counted: kneepoint/derived/stall.py).
- **degraded** when it is not down and any of
  - an alert of severity `ticket` (or of a severity kneepoint does not know) is firing,
  - an SLO's error budget is exhausted (budget left ≤ 0 over its window),
  - an SLO is burning: one of its burn-rate windows has both its long and short rate over
    the window's factor (alerts/slo.py `burning`; the fast ones also fire a page alert),
  - a replica is down, stale or stalled.
- **ok** otherwise.

Never a reason: a `pending` alert (breaching, not yet for its whole `for:`), a firing alert
of severity `info` (for the record: gpu-idle, a low acceptance rate), an SLO with no data
yet or whose configuration is wrong (its page says why), a replica never scraped. They are
counted in `notes` so the status line can say "OK · 2 pending" without calling it a problem.

Every reason carries the query string of the page that explains it (the app's
?page=…&range=…&replica=… scheme, app/main.py): an alert's is given by the caller (the same
view its message links to, alerts/outbox.py `view_of`), a replica's is Collector health
(down, stale) or the Overview (stalled) on that replica, an SLO's is the SLOs page on it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

OK, DEGRADED, DOWN = "ok", "degraded", "down"
LEVELS = (OK, DEGRADED, DOWN)  # worst last
LABELS = {OK: "OK", DEGRADED: "Degraded", DOWN: "Down"}
COLOURS = {OK: "green", DEGRADED: "orange", DOWN: "red"}
SEVERITY_COLOURS = {"page": "red", "ticket": "orange", "info": "blue"}
FIRING, PENDING = "firing", "pending"
RANGE = "1h"  # the time range a reason's link opens
# What the status line counts, one and many.
CATEGORIES = {
    "page": ("page alert firing", "page alerts firing"),
    "none": ("no replica serving", "no replica serving"),
    "alert": ("alert firing", "alerts firing"),
    "down": ("replica down", "replicas down"),
    "stale": ("replica stale", "replicas stale"),
    "stalled": ("replica stalled", "replicas stalled"),
    "exhausted": ("SLO budget exhausted", "SLO budgets exhausted"),
    "burning": ("SLO burning", "SLOs burning"),
}


@dataclass(frozen=True)
class AlertState:
    """One pending or firing alert, as the alerts table holds it, with its rule's severity."""

    rule: str
    replica: str  # "" for a fleet alert
    state: str  # firing | pending
    severity: str  # page | ticket | info (the rule's); anything else counts as a ticket
    since: float | None  # firing: when it fired; pending: when it started breaching
    value: float | None = None
    threshold: float | None = None
    op: str = ""
    metric: str = ""  # the rule's metric (alerts/rules.METRICS, or slo_burn:…)
    fingerprint: str = ""
    # The query string of the view that explains it (what its message links to).
    view: Mapping[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return self.replica or "fleet"


@dataclass(frozen=True)
class SloState:
    """One SLO's budget and burn, as alerts/slo.py reports it."""

    name: str
    budget_left: float | None  # 1 − bad share ÷ allowed share; ≤ 0: exhausted; None: no data
    burn_rate: float | None = None  # over `burn_window` (1: the budget lasts the SLO window)
    burn_window: str = ""  # "1h"
    burning: tuple[str, ...] = ()  # the burn windows over their factor ("1h", "6h")
    problem: str | None = None  # the SLO cannot be judged (a threshold not a bucket bound)

    @property
    def exhausted(self) -> bool:
        return self.budget_left is not None and self.budget_left <= 0


@dataclass(frozen=True)
class ReplicaState:
    """One replica's health, as `kneepoint status` reports it."""

    name: str
    up: bool | None  # None: never scraped; a stale replica is down (False)
    stale: bool = False
    stalled: bool = False
    last_error: str | None = None
    last_scrape_at: str | None = None
    stalled_since: str | None = None

    @classmethod
    def from_status(cls, replica: Mapping[str, Any]) -> ReplicaState:
        """From one entry of `kneepoint status --json`'s `replicas`."""
        return cls(
            name=str(replica["name"]),
            up=replica.get("up"),
            stale=bool(replica.get("stale")),
            stalled=bool(replica.get("stalled")),
            last_error=replica.get("last_error"),
            last_scrape_at=replica.get("last_scrape_at"),
            stalled_since=replica.get("stalled_since"),
        )

    @property
    def known(self) -> bool:
        return self.up is not None

    @property
    def serving(self) -> bool:
        return self.up is True and not self.stale and not self.stalled

    @property
    def trouble(self) -> str | None:
        """Its trouble: stale, down or stalled; None while it serves (or was never scraped)."""
        if self.stale:
            return "stale"
        if self.up is False:
            return "down"
        if self.stalled:
            return "stalled"
        return None


@dataclass(frozen=True)
class Reason:
    """Why the fleet is not OK: one alert, SLO or replica."""

    level: str  # degraded | down
    kind: str  # alert | slo | replica | fleet
    category: str  # a key of CATEGORIES: what the status line counts
    subject: str  # the rule, SLO or replica name
    text: str  # one short sentence fragment
    view: Mapping[str, str]  # the query string of the page that explains it


@dataclass(frozen=True)
class FleetStatus:
    level: str  # ok | degraded | down
    reasons: tuple[Reason, ...]  # down ones first
    notes: tuple[str, ...] = ()  # what is worth a glance but is no problem (pending, info)

    @property
    def label(self) -> str:
        return LABELS[self.level]

    @property
    def colour(self) -> str:
        return COLOURS[self.level]

    def summary(self) -> str:
        """The status line: "Down: 1 page alert firing, 1 replica down · 2 pending"."""
        counts: dict[str, int] = {}
        for reason in self.reasons:
            counts[reason.category] = counts.get(reason.category, 0) + 1
        parts = [_counted(category, n) for category, n in counts.items()]
        head = f"{self.label}: {', '.join(parts)}" if parts else self.label
        return " · ".join([head, *self.notes])


def assess(
    alerts: Iterable[AlertState],
    slos: Iterable[SloState],
    replicas: Iterable[ReplicaState],
) -> FleetStatus:
    """The fleet's status by the module's rule, with every reason."""
    alerts, slos, replicas = list(alerts), list(slos), list(replicas)
    reasons: list[Reason] = []
    for alert in alerts:
        if alert.state != FIRING or alert.severity == "info":
            continue
        page = alert.severity == "page"
        text = f"{alert.rule} firing on {alert.where} ({alert.severity})"
        reasons.append(
            Reason(
                DOWN if page else DEGRADED,
                "alert",
                "page" if page else "alert",
                alert.rule,
                text,
                dict(alert.view),
            )
        )
    known = [r for r in replicas if r.known]
    if known and not any(r.serving for r in known):
        text = f"no replica serving ({len(known)} of {len(known)} down, stale or stalled)"
        reasons.append(Reason(DOWN, "fleet", "none", "fleet", text, replica_view(None)))
    for replica in replicas:
        trouble = replica.trouble
        if trouble is not None:
            text = f"{replica.name} {trouble}"
            view = replica_view(replica)
            reasons.append(Reason(DEGRADED, "replica", trouble, replica.name, text, view))
    for slo in slos:
        if slo.problem is not None:
            continue
        if slo.exhausted:
            text = f"SLO {slo.name}: error budget exhausted"
            reasons.append(Reason(DEGRADED, "slo", "exhausted", slo.name, text, slo_view(slo.name)))
        if slo.burning:
            text = f"SLO {slo.name}: burning over {', '.join(slo.burning)}"
            reasons.append(Reason(DEGRADED, "slo", "burning", slo.name, text, slo_view(slo.name)))
    level = max((r.level for r in reasons), key=LEVELS.index, default=OK)
    reasons.sort(key=lambda r: -LEVELS.index(r.level))  # stable: the order above within a level
    return FleetStatus(level, tuple(reasons), _notes(alerts))


def replica_view(replica: ReplicaState | None) -> dict[str, str]:
    """Where a replica's trouble is explained: a down or stale one on Collector health (its
    scrape errors, failures in a row, the collector's jobs), a stalled one on the Overview on
    that replica (its tile and its charts: work present, no tokens); the fleet: the Overview."""
    if replica is None:
        return {"page": "overview", "range": RANGE}
    page = "health" if replica.trouble in ("down", "stale") else "overview"
    return {"page": page, "range": RANGE, "replica": replica.name}


def slo_view(name: str) -> dict[str, str]:
    return {"page": "slos", "range": RANGE, "slo": name}


def ordered(alerts: Iterable[AlertState]) -> list[AlertState]:
    """Firing before pending, then by severity (page, ticket, info), then longest first."""
    rank = {"page": 0, "ticket": 1, "info": 3}
    return sorted(
        alerts,
        key=lambda a: (
            a.state != FIRING,
            rank.get(a.severity, 2),
            a.since if a.since is not None else float("inf"),
            a.rule,
            a.replica,
        ),
    )


def _notes(alerts: list[AlertState]) -> tuple[str, ...]:
    pending = sum(1 for a in alerts if a.state == PENDING)
    info = sum(1 for a in alerts if a.state == FIRING and a.severity == "info")
    notes = []
    if pending:
        notes.append(f"{pending} pending")
    if info:
        notes.append(f"{info} info firing")
    return tuple(notes)


def _counted(category: str, n: int) -> str:
    one, many = CATEGORIES[category]
    if category == "none":
        return one
    return f"{n} {one if n == 1 else many}"
