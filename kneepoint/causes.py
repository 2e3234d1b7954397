"""Why the budget burns: when an SLO burns or a page fires, the likely cause and its evidence.

Five classes, each with the numbers that decide it (`classify`, a pure function):

- **upstream**: a stalled engine (kneepoint/derived/stall.py): requests running or waiting
  while no token counter moves. Everything downstream of it (latency, errors) follows.
- **hardware**: a GPU of the replica reports an XID error now, or the timeline has a GPU
  event (XID, clock throttling, power capping, a GPU gone) in the hour before.
- **software**: a restart, a configuration change, an engine upgrade or a deploy marker
  (annotation) in the hour before (kneepoint/timeline.py).
- **load**: concurrency (requests running + waiting, the scale a sweep's knee is measured
  on) at or past the replica's knee (the stored run kneepoint.knee.detect holds it to).
- **capacity**: KV cache saturated (peak occupancy above 90 %), sequences waiting for KV
  capacity, or preemptions above the `preemptions-sustained` threshold.
- **unknown**: none of these; the evidence says what was looked at.

When several fit, the primary is the first in ORDER (a root before its symptoms: a wedged
engine or a failing GPU explains a queue; a deploy explains a changed cache; load past the
knee explains a full cache), and the others are listed as secondary. `gather` reads the
signals from the store: the kernel's View (kneepoint/views.py) over `WINDOW`, the knees of
the stored runs, and the timeline's events over `LOOKBACK`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from sqlalchemy.orm import Session

from kneepoint.config import Config
from kneepoint.samples import SATURATION

log = logging.getLogger(__name__)

LOAD, CAPACITY, HARDWARE, SOFTWARE, UPSTREAM, UNKNOWN = (
    "load",
    "capacity",
    "hardware",
    "software",
    "upstream",
    "unknown",
)
ORDER = (UPSTREAM, HARDWARE, SOFTWARE, LOAD, CAPACITY)
WINDOW = 900.0  # the numbers over the last 15 minutes: a page's `for:` and its onset
LOOKBACK = 3600.0  # changes "just before": the hour before, as the alert message lists them
PREEMPTIONS_PER_SECOND = 0.05  # the `preemptions-sustained` rule's threshold
SOFTWARE_KINDS = ("restart", "config_change", "upgrade", "annotation")
HARDWARE_KINDS = ("gpu_xid", "gpu_throttle", "gpu_power_cap", "gpu_gone")
SHOWN = 2  # replicas or events named in one sentence; the rest are counted


class Event(Protocol):
    """A change on the timeline (kneepoint.timeline.Event fits as it is)."""

    @property
    def at(self) -> float: ...

    @property
    def replica(self) -> str | None: ...

    @property
    def kind(self) -> str: ...

    @property
    def detail(self) -> str: ...


@dataclass(frozen=True)
class ReplicaSignals:
    """One replica's numbers over the window (None: not known)."""

    replica: str
    concurrency: float | None = None  # peak requests running + waiting
    knee: int | None = None  # the knee of the run the replica is held to
    kv_occupancy: float | None = None  # peak KV-cache occupancy (0..1)
    waiting_capacity: float | None = None  # peak sequences waiting for KV capacity
    preemptions_per_second: float | None = None
    xid_gpus: tuple[str, ...] = ()  # GPUs reporting an XID error now ("host/index: XID n")
    stalled: bool | None = None
    stalled_since: float | None = None
    running: float | None = None  # latest, for the stall's evidence
    waiting: float | None = None


@dataclass(frozen=True)
class Signals:
    at: float
    replicas: tuple[ReplicaSignals, ...] = ()
    events: tuple[Event, ...] = ()


@dataclass(frozen=True)
class Cause:
    kind: str  # one of ORDER, or UNKNOWN
    evidence: str  # one sentence with the numbers
    secondary: tuple[str, ...] = ()
    details: dict[str, str] = field(default_factory=dict)  # each matching class's sentence

    def line(self) -> str:
        also = f" (also {', '.join(self.secondary)})" if self.secondary else ""
        return f"{self.kind}: {self.evidence}{also}"


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M UTC")


def _before(ts: float, at: float) -> str:
    minutes = max(0, round((at - ts) / 60))
    return f"{minutes} min before" if minutes else "just before"


def _joined(parts: list[str]) -> str:
    shown = parts[:SHOWN]
    more = len(parts) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _upstream(replicas: Sequence[ReplicaSignals], at: float) -> str | None:
    parts = []
    for r in replicas:
        if r.stalled:
            since = f" since {_clock(r.stalled_since)}" if r.stalled_since else ""
            work = [
                f"{value:.0f} {word}"
                for value, word in ((r.running, "running"), (r.waiting, "waiting"))
                if value
            ]
            held = f" with {' and '.join(work)}" if work else ""
            parts.append(f"{r.replica}'s engine stalled{since}{held} and no token made")
    return _joined(parts) if parts else None


def _hardware(replicas: Sequence[ReplicaSignals], events: Sequence[Event], at: float) -> str | None:
    parts = [f"{r.replica}: {', '.join(r.xid_gpus)}" for r in replicas if r.xid_gpus]
    for event in events:
        if event.kind in HARDWARE_KINDS:
            where = f"{event.replica}: " if event.replica else ""
            parts.append(f"{where}{event.detail} at {_clock(event.at)} ({_before(event.at, at)})")
    return _joined(parts) if parts else None


def _software(events: Sequence[Event], at: float) -> str | None:
    found = [e for e in events if e.kind in SOFTWARE_KINDS]
    parts = []
    for event in reversed(found):  # the latest first: the likeliest culprit
        where = f"{event.replica} " if event.replica else ""
        word = event.kind.replace("_", " ")
        parts.append(
            f"{where}{word} at {_clock(event.at)} ({_before(event.at, at)}): {event.detail}"
        )
    return _joined(parts) if parts else None


def _load(replicas: Sequence[ReplicaSignals]) -> str | None:
    over = [
        r
        for r in replicas
        if r.knee is not None and r.concurrency is not None and r.concurrency >= r.knee
    ]
    over.sort(key=lambda r: (r.concurrency or 0.0) / max(r.knee or 1, 1), reverse=True)
    parts = [
        f"{r.replica} at {r.concurrency:.0f} concurrent requests (running + waiting) against "
        f"its knee of {r.knee}"
        for r in over
    ]
    return _joined(parts) if parts else None


def _capacity(replicas: Sequence[ReplicaSignals]) -> str | None:
    parts = []
    ranked = sorted(replicas, key=lambda r: r.kv_occupancy or 0.0, reverse=True)
    for r in ranked:
        found = []
        if r.kv_occupancy is not None and r.kv_occupancy > SATURATION:
            found.append(f"KV cache at {r.kv_occupancy:.0%}")
        if r.waiting_capacity:
            found.append(f"{r.waiting_capacity:.0f} waiting for KV capacity")
        if r.preemptions_per_second is not None and (
            r.preemptions_per_second > PREEMPTIONS_PER_SECOND
        ):
            found.append(f"{r.preemptions_per_second:.2f} preemptions/s")
        if found:
            parts.append(f"{r.replica}: {', '.join(found)}")
    return _joined(parts) if parts else None


def _nothing(replicas: Sequence[ReplicaSignals]) -> str:
    """What was looked at, with the numbers closest to a cause."""
    said = []
    with_knee = [r for r in replicas if r.knee is not None and r.concurrency is not None]
    if with_knee:
        r = max(with_knee, key=lambda r: (r.concurrency or 0.0) / max(r.knee or 1, 1))
        said.append(f"busiest {r.replica} at {r.concurrency:.0f} against its knee of {r.knee}")
    else:
        said.append("no replica with both a knee and a concurrency")
    kv = [r.kv_occupancy for r in replicas if r.kv_occupancy is not None]
    if kv:
        said.append(f"KV peak {max(kv):.0%}")
    said.append("no XID, stall or change in the hour before")
    return ", ".join(said)


def classify(signals: Signals, replica: str | None = None) -> Cause:
    """The likely cause at `signals.at`: for one replica (its events and the fleet's), or
    for the fleet (every replica and event) when `replica` is None or ""."""
    replicas = [r for r in signals.replicas if not replica or r.replica == replica]
    events = [
        e
        for e in signals.events
        if signals.at - LOOKBACK <= e.at <= signals.at
        and (not replica or e.replica in (None, replica))
    ]
    found = {
        UPSTREAM: _upstream(replicas, signals.at),
        HARDWARE: _hardware(replicas, events, signals.at),
        SOFTWARE: _software(events, signals.at),
        LOAD: _load(replicas),
        CAPACITY: _capacity(replicas),
    }
    matched = {kind: text for kind in ORDER if (text := found[kind]) is not None}
    if not matched:
        return Cause(UNKNOWN, _nothing(replicas))
    primary, *others = matched
    return Cause(primary, matched[primary], tuple(others), matched)


def _ts(iso: str | None) -> float | None:
    if not iso:
        return None
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def gather(session: Session, config: Config, now: float, window: float = WINDOW) -> Signals:
    """Every replica's signals over the window ending `now`, and the changes before it."""
    from kneepoint.knee.detect import assess, knee_for_replica
    from kneepoint.store.runs import load_runs
    from kneepoint.views import build_view

    view = build_view(session, config, now, window)
    assessments = [assess(run, config.slos) for run in load_runs(session)]
    series = view.series
    out = []
    for replica in view.status["replicas"]:
        name = replica["name"]
        rows = view.rows.get(name, {})
        mine = series[series.replica == name] if len(series) else series
        concurrency = None
        if len(mine) and mine.requests_running.notna().any():
            concurrency = float((mine.requests_running + mine.requests_waiting.fillna(0)).max())
        waiting_capacity = (
            float(mine.requests_waiting_capacity.max())
            if len(mine) and mine.requests_waiting_capacity.notna().any()
            else replica.get("requests_waiting_capacity")
        )
        knee = knee_for_replica(name, replica.get("model_names") or [], assessments)
        xids = tuple(
            f"GPU {g['host']}/{g['index']}: XID {g['xid_error']:.0f}"
            for g in view.status["gpus"]
            if g["replica"] == name and g.get("xid_error")
        )
        out.append(
            ReplicaSignals(
                name,
                concurrency,
                knee.knee_concurrency if knee else None,
                rows.get("peak_kv_occupancy", replica.get("kv_cache_occupancy")),
                waiting_capacity,
                replica.get("preemptions_per_second"),
                xids,
                replica.get("stalled"),
                _ts(replica.get("stalled_since")),
                replica.get("requests_running"),
                replica.get("requests_waiting"),
            )
        )
    try:
        from kneepoint import timeline

        changes = timeline.events(session, config, now - LOOKBACK, now)
    except Exception:  # the timeline is a witness, not a dependency: the rest still counts
        log.exception("causes: the timeline could not be read")
        changes = []
    return Signals(now, tuple(out), tuple(changes))


def likely_cause(session: Session, config: Config, now: float, replica: str | None = None) -> Cause:
    """`classify` over what the store holds now."""
    return classify(gather(session, config, now), replica)
