"""What changed: one timeline of every change kneepoint can see in the data it stores.

Each detector is a pure function over consecutive stored samples (or stored rows) that
returns Events; `events` reads the store for a range and runs them all. What is detected:

- `restart`: a replica's stored process start time (vLLM's `process_start_time_seconds`)
  moved forward, or its counters went back (any cumulative counter lower than in the
  sample before); one event where both are seen. The start time finds the restart that
  loses no count (an idle replica whose counters were all zero); where it is not exposed
  (older vLLM, other engines) counter resets alone tell, and such a restart is seen only as
  the scrape outage around it.
- `config_change` and `upgrade`: the store keeps a replica's configuration each time it
  changes (target_configs, store/configs.py): model names, and `cache_config_info`'s block
  size, blocks, cache dtype, prefix caching and memory share are config changes; the
  engine's generation (an exposition of another vLLM release) an upgrade. The first
  configuration seen is no change.
- `engine_change`: the engine a replica's scrapes are read as changed (an `auto` target
  now serving SGLang where it served vLLM, a kind changed in the config): "engine changed
  from vLLM to SGLang" (its generation changes with it: no upgrade event besides).
- `gpu_xid`: a GPU's last XID (DCGM_FI_DEV_XID_ERRORS) becomes a new code.
- `gpu_throttle` / `gpu_power_cap`: dcgm-exporter's clock-event reasons
  (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, named CLOCKS_EVENT_REASONS from DCGM 3.3) gain a
  slowdown bit: HW slowdown, SW or HW thermal (throttle); SW power cap or HW power brake
  (power cap). Where the exporter does not export the field (it is not in its default
  set), nothing is stored and nothing is detected.
- `gpu_gone`: an exporter's scrape lists the GPUs it listed before, less one.
- `scrape_outage`: a run of failed scrapes of one target (runs apart by more than
  OUTAGE_GAP scrape intervals are two outages), with its length and first error.
- `sleep` / `wake`: a replica's stored sleep level (vLLM's `vllm:engine_sleep_state`, the
  max over its engines: 0 awake, 1 weights offloaded, 2 everything discarded) leaves 0 or
  moves to the other sleep level (`sleep`), or returns to 0 (`wake`). The first sample of
  a range is the baseline; a sample without the level (older vLLM, other engines) is
  skipped. A summary row keeps its bucket's mean level: a bucket that slept for part of it
  reads as asleep, and the event is at the bucket's time.
- `hit_rate_drop`: a replica's prefix-cache hit rate, on 5-minute intervals, more than
  HIT_RATE_DROP below its trailing hour's mean (the Prefix cache page's rule).
- `prefill_storm`: a replica's computed prompt tokens per second, on 5-minute intervals,
  above STORM_FACTOR times their trailing hour's median and at least STORM_MIN_RATE;
  consecutive stormy intervals are one storm.
- `alert_firing` / `alert_resolved`: alert_history's transitions to firing (not the
  reminders) and from firing to resolved.
- `silence`: a silence created, with its matchers, end, author and comment.
- `annotation`: a change posted from outside (`kneepoint annotate`, the annotation
  endpoint: kneepoint/annotations.py).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session

from collectors.engines import ENGINE_NAMES
from kneepoint import series
from kneepoint.config import Config
from kneepoint.derived import details
from kneepoint.samples import REPLICA_COUNTERS, sleep_state
from kneepoint.store import queries
from kneepoint.store.models import AnnotationRow, SilenceRow, TargetConfigRow

KINDS = (
    "restart",
    "config_change",
    "upgrade",
    "engine_change",
    "gpu_xid",
    "gpu_throttle",
    "gpu_power_cap",
    "gpu_gone",
    "scrape_outage",
    "sleep",
    "wake",
    "hit_rate_drop",
    "prefill_storm",
    "alert_firing",
    "alert_resolved",
    "silence",
    "annotation",
)

# Thresholds (docs/how-to/timeline.md quotes them). Hit-rate drops and prefill storms are the
# Prefix cache page's (kneepoint/derived/details.py), found per replica on EVENT_INTERVAL
# intervals.
EVENT_INTERVAL = "5min"
HISTORY = 3600.0  # their trailing baseline: the hour before
HIT_RATE_DROP = 0.30  # the hit rate this far (absolute) below its trailing hour's mean
STORM_FACTOR = 3.0  # computed prompt tokens/s against their trailing hour's median
STORM_MIN_RATE = 100.0  # computed prompt tokens/s: below this no storm (an idle replica waking)
OUTAGE_GAP = 3.0  # scrape intervals between failures that end one outage

# NVML's clock-event reason bits (nvmlClocksEventReason*).
THROTTLE_BITS = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown"}
POWER_BITS = {0x4: "SW power cap", 0x80: "HW power brake"}

# Configuration keys whose change is an upgrade rather than a config change (the engine's
# own change is an `engine_change`; its generation changes with it).
ENGINE_KEY = "engine"
UPGRADE_KEYS = (ENGINE_KEY, "generation")
# Counters whose fall marks a restart (every cumulative counter a replica has).
RESTART_COUNTERS = REPLICA_COUNTERS
# The stored process start time (samples.REPLICA_LAST_GAUGES) whose move forward is one.
PROCESS_START = "process_start_time"
# The stored sleep level (samples.REPLICA_GAUGES) whose changes are `sleep` and `wake`.
SLEEP_LEVEL = "sleep_level"


@dataclass(frozen=True)
class Event:
    """One change: when (epoch seconds), on which replica (None: the fleet), its kind (one
    of KINDS) and what it was, in words."""

    at: float
    replica: str | None
    kind: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape (`kneepoint timeline --json`): `at` as ISO 8601 UTC."""
        return {
            "at": iso(self.at),
            "replica": self.replica,
            "kind": self.kind,
            "detail": self.detail,
        }

    def line(self) -> str:
        """One line: time, kind, replica, detail (alert messages, the CLI's table)."""
        when = datetime.fromtimestamp(self.at, UTC).strftime("%H:%M:%S")
        where = f" {self.replica}" if self.replica else ""
        return f"{when} {self.kind}{where}: {self.detail}"


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# --- pure detectors -------------------------------------------------------------------


def restarts(
    replica: str,
    times: Sequence[float],
    counters: Mapping[str, Sequence[float | None]],
    started: Sequence[float | None] | None = None,
) -> list[Event]:
    """A restart at each sample whose process start time (`started`, epoch seconds; None:
    not known) is later than the last one known before it, or where some counter is lower
    than in the sample before: one event for a sample where both are seen."""
    found: list[Event] = []
    last: dict[str, float] = {}
    last_start: float | None = None
    for position, ts in enumerate(times):
        start = None if started is None else _number(started[position])
        moved = start is not None and last_start is not None and start > last_start
        if start is not None:
            last_start = start
        fallen: list[str] = []
        for name, values in counters.items():
            value = _number(values[position])
            if value is None:
                continue
            before = last.get(name)
            if before is not None and value < before:
                # Counts, whole: "1,869,330,000 → 734", never 1.86933e+09 on a page.
                fallen.append(f"{name} {before:,.0f} → {value:,.0f}")
            last[name] = value
        shown = ", ".join(fallen[:3]) + (f" and {len(fallen) - 3} more" if len(fallen) > 3 else "")
        if moved and start is not None:
            when = datetime.fromtimestamp(start, UTC).strftime("%H:%M:%S")
            reset = f"; counters reset ({shown})" if fallen else ""
            detail = f"process restarted (started at {when} UTC){reset}"
            found.append(Event(ts, replica, "restart", detail))
        elif fallen:
            found.append(Event(ts, replica, "restart", f"counters reset ({shown})"))
    return found


def sleeps(replica: str, times: Sequence[float], levels: Sequence[float | None]) -> list[Event]:
    """`sleep` where the level (0 awake, 1 weights offloaded, 2 everything discarded; None:
    not known, skipped) leaves 0 or moves between the sleep levels, `wake` where it returns
    to 0; the first known level is the baseline. A fraction (a summary row's mean) counts
    as asleep, at its level rounded up."""
    found: list[Event] = []
    before: int | None = None
    for ts, raw in zip(times, levels, strict=True):
        value = _number(raw)
        if value is None:
            continue
        level = math.ceil(value) if value > 0 else 0
        if before is not None and level != before:
            if level == 0:
                found.append(Event(ts, replica, "wake", "woke up (sleep mode ended)"))
            else:
                words = sleep_state(level)
                detail = f"went to sleep ({words})" if before == 0 else f"sleeps deeper ({words})"
                found.append(Event(ts, replica, "sleep", detail))
        before = level
    return found


def config_changes(replica: str, configs: Sequence[tuple[float, dict[str, Any]]]) -> list[Event]:
    """Between consecutive stored configurations: an `engine_change` where the engine
    differs, else an `upgrade` where its generation does, and a `config_change` for the
    other keys (model names, cache)."""
    found: list[Event] = []
    for (_, before), (ts, after) in itertools.pairwise(configs):
        keys = sorted(set(before) | set(after))
        upgraded = [k for k in keys if k in UPGRADE_KEYS and before.get(k) != after.get(k)]
        changed = [k for k in keys if k not in UPGRADE_KEYS and before.get(k) != after.get(k)]
        if ENGINE_KEY in upgraded and before.get(ENGINE_KEY) is not None:
            old, new = (_engine_name(c.get(ENGINE_KEY)) for c in (before, after))
            found.append(Event(ts, replica, "engine_change", f"engine changed from {old} to {new}"))
        elif upgraded:
            detail = ", ".join(
                f"{k} {_shown(before.get(k))} → {_shown(after.get(k))}" for k in upgraded
            )
            found.append(Event(ts, replica, "upgrade", detail))
        if changed:
            detail = ", ".join(
                f"{k} {_shown(before.get(k))} → {_shown(after.get(k))}" for k in changed
            )
            found.append(Event(ts, replica, "config_change", detail))
    return found


def gpu_xids(
    name: str, replica: str | None, times: Sequence[float], xids: Sequence[float | None]
) -> list[Event]:
    """An XID event where the GPU's last XID becomes a code it did not hold in the sample
    before (the field keeps the last code, so a code held is one XID, not one per sample);
    the first sample is the baseline (its code may be old)."""
    found: list[Event] = []
    before: float | None = None
    for position, (ts, raw) in enumerate(zip(times, xids, strict=True)):
        code = _number(raw)
        if not code:  # no reading, or none yet: a code seen again after it is not new
            continue
        if position and code != before:
            found.append(Event(ts, replica, "gpu_xid", f"XID {code:g} on {name}"))
        before = code
    return found


def gpu_clock_events(
    name: str, replica: str | None, times: Sequence[float], reasons: Sequence[float | None]
) -> list[Event]:
    """`gpu_throttle` where a slowdown bit is set that was not in the sample before;
    `gpu_power_cap` likewise for the power bits."""
    found: list[Event] = []
    before = -1  # the first sample is the baseline: what it holds may have begun before
    for ts, raw in zip(times, reasons, strict=True):
        value = _number(raw)
        bits = int(value) if value is not None else 0
        new = bits & ~before if before >= 0 else 0
        for kind, table in (("gpu_throttle", THROTTLE_BITS), ("gpu_power_cap", POWER_BITS)):
            reasons_on = [words for bit, words in table.items() if new & bit]
            if reasons_on:
                found.append(Event(ts, replica, kind, f"{', '.join(reasons_on)} on {name}"))
        before = bits
    return found


def gpus_gone(
    scrapes: Sequence[float],
    listed: Mapping[tuple[str, str | None], set[float]],
) -> list[Event]:
    """`gpu_gone` at each of an exporter's scrapes (`scrapes`, its sample times) that no
    longer lists a GPU the scrape before listed; `listed` maps (GPU name, replica) to the
    times it has a sample."""
    found: list[Event] = []
    for (name, replica), times in listed.items():
        present = False
        for ts in scrapes:
            here = ts in times
            if present and not here:
                found.append(Event(ts, replica, "gpu_gone", f"{name} no longer reported"))
            present = here
    return found


def outages(
    target: str, times: Sequence[float], errors: Sequence[str], interval: float
) -> list[Event]:
    """One `scrape_outage` per run of failures, at its first failure: runs are apart by
    more than OUTAGE_GAP scrape intervals."""
    found: list[Event] = []
    start = None
    last = -math.inf
    count = 0
    first_error = ""

    def close() -> None:
        if start is None:
            return
        lasted = f"{count} failed scrape{'s' if count > 1 else ''} over {last - start:.0f} s"
        found.append(Event(start, target, "scrape_outage", f"{lasted}: {first_error}"))

    for ts, error in zip(times, errors, strict=True):
        if start is None or ts - last > OUTAGE_GAP * interval:
            close()
            start, count, first_error = ts, 0, error
        count += 1
        last = ts
    close()
    return found


def hit_rate_drops(replica: str, series: pd.DataFrame) -> list[Event]:
    """`hit_rate_drop` where the replica's prefix-cache hit rate (EVENT_INTERVAL intervals)
    fell more than HIT_RATE_DROP below its trailing hour's mean: the Prefix cache page's
    rule (derived/details.py), per replica."""
    return [
        Event(
            e.start.timestamp(),
            replica,
            "hit_rate_drop",
            f"prefix-cache hit rate {e.value:.0%} against {e.baseline:.0%} in the hour before",
        )
        for e in details.hit_rate_drops(series, points=HIT_RATE_DROP)
    ]


def prefill_storms(replica: str, series: pd.DataFrame) -> list[Event]:
    """`prefill_storm` where computed prompt tokens per second (EVENT_INTERVAL intervals)
    rose above STORM_FACTOR times their trailing hour's median (the Prefix cache page's
    rule), and to at least STORM_MIN_RATE."""
    return [
        Event(
            e.start.timestamp(),
            replica,
            "prefill_storm",
            f"computed prompt tokens {e.value:.0f}/s against {e.baseline:.0f}/s in the hour before",
        )
        for e in details.prefill_storms(series, factor=STORM_FACTOR)
        if e.value >= STORM_MIN_RATE
    ]


def alert_events(rows: Iterable[dict[str, Any]]) -> list[Event]:
    """Firing (from another state: not a reminder) and resolved-after-firing transitions."""
    found: list[Event] = []
    for row in rows:
        before, after = row.get("before"), row["after"]
        value = _number(row.get("value"))
        shown = f" (value {value:.4g})" if value is not None else ""
        replica = row["replica"] or None
        if after == "firing" and before != "firing":
            found.append(
                Event(float(row["ts"]), replica, "alert_firing", f"{row['rule']} fired{shown}")
            )
        elif after == "resolved" and before == "firing":
            found.append(
                Event(float(row["ts"]), replica, "alert_resolved", f"{row['rule']} resolved{shown}")
            )
    return found


def silence_event(row: SilenceRow) -> Event:
    matchers: dict[str, str] = json.loads(row.matchers)
    what = ", ".join(f"{k}={v}" for k, v in sorted(matchers.items())) or "everything"
    until = iso(row.ends_at)
    comment = f": {row.comment}" if row.comment else ""
    detail = f"silence {row.id} ({what}) until {until} by {row.author}{comment}"
    return Event(row.created_at, matchers.get("replica"), "silence", detail)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _engine_name(engine: Any) -> str:
    """An engine as sentences name it (vllm → vLLM)."""
    return _shown(engine) if engine is None else ENGINE_NAMES.get(str(engine), str(engine))


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


# --- reading the store ----------------------------------------------------------------


def events(
    session: Session, config: Config, since: float, until: float, replica: str | None = None
) -> list[Event]:
    """Every event in [since, until], oldest first; only `replica`'s (and the fleet's) when
    given."""
    targets = queries.targets(session)
    names = {row.id: name for name, row in targets.items()}
    ids = None if replica is None else [row.id for name, row in targets.items() if name == replica]
    found: list[Event] = []
    found += _replica_events(session, names, since, until, ids)
    named = names if ids is None else {i: names[i] for i in ids}
    found += _config_events(session, named, since, until)
    found += _gpu_events(session, config, since, until)
    errors = queries.scrape_errors(session, since, until, limit=100_000)
    for target, group in errors.groupby("target", sort=False):
        found += outages(str(target), list(group.ts), list(group.error), config.scrape_interval)
    history = queries.alert_history(session, since, until, limit=100_000)
    found += alert_events(history.to_dict("records"))
    silences = session.scalars(
        select(SilenceRow).where(SilenceRow.created_at >= since, SilenceRow.created_at <= until)
    )
    found += [silence_event(row) for row in silences]
    found += annotation_events(session, since, until)
    if replica is not None:
        found = [e for e in found if e.replica in (replica, None)]
    found = [e for e in found if since <= e.at <= until]
    return sorted(found, key=lambda e: (e.at, KINDS.index(e.kind), e.replica or "", e.detail))


def annotation_events(session: Session, since: float, until: float) -> list[Event]:
    rows = session.scalars(
        select(AnnotationRow)
        .where(AnnotationRow.ts >= since, AnnotationRow.ts <= until)
        .order_by(AnnotationRow.ts)
    )
    return [
        Event(row.ts, row.replica, "annotation", f"{row.text} (by {row.author})") for row in rows
    ]


def _replica_events(
    session: Session, names: dict[int, str], since: float, until: float, ids: list[int] | None
) -> list[Event]:
    # From the hour before `since`: the trailing baselines of drops and storms.
    columns = list(dict.fromkeys([*series.COLUMNS, *RESTART_COUNTERS, PROCESS_START, SLEEP_LEVEL]))
    frame = queries.replica_frame(session, since - HISTORY, until, ids, columns=columns)
    found: list[Event] = []
    if frame.empty:
        return found
    # Series and intervals for every replica at once: per replica they cost ~18 ms each,
    # 19-34 s for 1,000 replicas (bench_scale); resampling is per replica all the same.
    intervals = series.resample(series.replica_series(frame, names), EVENT_INTERVAL)
    by_replica = {str(name): rows for name, rows in intervals.groupby("replica", sort=False)}
    # The detectors walk a replica's rows one by one (6-8 ms a replica, seconds at fleet
    # size); a vectorized pass for all replicas at once finds the few that may have an
    # event, and only those are walked: the events are the detectors' own.
    restarted, slept = _may_restart(frame), _may_sleep(frame)
    dropped, stormy = _may_drop(intervals), _may_storm(intervals)
    for target_id, rows in frame.groupby("target_id", sort=False):
        name = names.get(int(target_id))
        if name is None:
            continue
        if target_id in restarted:
            times = [float(t) for t in rows.ts]
            counters = {c: list(rows[c]) for c in RESTART_COUNTERS if c in rows}
            started = list(rows[PROCESS_START]) if PROCESS_START in rows else None
            found += restarts(name, times, counters, started)
        if target_id in slept:
            found += sleeps(name, [float(t) for t in rows.ts], list(rows[SLEEP_LEVEL]))
        mine = by_replica.get(name)
        if mine is not None:
            found += hit_rate_drops(name, mine) if name in dropped else []
            found += prefill_storms(name, mine) if name in stormy else []
    return found


def _may_restart(frame: pd.DataFrame) -> set[Any]:
    """The targets of `frame` with a row where a counter is lower than its last known value
    before, or the process start time later: those `restarts` finds an event for (it
    compares the same values, so no target with an event is left out)."""
    groups = frame.target_id
    flagged = pd.Series(False, index=frame.index)
    for name in [*RESTART_COUNTERS, PROCESS_START]:
        if name not in frame:
            continue
        values = frame[name].astype(float)
        before = values.groupby(groups).ffill().groupby(groups).shift()
        flagged |= (values > before) if name == PROCESS_START else (values < before)
    return set(groups[flagged].unique().tolist())


def _may_sleep(frame: pd.DataFrame) -> set[Any]:
    """The targets of `frame` whose known sleep level differs between two of their rows:
    only these can have a `sleep` or `wake` event."""
    if SLEEP_LEVEL not in frame:
        return set()
    levels = frame[SLEEP_LEVEL].astype(float)
    known = levels.groupby(frame.target_id).agg(["min", "max"])
    return set(known.index[known["min"] != known["max"]].tolist())


# The pre-filters' slack: a rolling statistic over every replica's rows at once may differ
# from one replica's own in the last bits; a replica near the threshold is walked anyway.
SLACK = 1e-6


def _trailing(intervals: pd.DataFrame, column: str, how: str) -> tuple[pd.Series, pd.Series]:
    """Each replica's `column` (rows that have it) and its trailing hour's `how` before
    each interval, as details.hit_rate_drops / prefill_storms compute them per replica."""
    rows = intervals.dropna(subset=[column]).sort_values(["replica", "time"], kind="stable")
    if rows.empty:
        return rows[column], rows[column]
    rolling = rows.groupby("replica", sort=False).rolling("1h", on="time")[column]
    # Indexed by (replica, time), in group order, each group's rows in order: with the rows
    # sorted by replica that is the rows' own order.
    statistic = pd.Series(getattr(rolling, how)().to_numpy(), index=rows.index)
    return rows[column], statistic.groupby(rows.replica).shift(1)


def _may_drop(intervals: pd.DataFrame) -> set[str]:
    """Replicas with an interval whose hit rate may be HIT_RATE_DROP below its trailing mean."""
    if intervals.empty:
        return set()
    values, trailing = _trailing(intervals, "hit_rate", "mean")
    near = values < trailing - HIT_RATE_DROP + SLACK
    return set(intervals.replica.loc[near[near].index].astype(str).tolist())


def _may_storm(intervals: pd.DataFrame) -> set[str]:
    """Replicas with an interval whose computed prompt tokens may be a prefill storm."""
    if intervals.empty:
        return set()
    values, trailing = _trailing(intervals, "computed_prompt_tokens_per_second", "median")
    near = (values > STORM_FACTOR * trailing.clip(lower=1.0) * (1 - SLACK)) & (
        values >= STORM_MIN_RATE * (1 - SLACK)
    )
    return set(intervals.replica.loc[near[near].index].astype(str).tolist())


def _config_events(
    session: Session, names: dict[int, str], since: float, until: float
) -> list[Event]:
    table = TargetConfigRow
    found: list[Event] = []
    for target_id, name in names.items():
        rows = list(
            session.execute(
                select(table.ts, table.config)
                .where(table.target_id == target_id, table.ts >= since, table.ts <= until)
                .order_by(table.ts)
            )
        )
        if not rows:
            continue
        before = session.execute(
            select(table.ts, table.config)
            .where(table.target_id == target_id, table.ts < since)
            .order_by(table.ts.desc())
            .limit(1)
        ).first()
        configs = [
            (float(ts), json.loads(text)) for ts, text in ([before] if before else []) + rows
        ]
        found += config_changes(name, configs)
    return found


def _gpu_events(session: Session, config: Config, since: float, until: float) -> list[Event]:
    from kneepoint.status import GpuOwners  # status imports much; only here

    frame = queries.gpu_frame(session, since - 600.0, until)  # and the samples before
    if frame.empty:
        return []
    exporters = queries.targets(session)
    by_id = {row.id: name for name, row in exporters.items()}
    # The config's GPU references indexed once per read, not once per GPU (status.replica_of
    # does): a walk over every target for each GPU, a million steps at 1,000 replicas.
    owners = GpuOwners(config)
    found: list[Event] = []
    for target_id, rows in frame.groupby("target_id", sort=False):
        exporter = by_id.get(int(target_id), str(target_id))
        listed: dict[tuple[str, str | None], set[float]] = {}
        for _gpu_id, gpu in rows.groupby("gpu_id", sort=False):
            first = gpu.iloc[0]
            host = str(first.host)
            index = int(first.gpu_index)
            pod = None if pd.isna(first.get("pod")) else str(first.get("pod"))
            namespace = None if pd.isna(first.get("namespace")) else str(first.get("namespace"))
            owner = owners.of({host, exporter}, index, pod, namespace) or exporter
            name = f"GPU {index} on {host}"
            times = [float(t) for t in gpu.ts]
            found += gpu_xids(name, owner, times, list(gpu.xid_error))
            if "clock_events" in gpu:
                found += gpu_clock_events(name, owner, times, list(gpu.clock_events))
            listed[(name, owner)] = set(times)
        scrapes = sorted({float(t) for t in rows.ts})
        found += gpus_gone(scrapes, listed)
    return found
