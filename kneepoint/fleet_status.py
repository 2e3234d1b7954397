"""One status for the whole fleet, with its reasons: what the on-call landing page (the
Overview) says first. Pure: the caller reads the alerts, SLO reports and replica health and
passes them in (app/data.py does for the app).

The rule, exactly (worst first; the fleet's level is the worst of its reasons'):

- **down** when a replica is not serving: at least one scraped replica is down (its last
  scrape failed), stale (not scraped within kneepoint.status.stale_after) or stalled (work
  present, no token counted: kneepoint/derived/stall.py). The status line says how many of
  the scraped replicas ("Down: 1 of 4 replicas down"), and "no replica serving" when none
  does. A firing `page` alert on a replica's health (`target-down`, `engine-stalled`,
  `collector-stale`) is a down reason too, but only while some replica is not serving.
- **burning** when an SLO's error budget is spent or burns: its budget left is ≤ 0 over its
  window (exhausted), or one of its burn-rate windows has both its long and short rate over
  the window's factor (alerts/slo.py `burning`). A firing burn-rate alert (`slo_burn:…`,
  whatever its severity but `info`) is the same fact: it is a burning reason of its own only
  when the SLO's report does not already say it burns.
- **paging** when any other alert of severity `page` fires: someone is paged for it, every
  replica may still serve (`kv-cache-saturated`, `gpu-xid-error`, a replica-health page
  alert while every replica serves). The status line names it with its severity.
- **degraded** when an alert of severity `ticket` (or of a severity kneepoint does not
  know) fires.
- **ok** otherwise.

Never a reason: a `pending` alert (breaching, not yet for its whole `for:`), a firing alert
of severity `info` (for the record: gpu-idle, a low acceptance rate), an SLO with no data
yet or whose configuration is wrong (its page says why), a replica never scraped, a replica
asleep (vLLM's sleep mode: put to sleep on purpose, so neither down nor stalled; `asleep`).
Pending and info alerts and asleep replicas are counted in `notes` so the status line can
say "OK · 2 pending · 1 replica asleep" without calling it a problem.

The status line has one segment per level with reasons, worst first, each naming its
reasons ("Down: 1 of 4 replicas down · Burning: SLO fast-ttft budget exhausted ·
Degraded: preemptions-sustained firing on replica-b (ticket) · 2 pending"); past `NAMED`
SLOs or alerts in one segment it counts them instead ("Paging: 3 page alerts firing").

Not here: any read of the store or any number. The replicas' up, stale and stalled come
from `kneepoint status` (kneepoint/status.py), the SLO reports from alerts/slo.py, the
alerts from the alerts table; this module only ranks them. The collector's own health (its
jobs and database) is kneepoint/health.py's.

Every reason carries the query string of the page that explains it (the app's
?page=…&range=…&replica=… scheme, app/main.py): an alert's is given by the caller (the same
view its message links to, alerts/outbox.py `view_of`), a replica's is Collector health
(down, stale) or the Overview (stalled) on that replica, an SLO's is the SLOs page on it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kneepoint import catalogue
from kneepoint.records import ReplicaStatus

OK, DEGRADED, PAGING, BURNING, DOWN = "ok", "degraded", "paging", "burning", "down"
# Worst last. Burning ranks above a page on another metric: a spent budget is harm users
# already had; most page rules (KV saturated, an XID) are a risk to it.
LEVELS = (OK, DEGRADED, PAGING, BURNING, DOWN)
LABELS = {OK: "OK", DEGRADED: "Degraded", PAGING: "Paging", BURNING: "Burning", DOWN: "Down"}
COLOURS = {OK: "green", DEGRADED: "orange", PAGING: "red", BURNING: "violet", DOWN: "red"}
SEVERITY_COLOURS = {"page": "red", "ticket": "orange", "info": "blue"}
FIRING, PENDING = "firing", "pending"
RANGE = "1h"  # the time range a reason's link opens
# The page rules' metrics that say a replica is not serving (alerts/rules.py).
REPLICA_METRICS = ("up", "engine_stalled", "stale_targets")
NAMED = 2  # SLOs or alerts named in one segment of the status line; past it, counted
# What the status line counts, one and many.
CATEGORIES = {
    "none": ("no replica serving", "no replica serving"),
    "down": ("replica down", "replicas down"),
    "stale": ("replica stale", "replicas stale"),
    "stalled": ("replica stalled", "replicas stalled"),
    "replica-alert": ("replica alert firing", "replica alerts firing"),
    "exhausted": ("SLO budget exhausted", "SLO budgets exhausted"),
    "burning": ("SLO burning", "SLOs burning"),
    "burn-alert": ("burn-rate alert firing", "burn-rate alerts firing"),
    "page": ("page alert firing", "page alerts firing"),
    "alert": ("ticket alert firing", "ticket alerts firing"),
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
    # vLLM's sleep mode: "weights offloaded" or "everything discarded" while asleep, else None.
    asleep: str | None = None

    @classmethod
    def from_status(cls, replica: ReplicaStatus) -> ReplicaState:
        """From one entry of `kneepoint status --json`'s `replicas`."""
        return cls(
            name=str(replica["name"]),
            up=replica.get("up"),
            stale=bool(replica.get("stale")),
            stalled=bool(replica.get("stalled")),
            last_error=replica.get("last_error"),
            last_scrape_at=replica.get("last_scrape_at"),
            stalled_since=replica.get("stalled_since"),
            asleep=replica.get("sleep_state") if replica.get("asleep") else None,
        )

    @property
    def asleep_label(self) -> str | None:
        """ "asleep (weights offloaded)" while asleep and scraped; None otherwise."""
        if self.asleep is None or self.stale or self.up is not True:
            return None
        return f"asleep ({self.asleep})"

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

    level: str  # degraded | paging | burning | down
    kind: str  # alert | slo | replica | fleet
    category: str  # a key of CATEGORIES: what the status line counts
    subject: str  # the rule, SLO or replica name
    text: str  # one short sentence fragment
    view: Mapping[str, str]  # the query string of the page that explains it


@dataclass(frozen=True)
class FleetStatus:
    level: str  # ok | degraded | paging | burning | down
    reasons: tuple[Reason, ...]  # the worst first
    notes: tuple[str, ...] = ()  # what is worth a glance but is no problem (pending, info)
    scraped: int = 0  # replicas scraped at least once: the "of 4" of "1 of 4 replicas down"

    @property
    def label(self) -> str:
        return LABELS[self.level]

    @property
    def colour(self) -> str:
        return COLOURS[self.level]

    def summary(self) -> str:
        """The status line: "Down: 1 of 4 replicas down · Burning: SLO ttft burning over 1h
        · 2 pending", one segment per level, worst first, each naming its reasons."""
        segments = []
        for level in reversed(LEVELS[1:]):
            mine = [r for r in self.reasons if r.level == level]
            if mine:
                segments.append(f"{LABELS[level]}: {_segment(level, mine, self.scraped)}")
        return " · ".join([*(segments or [self.label]), *self.notes])


def assess(
    alerts: Iterable[AlertState],
    slos: Iterable[SloState],
    replicas: Iterable[ReplicaState],
) -> FleetStatus:
    """The fleet's status by the module's rule, with every reason."""
    alerts, slos, replicas = list(alerts), list(slos), list(replicas)
    known = [r for r in replicas if r.known]
    all_serve = all(r.serving for r in known)
    said_burning = {s.name for s in slos if s.problem is None and (s.burning or s.exhausted)}
    reasons: list[Reason] = []
    for alert in alerts:
        if alert.state != FIRING or alert.severity == "info":
            continue
        text = f"{alert.rule} firing on {alert.where} ({alert.severity})"
        burning_slo = catalogue.burn_slo(alert.metric)
        if burning_slo is not None:
            if burning_slo in said_burning:
                continue  # the SLO's own reason says it burns, with its windows
            level, category = BURNING, "burn-alert"
        elif alert.severity != "page":
            level, category = DEGRADED, "alert"
        elif alert.metric in REPLICA_METRICS and not all_serve:
            level, category = DOWN, "replica-alert"
        else:  # a page on any other metric, or a replica's while every replica serves
            level, category = PAGING, "page"
        reasons.append(Reason(level, "alert", category, alert.rule, text, dict(alert.view)))
    if known and not any(r.serving for r in known):
        text = f"no replica serving ({len(known)} of {len(known)} down, stale or stalled)"
        reasons.append(Reason(DOWN, "fleet", "none", "fleet", text, replica_view(None)))
    for replica in replicas:
        trouble = replica.trouble
        if trouble is not None:
            text = f"{replica.name} {trouble}"
            view = replica_view(replica)
            reasons.append(Reason(DOWN, "replica", trouble, replica.name, text, view))
    for slo in slos:
        if slo.problem is not None:
            continue
        if slo.exhausted:
            text = f"SLO {slo.name}: error budget exhausted"
            reasons.append(Reason(BURNING, "slo", "exhausted", slo.name, text, slo_view(slo.name)))
        if slo.burning:
            text = f"SLO {slo.name}: burning over {', '.join(slo.burning)}"
            reasons.append(Reason(BURNING, "slo", "burning", slo.name, text, slo_view(slo.name)))
    level = max((r.level for r in reasons), key=LEVELS.index, default=OK)
    reasons.sort(key=lambda r: -LEVELS.index(r.level))  # stable: the order above within a level
    return FleetStatus(level, tuple(reasons), _notes(alerts, replicas), len(known))


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


def _notes(alerts: list[AlertState], replicas: list[ReplicaState]) -> tuple[str, ...]:
    pending = sum(1 for a in alerts if a.state == PENDING)
    info = sum(1 for a in alerts if a.state == FIRING and a.severity == "info")
    asleep = sum(1 for r in replicas if r.asleep_label is not None)
    notes = []
    if pending:
        notes.append(f"{pending} pending")
    if info:
        notes.append(f"{info} info firing")
    if asleep:
        notes.append(f"{asleep} replica{'' if asleep == 1 else 's'} asleep")
    return tuple(notes)


def asleep_label(replica: ReplicaStatus) -> str | None:
    """A replica of `kneepoint status` put to sleep on purpose, as the pages name it:
    "asleep (weights offloaded)"; None when awake, not known, down or stale."""
    return ReplicaState.from_status(replica).asleep_label


def _counted(category: str, n: int) -> str:
    one, many = CATEGORIES[category]
    if category == "none":
        return one
    return f"{n} {one if n == 1 else many}"


def _segment(level: str, reasons: list[Reason], scraped: int) -> str:
    """One level's reasons named ("; " between them: an SLO's windows are listed with ", "):
    replicas counted against the scraped ones, SLOs and alerts by name up to NAMED, counted
    past it."""
    if level == DOWN:
        parts = ["no replica serving"] if any(r.category == "none" for r in reasons) else []
        for trouble in ("down", "stale", "stalled"):
            n = sum(1 for r in reasons if r.category == trouble)
            if n:
                parts.append(f"{n} of {scraped} replica{'' if scraped == 1 else 's'} {trouble}")
        if parts:  # a replica-health alert is the same fact as the replicas counted
            return "; ".join(parts)
    if level == BURNING:
        slos: dict[str, list[str]] = {}
        for r in reasons:
            if r.kind == "slo":
                what = "budget exhausted" if r.category == "exhausted" else r.text.split(": ")[1]
                slos.setdefault(r.subject, []).append(what)
        named = [f"SLO {name} {' and '.join(what)}" for name, what in slos.items()]
        named += [r.text for r in reasons if r.kind != "slo"]
        if len(named) <= NAMED:
            return "; ".join(named)
    elif len(reasons) <= NAMED:
        return "; ".join(r.text for r in reasons)
    counts: dict[str, int] = {}
    for reason in reasons:
        counts[reason.category] = counts.get(reason.category, 0) + 1
    return ", ".join(_counted(category, n) for category, n in counts.items())
