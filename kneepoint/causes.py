"""Why the budget burns: when an SLO burns or a page fires, the likely cause and its evidence.

Five classes, each with the numbers that decide it (`classify`, a pure function):

- **upstream**: a stalled engine (kneepoint/derived/stall.py): requests running or waiting
  while no token counter moves. Everything downstream of it (latency, errors) follows.
- **hardware**: the timeline has a GPU event (XID, clock throttling, power capping, a GPU
  gone) in the hour before the trouble began, or a GPU of the replica reports an XID error
  now and the trouble began within the last `WINDOW` (an XID seen now cannot be placed
  before an older onset; its timeline event can).
- **software**: a restart, a configuration change, an engine upgrade or a deploy marker
  (annotation) in the hour before the trouble began (kneepoint/timeline.py).
- **load**: concurrency (requests running + waiting, the scale a sweep's knee is measured
  on) at or past the replica's knee (the stored run kneepoint.knee.detect holds it to).
- **capacity**: KV cache saturated (peak occupancy above 90 %), sequences waiting for KV
  capacity, preemptions above the `preemptions-sustained` threshold, or the replica's
  saturation verdict (kneepoint/derived/saturation.py) for a reason the KV gauge does not
  show: its queue growing, its token budget full, TTFT rising with load, load shed.
- **unknown**: none of these; the evidence says what was looked at.

A cause precedes what it explains. The trouble began at its `Onset` (`onset`): an SLO burn
at the start of the long window of the burn-rate pair that tripped (now − long window,
alerts/slo.py), any other alert when it went pending; without one, now. Only events in the
`LOOKBACK` before that moment count (at it included, after it never): a three-day burn is
not blamed on a restart minutes ago. When none fits, the evidence says so with the moment
("no change, XID or restart in the hour before the burn began at 09:12 UTC").

When several fit, the primary is the first in ORDER (a root before its symptoms: a wedged
engine or a failing GPU explains a queue; a deploy explains a changed cache; load past the
knee explains a full cache), and the others are listed as secondary. `gather` reads the
signals from the store: the status over `WINDOW` and each replica's peaks in it from the
database's few rows per replica (kneepoint/store/window_rows.py), the knees of the stored
runs, and the timeline's events over the `LOOKBACK` before the onset."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

from sqlalchemy.orm import Session

from kneepoint import catalogue, timeline
from kneepoint.config import Config
from kneepoint.durations import parse_duration
from kneepoint.knee.detect import assess, knee_for_replica
from kneepoint.records import GpuStatus
from kneepoint.samples import SATURATION
from kneepoint.status import build_status
from kneepoint.store import queries, window_rows
from kneepoint.store.runs import load_runs

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
LOOKBACK = 3600.0  # changes "just before": the hour before the onset
PREEMPTIONS_PER_SECOND = 0.05  # the `preemptions-sustained` rule's threshold
SOFTWARE_KINDS = ("restart", "config_change", "upgrade", "engine_change", "annotation")
HARDWARE_KINDS = ("gpu_xid", "gpu_throttle", "gpu_power_cap", "gpu_gone")
SHOWN = 2  # replicas or events named in one sentence; the rest are counted
STEP = 300.0  # onsets within the same 5 minutes share one read of the changes before them


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
    # The saturation verdict's evidence for its reasons other than a full KV cache (those
    # the KV peak above says already), from the status over the window.
    saturation: tuple[str, ...] = ()


@dataclass(frozen=True)
class Onset:
    """When the trouble began, and what began then ("the burn began", "the alert went
    pending"; "" for now, when nothing says earlier)."""

    at: float
    what: str = ""

    def said(self) -> str:
        """ "the burn began at 09:12 UTC", or "now"."""
        return f"{self.what} at {_clock(self.at)}" if self.what else "now"


def onset(metric: str, now: float, pending_since: float | None = None) -> Onset:
    """When an alert's trouble began: an SLO burn rule's (its metric catalogue.burn_metric,
    slo_burn:<slo>:<window>) at now − its long window, the burn that tripped it averaged over
    all of it; any other rule's when it went pending; else now."""
    window = catalogue.burn_window(metric)
    if window is not None:
        try:
            return Onset(now - parse_duration(window), "the burn began")
        except ValueError:  # not a window label: the pending time still bounds it
            pass
    if pending_since is not None and pending_since <= now:
        return Onset(pending_since, "the alert went pending")
    return Onset(now)


def burn_onset(now: float, long_windows: Sequence[float]) -> Onset:
    """An SLO burning over several windows: the shortest long window that tripped is the
    latest moment by which the burn surely ran (every longer one began before it)."""
    if not long_windows:
        return Onset(now)
    return Onset(now - min(long_windows), "the burn began")


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


def _before(ts: float, began: Onset) -> str:
    minutes = max(0, round((began.at - ts) / 60))
    when = f"{minutes} min before" if minutes else "just before"
    return f"{when} {began.what}" if began.what else when


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


def _hardware(
    replicas: Sequence[ReplicaSignals], events: Sequence[Event], began: Onset, now: float
) -> str | None:
    # An XID seen now precedes only a trouble that began within the window it is read over.
    fresh = began.at >= now - WINDOW
    parts = [f"{r.replica}: {', '.join(r.xid_gpus)} now" for r in replicas if r.xid_gpus and fresh]
    for event in events:
        if event.kind in HARDWARE_KINDS:
            where = f"{event.replica}: " if event.replica else ""
            parts.append(
                f"{where}{event.detail} at {_clock(event.at)} ({_before(event.at, began)})"
            )
    return _joined(parts) if parts else None


def _software(events: Sequence[Event], began: Onset) -> str | None:
    found = [e for e in events if e.kind in SOFTWARE_KINDS]
    parts = []
    for event in reversed(found):  # the latest first: the likeliest culprit
        where = f"{event.replica} " if event.replica else ""
        word = event.kind.replace("_", " ")
        parts.append(
            f"{where}{word} at {_clock(event.at)} ({_before(event.at, began)}): {event.detail}"
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
        found += r.saturation
        if found:
            parts.append(f"{r.replica}: {', '.join(found)}")
    return _joined(parts) if parts else None


def _nothing(replicas: Sequence[ReplicaSignals], began: Onset) -> str:
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
    said.append(f"no change, XID, stall or restart in the hour before {began.said()}")
    return ", ".join(said)


def classify(signals: Signals, replica: str | None = None, began: Onset | None = None) -> Cause:
    """The likely cause at `signals.at` of a trouble that began at `began` (None: now): for
    one replica (its events and the fleet's), or for the fleet (every replica and event)
    when `replica` is None or "". Only events in the LOOKBACK before `began` count."""
    began = began or Onset(signals.at)
    start = min(began.at, signals.at)
    replicas = [r for r in signals.replicas if not replica or r.replica == replica]
    events = [
        e
        for e in signals.events
        if start - LOOKBACK <= e.at <= start and (not replica or e.replica in (None, replica))
    ]
    found = {
        UPSTREAM: _upstream(replicas, signals.at),
        HARDWARE: _hardware(replicas, events, began, signals.at),
        SOFTWARE: _software(events, began),
        LOAD: _load(replicas),
        CAPACITY: _capacity(replicas),
    }
    matched = {kind: text for kind in ORDER if (text := found[kind]) is not None}
    if not matched:
        return Cause(UNKNOWN, _nothing(replicas, began))
    primary, *others = matched
    return Cause(primary, matched[primary], tuple(others), matched)


@dataclass(frozen=True)
class Trouble:
    """What a likely cause is asked for: one replica's trouble (None: the fleet's) that
    began at `began` (None: now)."""

    replica: str | None = None
    began: Onset | None = None


def lookback(began: float) -> tuple[float, float]:
    """The span read for the changes before an onset: its LOOKBACK, widened out to STEP
    bounds, so that onsets within the same STEP share one read (`classify` keeps each
    trouble's own hour of it)."""
    return math.floor((began - LOOKBACK) / STEP) * STEP, math.ceil(began / STEP) * STEP


def causes_of(
    signals: Signals,
    troubles: Sequence[Trouble],
    changes: Callable[[float, float], tuple[Event, ...]],
) -> list[Cause]:
    """Each trouble's likely cause from one gathering of `signals`: a trouble that began
    before them weighs the changes before its own onset, `changes(since, until)` over its
    `lookback` span (`changes_between`), read once per span however many troubles share it
    (one per 5 minutes of onsets, not one per alert)."""
    read: dict[tuple[float, float], tuple[Event, ...]] = {}
    out = []
    for trouble in troubles:
        found = signals
        began = trouble.began
        if began is not None and began.at < signals.at:
            span = lookback(began.at)
            if span not in read:
                read[span] = changes(*span)
            found = replace(signals, events=read[span])
        out.append(classify(found, trouble.replica, began))
    return out


def _ts(iso: str | None) -> float | None:
    if not iso:
        return None
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def gather(
    session: Session,
    config: Config,
    now: float,
    window: float = WINDOW,
    began: float | None = None,
    events: Sequence[Event] | None = None,
) -> Signals:
    """Every replica's signals over the window ending `now`, and the changes in the LOOKBACK
    before `began` (None: now), or `events` where the caller read them already.

    The window's numbers come from the database's few rows per replica
    (kneepoint/store/window_rows.py: the status's edge rows, its peaks and the two peaks of
    `loads`), at any fleet size: no replica's series is built only to take two maxima of it
    (that was 18 to 29 s a round at 1,000 replicas). The same signals as from the series
    (tests/kneepoint/test_causes_gather.py)."""
    edges = window_rows.read(session, now - window, now)
    status = build_status(session, config, now, window, edges=edges)
    ids = {name: row.id for name, row in queries.targets(session).items()}
    assessments = [assess(run, config.slos) for run in load_runs(session)]
    xids = _xids(status["gpus"])
    out = []
    for replica in status["replicas"]:
        name = replica["name"]
        target = ids.get(name)
        peaks = edges.peaks.get(target, {}) if target is not None else {}
        loads = edges.loads.get(target, {}) if target is not None else {}
        waiting_capacity = loads.get("peak_waiting_capacity")
        if waiting_capacity is None:  # no row of the window knows it: the latest, if any
            waiting_capacity = replica.get("requests_waiting_capacity")
        knee = knee_for_replica(name, replica.get("model_names") or [], assessments)
        out.append(
            ReplicaSignals(
                name,
                loads.get("peak_concurrency"),
                knee.knee_concurrency if knee else None,
                peaks.get("peak_kv_occupancy"),
                waiting_capacity,
                replica.get("preemptions_per_second"),
                xids.get(name, ()),
                replica.get("stalled"),
                _ts(replica.get("stalled_since")),
                replica.get("requests_running"),
                replica.get("requests_waiting"),
                tuple(
                    f"saturated, {reason['reason'].replace('_', ' ')}: {reason['evidence']}"
                    for reason in replica["saturation"]["reasons"]
                    if reason["reason"] != "kv_full"
                ),
            )
        )
    if events is None:
        events = changes_before(session, config, min(now, began or now))
    return Signals(now, tuple(out), tuple(events))


def _xids(gpus: Sequence[GpuStatus]) -> dict[str, tuple[str, ...]]:
    """Each replica's GPUs reporting an XID error, in the status's GPU order: one pass over
    the GPUs, not one per replica (a million steps at 1,000 replicas' GPUs)."""
    found: dict[str, list[str]] = {}
    for gpu in gpus:
        if gpu.get("xid_error") and isinstance(gpu["replica"], str):
            found.setdefault(gpu["replica"], []).append(
                f"GPU {gpu['host']}/{gpu['index']}: XID {gpu['xid_error']:.0f}"
            )
    return {replica: tuple(parts) for replica, parts in found.items()}


def changes_before(session: Session, config: Config, began: float) -> tuple[Event, ...]:
    """The timeline's events in the LOOKBACK before `began`: what `classify` weighs for a
    trouble that began then (a caller with signals in hand swaps them in for another onset).
    """
    return changes_between(session, config, began - LOOKBACK, began)


def changes_between(
    session: Session, config: Config, since: float, until: float
) -> tuple[Event, ...]:
    """The timeline's events in [since, until]; none when it cannot be read (logged)."""
    try:
        return tuple(timeline.events(session, config, since, until))
    except Exception:  # the timeline is a witness, not a dependency: the rest still counts
        log.exception("causes: the timeline could not be read")
        return ()
