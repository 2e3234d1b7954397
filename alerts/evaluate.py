"""One evaluation round over the store: the numbers (from the kernel's View, as the pages and
the CLI show them), every rule, and the alerts' new states and history written back.

Maintenance windows (alerts/maintenance.py): an alert whose replica a window covers now is
still evaluated, and its state and history are written as always (the Alerts page shows it
firing), but its news is not sent: it goes to the outbox as `muted`, saying which window. When
the window ends, an alert still firing whose last news was muted so is sent as firing at the
next evaluation; one that resolved before anyone was told sends no resolution either. No
`repeat_interval` reminder is made while a window covers an alert: one that fell due is sent
when the window ends. SLO numbers leave the windows' time out (`measure`)."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session

from alerts import maintenance, slo, slo_prepared
from alerts import slo_replay as slo_replay_
from alerts.lifecycle import FIRING, RESOLVED, Alert, Transition, evaluate
from alerts.messages import enqueue, notice_for, read_ahead
from alerts.outbox import put
from alerts.rules import effective_rules
from alerts.values import FLEET, engine_since, monitor_values, not_exposed, values
from kneepoint.config import ENGINE_KINDS, Config, Rule, Slo
from kneepoint.derived import stall
from kneepoint.derived.window import EdgeReader, Window, frame_windows, merge
from kneepoint.samples import HISTOGRAMS, Histogram
from kneepoint.secrets import Secret
from kneepoint.status import hit_rates, stale_after, stall_after
from kneepoint.store import queries, slo_sums, stall_rows
from kneepoint.store.models import RAW, AlertHistoryRow, AlertRow, NotificationRow, TargetRow
from kneepoint.views import build_view

WINDOW = 300.0  # rates, ratios and quantiles over the last five minutes
BASELINE = 3600.0  # what a drop is measured against


def _alert_rows(session: Session) -> dict[str, AlertRow]:
    return {row.fingerprint: row for row in session.scalars(select(AlertRow))}


def _alert(row: AlertRow) -> Alert:
    return Alert(
        row.fingerprint,
        row.rule,
        row.replica,
        row.state,
        row.value,
        row.threshold,
        row.pending_since,
        row.fired_at,
        row.resolved_at,
    )


def _write_alerts(
    session: Session, rows: dict[str, AlertRow], states: dict[str, Alert], values: dict[str, Any]
) -> None:
    """Store `states` over the loaded `rows` (the same rows session.merge would leave): a
    row gone from `states` is deleted, a new one added, and only the changed columns of
    the others set. merge looked every row up again (the session holds loaded rows
    weakly, so each was a SELECT): 17 % of a round at 50 targets."""
    for key in set(rows) - set(states):  # pending that recovered before firing
        session.delete(rows[key])
    for key, alert in states.items():
        columns = {**asdict(alert), **values[key]}
        row = rows.get(key)
        if row is None:
            session.add(AlertRow(**columns))
            continue
        for name, value in columns.items():
            if getattr(row, name) != value:
                setattr(row, name, value)


# Burn windows are five minutes and longer: their rates are recomputed once a minute, not at
# every evaluation (reading up to three days of rows each time). Only the latest is kept.
_burn_cache: dict[tuple[Secret, str, float], dict[str, dict[float, float | None]]] = {}


def burn_rates_cached(
    session: Session, config: Config, now: float
) -> dict[str, dict[float, float | None]]:
    """burn_rates once a minute, from that minute's SLO reports, which the leader stores for
    the pages (alerts/slo_prepared.py): one computation feeds both."""
    key = (config.database, slo_prepared.fingerprint(config), now // 60)
    if key not in _burn_cache:
        _burn_cache.clear()
        reports = slo_prepared.prepare(session, config, now, slo_reports)
        _burn_cache[key] = {r.slo.name: r.rates for r in reports}
    return _burn_cache[key]


def advance_sums(
    session: Session, config: Config, now: float, budget: int = slo_sums.BUDGET
) -> int:
    """Fold the buckets that ended since into the SLO running sums, far enough back for the
    longest window any SLO reads (the evaluation's writer: the app only reads them), at most
    `budget` target-buckets at a time (slo_sums.advance)."""
    reach = max([*(s.window for s in config.slos), *slo.windows_needed()])
    layouts = queries.histogram_layouts(session)
    return slo_sums.advance(
        session, now, reach + slo_sums.BUCKET, layouts, budget=budget, rule=stall_rule(config)
    )


def burn_rates(
    session: Session, config: Config, now: float, direct: bool = False
) -> dict[str, dict[float, float | None]]:
    """Each SLO's burn rate over every window the burn alerts use, for the fleet (`direct`:
    from the samples alone, without the running sums)."""
    shared = _shared(config, now)  # what every window shares, read once
    fleet = {
        seconds: measure(session, config, now - seconds, now, direct, shared)
        for seconds in slo.windows_needed()
    }
    rates: dict[str, dict[float, float | None]] = {}
    for s in config.slos:
        try:
            rates[s.name] = {
                seconds: slo.burn_rate(s, window.of(s)) for seconds, window in fleet.items()
            }
        except slo.ThresholdNotABound:  # said by `alerts eval` and the SLOs page; no burn
            rates[s.name] = {}
    return rates


def slo_problems(session: Session, config: Config, now: float) -> list[str]:
    """SLOs whose threshold is not a bucket bound of the histogram they read."""
    fleet = measure(session, config, now - slo.HOUR, now)
    problems = []
    for s in config.slos:
        histogram = fleet.of(s)
        if not isinstance(histogram, slo.Histogram):
            continue
        try:
            slo.check_threshold(s, histogram.bounds)
        except slo.ThresholdNotABound as error:
            problems.append(str(error))
    return problems


def measure(
    session: Session,
    config: Config,
    since: float,
    until: float,
    direct: bool = False,
    shared: Shared | None = None,
) -> slo.Measured:
    """The fleet's histograms and availability counts over [since, until], without the time
    maintenance windows cover: each replica's window is cut into the stretches no window
    covers it, and every stretch is read on its own (increases within it, none across a
    cut), then all are added up.

    Replicas no maintenance window cuts are read from the running sums per bucket
    (kneepoint/store/slo_sums.py) and the raw samples of the partial bucket at each end;
    the rest, and those whose window the sums cannot give exactly, from the samples
    (`direct`: all of them, as before the sums). Their stalled seconds come from the sums
    too (judged on raw samples, runs whole: the bound on how far that is from the direct
    computation is in the slo_sums docstring); where the sums do not know them (rows summed
    before they kept stalls), the database returns only the rows of candidate stuck pairs of
    the window's rows (`_stalled_in_store`), and stall detection runs on them as on the whole
    window."""
    names = {t.name for t in config.targets if t.kind in ENGINE_KINDS}
    stored, layouts = _catalog(session, shared)
    ids = {name: target_id for name, target_id in stored.items() if name in names}
    groups: dict[tuple[maintenance.Interval, ...], list[int]] = {}
    for name, target_id in ids.items():
        cut = tuple(maintenance.excluded(config.maintenance, name, since, until))
        groups.setdefault(cut, []).append(target_id)
    wanted = any(s.kind == "availability" for s in config.slos)  # stalled time: only for those
    windows: list[Window] = []
    availability = slo.Availability()
    for cut, members in groups.items():
        if not cut and not direct:
            shared = shared or Shared(rule=stall_rule(config))
            summed, credited = _summed(session, since, until, sorted(members), layouts, shared)
            if summed:
                # Stalled seconds from the sums; the store's candidate rows where they do
                # not know them (rows summed before they kept stalls).
                rest = sorted(t for t in summed if t not in credited)
                stalled = credited if wanted else {}
                if wanted and rest:
                    stalled |= _stalled_in_store(session, config, rest, since, until, shared)
                for target_id, window in summed.items():
                    windows.append(window)
                    availability += _availability(window, stalled.get(target_id, 0.0))
                members = [m for m in members if m not in summed]
                if not members:
                    continue
        for start, end in maintenance.remaining(since, until, cut):
            frame = queries.replica_frame(
                session, start, end, sorted(members), columns=queries.LIGHT_COLUMNS
            )
            reader = None if "hist_ttft" in frame else _rows_at(session)
            spans = frame_windows(frame, layouts, reader)
            windows += spans.values()
            stalled = _stalled_seconds(frame, config, start, end) if wanted else {}
            for target_id, window in spans.items():
                availability += _availability(window, stalled.get(target_id, 0.0))
    merged = merge(windows)
    # The latency histograms an SLO reads (the windows also carry the load histograms).
    latency = {name: merged.histograms.get(name) for name in HISTOGRAMS}
    return slo.Measured(latency, availability if windows else None)


Catalog = tuple[dict[str, int], dict[int, tuple[float, ...]]]


def _catalog(session: Session, shared: Shared | None) -> Catalog:
    """Every target's id by name and the histogram layouts: read once per Shared (a round's
    windows read them alike)."""
    if shared is not None and shared.catalog is not None:
        return shared.catalog
    found = (
        {name: row.id for name, row in queries.targets(session).items()},
        queries.histogram_layouts(session),
    )
    if shared is not None:
        shared.catalog = found
    return found


class Shared:
    """What every window ending at the same time reads alike, read once for all of them
    (a burn-rate round's seven windows, the SLOs page's reports): each replica's newest
    summed row before the partial end bucket, and that bucket's samples; and the partial
    bucket at the start of every window of `starts`, with the summed rows before them, in
    one statement each for all windows."""

    def __init__(
        self,
        raw_since: float | None = None,
        starts: Sequence[float] = (),
        rule: slo_sums.StallRule = slo_sums.DEFAULT_RULE,
    ) -> None:
        self.rule = rule  # how the sums judge stalls (the config's: stall_rule)
        self.catalog: Catalog | None = None  # _catalog's, read by the first window
        self._ends: dict[tuple[float, float, tuple[int, ...]], Ends] = {}
        self.starts = _apart(starts)
        self._heads: dict[tuple[int, ...], dict[float, Heads]] = {}
        # The start of the round's longest window read from the raw samples alone: the
        # stall candidates of the shorter such windows are sliced from its.
        self.raw_since = raw_since
        self._stall: dict[tuple[float, float], tuple[set[int], pd.DataFrame]] = {}

    def stall_candidates(
        self, session: Session, ids: list[int], start: float, end: float
    ) -> pd.DataFrame:
        """stall_rows.candidates(session, ids, start, end), from one read for every window
        of raw samples that ends at `end`."""
        longest = self.raw_since
        if (
            longest is None
            or start < longest
            or queries.coarsest_for(end - start) != RAW
            or queries.coarsest_for(end - longest) != RAW
        ):
            return stall_rows.candidates(session, ids, start, end)
        read, rows = self._stall.get((longest, end), (set(), None))
        if rows is None or not read.issuperset(ids):  # each target's rows are its own
            read, rows = set(ids), stall_rows.candidates(session, ids, longest, end)
            self._stall[(longest, end)] = (read, rows)
        return stall_rows.sliced(rows[rows.target_id.isin(ids)], start)

    def end(
        self,
        session: Session,
        ids: list[int],
        high: float,
        until: float,
        layouts: dict[int, tuple[float, ...]],
    ) -> Ends:
        key = (high, until, tuple(ids))
        if key not in self._ends:
            self._ends[key] = _ends(session, ids, high, until, layouts, self.rule)
        return self._ends[key]

    def head(
        self,
        session: Session,
        ids: list[int],
        since: float,
        layouts: dict[int, tuple[float, ...]],
    ) -> Heads:
        """_heads(session, ids, [since]) for the window starting at `since`: from one read
        for every window of `starts` when it is one of them (per set of replicas: a
        maintenance window may leave a window fewer)."""
        if since not in self.starts:
            return _heads(session, ids, [since], layouts, self.rule)[since]
        key = tuple(ids)
        if key not in self._heads:
            self._heads[key] = _heads(session, ids, self.starts, layouts, self.rule)
        return self._heads[key][since]


def _apart(starts: Sequence[float]) -> tuple[float, ...]:
    """The starts, oldest first, whose partial buckets do not overlap the one before's
    (windows whose lengths differ by whole buckets: all of a round's); `_heads` tells a
    row's window by its time, so another is read on its own."""
    kept: list[float] = []
    for start in sorted(set(starts)):
        if not kept or start >= math.ceil(kept[-1] / slo_sums.BUCKET) * slo_sums.BUCKET:
            kept.append(start)
    return tuple(kept)


def _shared(config: Config, now: float, spans: Sequence[float] = ()) -> Shared:
    """A Shared for the windows of slo.windows_needed() (and of `spans`) that end `now`."""
    # now - (now - s): the span the window's reader sees, rounding and all.
    raw = [now - s for s in slo.windows_needed() if queries.coarsest_for(now - (now - s)) == RAW]
    starts = [now - s for s in (*slo.windows_needed(), *spans)]
    return Shared(min(raw, default=None), starts, stall_rule(config))


def stall_rule(config: Config) -> slo_sums.StallRule:
    """How the sums judge stalls: as `_stalled_seconds` does (the engine-stalled rule's
    `for`; a stuck pair spans at most stale_after, or twice the median step)."""
    return slo_sums.StallRule(stall_after(config), stale_after(config))


Ends = tuple[dict[int, dict[str, Any]], dict[int, slo_sums.Stretch], pd.DataFrame]
# A window's partial start bucket: each replica's stretch of samples in it, the summed row
# just before that bucket (its running sums and breaks) for those that have samples, and
# the samples themselves.
Heads = tuple[dict[int, slo_sums.Stretch], dict[int, dict[str, Any]], pd.DataFrame]


def _heads(
    session: Session,
    ids: list[int],
    starts: Sequence[float],
    layouts: dict[int, tuple[float, ...]],
    rule: slo_sums.StallRule = slo_sums.DEFAULT_RULE,
) -> dict[float, Heads]:
    """For the window starting at each of `starts`: the stretch of each replica's samples in
    [start, B0) (B0: the first bucket bound at or after it), and, for the replicas with
    one, their sums row at B0 − BUCKET. Two statements for all windows: the samples of every
    such bucket (whole: stall detection walks it from the state entering it, as the writer
    did), and the rows at every B0 − BUCKET."""
    size = slo_sums.BUCKET
    lows = {start: math.ceil(start / size) * size for start in starts}
    spans = [(low - size, low) for start, low in lows.items() if low > start]
    # Histograms from each window's start on: the stretch's edges are all there.
    since = [start for start, low in lows.items() if low > start]
    rows = slo_sums.raw_spans(session, ids, spans, since)
    stored = slo_sums.rows_in(
        session,
        ids,
        sorted({low - size for low in lows.values()}),
        (*SUM_BREAKS, "last", "last_ts"),
    )
    # Each row's bucket (the windows' buckets do not overlap: _apart).
    buckets = [math.floor(ts / size) * size for ts in rows.ts.astype(float)]
    of = {low - size: start for start, low in lows.items() if low > start}
    entering: dict[tuple[float, int], slo_sums.Run | None] = {}
    lasts: dict[tuple[float, int], tuple[float, slo_sums.Values]] = {}
    for bucket, rows_of in stored.items():
        for target_id, row in rows_of.items():
            last = json.loads(row["last"])
            lasts[(bucket, target_id)] = (float(row["last_ts"]), last)
            if "wi" in last:  # kept since the sums keep stalls
                entering[(bucket, target_id)] = slo_sums.Run.from_json(last["wi"])
    found = slo_sums.heads(rows, layouts, buckets, of, entering, rule, lasts)
    out: dict[float, Heads] = {
        start: ({}, {}, rows[(rows.ts >= start) & (rows.ts < low)] if len(rows) else rows)
        for start, low in lows.items()
    }
    for (bucket, target_id), stretch in found.items():
        start = of[bucket]
        heads, before, _ = out[start]
        heads[target_id] = stretch
        kept = stored.get(lows[start] - size, {}).get(target_id)
        if kept is not None:
            before[target_id] = kept
    return out


def _ends(
    session: Session,
    ids: list[int],
    high: float,
    until: float,
    layouts: dict[int, tuple[float, ...]],
    rule: slo_sums.StallRule = slo_sums.DEFAULT_RULE,
) -> Ends:
    """For `ids`: their latest sums row before `high` (its columns, and its running sums
    parsed as "part"), and the stretch of their samples in [high, until], each continuing
    from that row (slo_sums.stretches)."""
    ends = slo_sums.latest(session, ids, high, ("last_ts", "sig", "sums", "last", "breaks"))
    carried = {t: slo_sums.carried(e, slo_sums.Part(), 0) for t, e in ends.items()}
    for target_id, row in ends.items():
        row["part"] = _part(row["sums"])
        # Kept since the sums keep stalls: the tail's stall state continues from it.
        row["stall_known"] = "w" in carried[target_id].values
    rows = slo_sums.raw(session, ids, high, until, closed=True)
    return ends, slo_sums.stretches(rows, layouts, carried, rule), rows


def _summed(
    session: Session,
    since: float,
    until: float,
    ids: list[int],
    layouts: dict[int, tuple[float, ...]],
    shared: Shared | None = None,
) -> tuple[dict[int, Window], dict[int, float]]:
    """The windows over [since, until] of the replicas in `ids` that the running sums give
    exactly (those with samples in the window; the others are left to the samples): the
    raw samples in [since, B0) and [B1, until], and the sums' rows for the whole buckets
    between. A replica whose stretch holds a break (a counter appeared, a histogram's layout
    changed: `slo_sums` docstring), or whose rows are missing, is left out. Also each
    replica's stalled seconds, where the sums know them (rows written before they kept
    stalls do not): the credits at the window's samples (`slo_sums` docstring)."""
    progress = slo_sums.progress(session)
    size = slo_sums.BUCKET
    if progress is None or not ids:
        return {}, {}
    low = math.ceil(since / size) * size
    whole = math.floor(until / size) * size
    high = min(whole, progress.until)
    # Sums still being built (a first run catches up a day per round): the raw tail from
    # where they reach would be hours of samples with their histograms, which the samples'
    # path reads through the summary tiers instead. One bucket behind is the steady state
    # (a bucket is summed SETTLE seconds after it ends).
    if whole - high > size:
        return {}, {}
    shared = shared or Shared()
    if low > high:  # the window lies in the samples not summed yet, read at the end
        ends, tails, rows = shared.end(session, ids, high, until, layouts)
        credited = {
            t: sum(c for ts, c in tails[t][4] if ts >= since)
            for t, row in ends.items()
            if t in tails and row["stall_known"]
        }
        windows = _samples_only(rows[rows.ts >= since], layouts)
        return windows, {t: v for t, v in credited.items() if t in windows}
    if low - size < progress.since:
        return {}, {}
    heads, starts, _ = shared.head(session, ids, since, layouts)
    ends, tails, _ = shared.end(session, ids, high, until, layouts)
    firsts = (
        slo_sums.first_in(
            session,
            [t for t in ids if t not in heads],
            low,
            high,
            (*SUM_BREAKS, "inner", "inner_break"),
        )
        if low < high
        else {}
    )
    out: dict[int, Window] = {}
    stalled: dict[int, float] = {}
    for target_id in ids:
        total = slo_sums.Part()
        sigs: list[str] = []
        end = ends.get(target_id)
        head = heads.get(target_id)
        if head is not None:
            start = starts.get(target_id)
            if start is None or end is None or end["breaks"] != start["breaks"]:
                continue
            inner, _, _, sigs, _ = head
            # From the head's last sample (its bucket's last) to the last before `high`.
            total = inner.plus(end["part"]).plus(_part(start["sums"]), -1.0)
        elif (first := firsts.get(target_id)) is not None:
            assert end is not None  # a row in [low, high) is one before `high`
            if end["breaks"] - first["breaks"] + int(first["inner_break"]) != 0:
                continue
            # The first bucket's own increases, not the step into it from before `since`.
            total = end["part"].plus(_part(first["sums"]), -1.0).plus(_part(first["inner"]))
            sigs = [end["sig"]]
        elif end is None or not end["stall_known"]:
            total.st = None  # the tail's credits start from a state not known
        tail = tails.get(target_id)
        if tail is not None:
            inner, entry, _, tail_sigs, _ = tail
            # The tail continues from the last summed sample where the head or first row
            # reached the sums; else it is the whole window, with no step into it.
            if sigs and end is not None:
                sigs.append(end["sig"])
            else:
                entry = slo_sums.Part()
            sigs += tail_sigs
            total = total.plus(entry).plus(inner)
        if not sigs or total.n == 0:
            continue
        if len(set(sigs)) > 1:
            continue
        out[target_id] = _window(total, sigs[0], layouts)
        if total.st is not None:
            stalled[target_id] = total.st
    return out, stalled


def _samples_only(rows: pd.DataFrame, layouts: dict[int, tuple[float, ...]]) -> dict[int, Window]:
    """The windows from every sample in them (`rows`: a window no whole summed bucket lies
    in, from the read of the partial bucket at the end that the round's other windows
    share): each replica's increases within its samples, as the sums' path counts them."""
    out: dict[int, Window] = {}
    rows = rows.sort_values(["target_id", "ts"], kind="stable")
    for target_id, (inner, _, _, sigs, _) in slo_sums.stretches(rows, layouts).items():
        if inner.n and len(set(sigs)) == 1:
            out[target_id] = _window(inner, sigs[0], layouts)
    return out


SUM_BREAKS = ("sums", "breaks")


def _part(text: str) -> slo_sums.Part:
    return slo_sums.Part.from_json(text)


def _window(total: slo_sums.Part, sig: str, layouts: dict[int, tuple[float, ...]]) -> Window:
    """A replica's Window as frame_windows gives it, from its summed increases."""
    if total.n < 2:
        return Window(histograms=dict.fromkeys(HISTOGRAMS))
    return summed_window(total, sig, layouts)


def summed_window(total: slo_sums.Part, sig: str, layouts: dict[int, tuple[float, ...]]) -> Window:
    """A Window of summed increases (`sig`: which counters and layouts they hold)."""
    known, kinds = sig.split("|")
    window = Window(seconds=total.s)
    for name, bit in zip(slo_sums.AVAILABILITY, known, strict=True):
        window.deltas[name] = total.c.get(name, 0.0) if bit == "1" else None
    for name, layout in zip(HISTOGRAMS, kinds.split(","), strict=True):
        counts = total.h.get(name)
        if not layout or counts is None:
            window.histograms[name] = None
            continue
        cumulative = list(itertools.accumulate(counts[:-1], max))  # as window_histogram
        window.histograms[name] = Histogram(layouts[int(layout)], tuple(cumulative), counts[-1])
    return window


def _rows_at(session: Session) -> EdgeReader:
    return lambda keys: queries.replica_rows_at(session, keys)


FINISHED = slo_sums.FINISHED
FAILED = ("abort", "error")


def _availability(window: Window, stalled: float) -> slo.Availability:
    def total(names: list[str]) -> float:
        return sum(window.deltas.get(name) or 0.0 for name in names)

    return slo.Availability(
        finished=total([f"requests_finished_{r}" for r in FINISHED]),
        failed=total([f"requests_finished_{r}" for r in FAILED]),
        http=total(["http_requests"]),
        http_failed=total(["http_requests_5xx"]),
        seconds=window.seconds or 0.0,
        stalled=stalled,
        refused=total(["admission_rejections"]),
    )


# What stall detection reads, in stall.Point's order: the queues, then every progress counter
# (prompt and generation tokens, the engine's step counter), then the sleep level.
STALL_COLUMNS = ("requests_running", "requests_waiting", *stall.PROGRESS, "sleep_level")


def _stalled_seconds(
    frame: pd.DataFrame, config: Config, start: float, end: float
) -> dict[int, float]:
    """Seconds of [start, end] each replica in the frame was stalled (kneepoint/derived/
    stall.py). Replicas with no stuck pair of samples at all are skipped before the
    per-sample reading, in one vectorized pass."""
    if frame.empty or any(c not in frame for c in STALL_COLUMNS[:-1]):
        return {}
    if "sleep_level" not in frame:
        frame = frame.assign(sleep_level=float("nan"))
    groups = frame.groupby("target_id", sort=False)
    work = (frame.requests_running.fillna(0) + frame.requests_waiting.fillna(0) > 0) & ~(
        frame.sleep_level.astype(float) > 0
    )  # an asleep engine is not busy (stall.busy)
    # As stall.stuck: no progress counter moved (unknown at either sample: not read), and
    # at least one is known at both.
    moved = [groups[c].diff() for c in stall.PROGRESS]
    still = pd.concat([(d.isna() | (d == 0)) for d in moved], axis=1).all(axis=1)
    known = pd.concat([d.notna() for d in moved], axis=1).any(axis=1)
    stuck = work & work.groupby(frame.target_id).shift(fill_value=False) & still & known
    after = stall_after(config)  # the engine-stalled rule's `for`, overridden or not
    out: dict[int, float] = {}
    for target_id in frame.target_id[stuck].unique():
        rows = frame[frame.target_id == target_id]
        step = float(rows.ts.diff().median()) if len(rows) > 1 else 0.0
        points = [
            stall.Point(float(ts), *(_num(value) for value in values))
            for ts, *values in zip(rows.ts, *(rows[c] for c in STALL_COLUMNS), strict=True)
        ]
        intervals = stall.stalled_intervals(
            points, min_duration=after, max_gap=max(stale_after(config), 2 * step)
        )
        out[int(target_id)] = maintenance.overlap(intervals, start, end)
    return out


def _stalled_in_store(
    session: Session,
    config: Config,
    ids: list[int],
    start: float,
    end: float,
    shared: Shared | None = None,
) -> dict[int, float]:
    """What `_stalled_seconds` gives on replica_frame(start, end, ids), from the rows of
    candidate stuck pairs only (kneepoint/store/stall_rows.py: the database drops the
    rest). Each stretch of rows that were consecutive in the window is read on its own, so
    no two rows the database left apart are taken for a pair; every stuck pair lies in one,
    so the runs are those of the whole window."""
    rows = (shared or Shared()).stall_candidates(session, ids, start, end)
    if rows.empty:
        return {}
    # A pair further apart than stale_after may still be stuck: up to twice the replica's
    # median step, which needs the whole window; read it only where it decides.
    floor = stale_after(config)
    wide = (
        rows[(rows.stuck == 1) & (rows.ts - rows.prev_ts > floor)]
        .target_id.astype(int)
        .unique()
        .tolist()
    )
    medians = stall_rows.steps(session, sorted(wide), start, end)
    after = stall_after(config)
    out: dict[int, float] = {}
    for target_id, group in rows.groupby(rows.target_id.astype(int), sort=False):
        max_gap = max(floor, 2 * medians.get(int(target_id), 0.0))
        intervals: list[tuple[float, float]] = []
        stretch: list[stall.Point] = []
        for ts, prev_ts, *read in zip(
            group.ts, group.prev_ts, *(group[c] for c in STALL_COLUMNS), strict=True
        ):
            if stretch and stretch[-1].ts != prev_ts:  # a row the database left out between
                intervals += stall.stalled_intervals(stretch, after, max_gap)
                stretch = []
            stretch.append(stall.Point(float(ts), *(_num(value) for value in read)))
        intervals += stall.stalled_intervals(stretch, after, max_gap)
        out[int(target_id)] = maintenance.overlap(intervals, start, end)
    return out


def _num(value: object) -> float | None:
    return None if value is None or pd.isna(value) else float(value)  # type: ignore[arg-type]


def evaluate_once(session: Session, config: Config, now: float) -> list[Transition]:
    """Evaluate every rule now; store states and transitions; return the transitions."""
    rules = effective_rules(config)
    view = build_view(session, config, now, WINDOW, pages=False)  # what rules read
    # Drops are measured against the last hour's hit rates, as build_status gives them.
    baseline = hit_rates(session, config, now, BASELINE)
    rows = _alert_rows(session)  # held until written back: no second read
    current = {key: _alert(row) for key, row in rows.items()}
    watched = values(view, baseline)
    watched[FLEET] = {**watched[FLEET], **monitor_values(session, config, now)}
    if config.slos:
        advance_sums(session, config, now)
        rules = rules + slo.burn_rules(config.slos)
        watched[FLEET] = {
            **watched[FLEET],
            **slo.burn_values(config.slos, burn_rates_cached(session, config, now)),
        }
    # When each replica's engine was first seen: an alert whose metric a new engine does not
    # expose follows its rule's `no_data` for the rule's `for` before it ends for that reason.
    stored = dict(session.execute(select(TargetRow.name, TargetRow.engine_since)).all())
    since = engine_since(view.status, stored)
    states, transitions = evaluate(rules, watched, current, now, not_exposed(view.status), since)
    notified = {key: row.notified_at for key, row in rows.items()}
    lasting = maintenance.active(config.maintenance, now)  # maintenance windows now
    news = {c.alert.fingerprint for c in transitions if c.after == FIRING}
    reminders = [
        Transition(alert, FIRING, FIRING)
        for key, alert in states.items()
        if alert.state == FIRING
        and key not in news
        and config.repeat_interval > 0
        and (notified.get(key) or alert.fired_at or now) <= now - config.repeat_interval
        # No reminder while a maintenance window covers it: it is due once the window ends.
        and not any(o.covers(alert.replica) for o in lasting)
    ]
    news |= {r.alert.fingerprint for r in reminders}
    # The messages' reads first: the writes below hold SQLite's write lock until commit.
    ahead = read_ahead(session, config, rules, transitions + reminders, now)
    muted, unmuted = _maintenance(
        session, config, rules, transitions + reminders, states, notified, lasting, now, since
    )
    news = (news - muted) | {u.alert.fingerprint for u in unmuted}
    _write_alerts(
        session,
        rows,
        states,
        {
            key: {"updated_at": now, "notified_at": now if key in news else notified.get(key)}
            for key in states
        },
    )
    outgoing = [c for c in transitions + reminders if c.alert.fingerprint not in muted]
    # `since`: an alert ended because its engine changed says when (the message's why).
    enqueue(session, config, rules, outgoing + unmuted, now, states, ahead, since)
    for change in transitions:
        session.add(
            AlertHistoryRow(
                fingerprint=change.alert.fingerprint,
                rule=change.alert.rule,
                replica=change.alert.replica,
                ts=now,
                before=change.before,
                after=change.after,
                value=change.alert.value,  # the value seen now (None: no data)
                note=change.note,
            )
        )
    return transitions


def slo_reports(
    session: Session, config: Config, now: float, direct: bool = False
) -> list[slo.Report]:
    """Every SLO's compliance and budget over its window, and its burn rates, for the fleet,
    maintenance windows left out (`direct`: from the samples alone, without the sums)."""
    if not config.slos:  # nothing to report: no fleet windows to read (8 s at 1,000 replicas)
        return []
    shared = _shared(config, now, [s.window for s in config.slos])  # read once for all
    fleet = {
        seconds: measure(session, config, now - seconds, now, direct, shared)
        for seconds in slo.windows_needed()
    }
    wholes: dict[float, slo.Measured] = {}
    reports = []
    for s in config.slos:
        if s.window not in wholes:
            wholes[s.window] = measure(session, config, now - s.window, now, direct, shared)
        windows = {seconds: w.of(s) for seconds, w in fleet.items()}
        reports.append(slo.report(s, windows, wholes[s.window].of(s)))
    return reports


MUTED_BY = "maintenance window"


def _maintenance(
    session: Session,
    config: Config,
    rules: list[Rule],
    changes: list[Transition],
    states: dict[str, Alert],
    notified: dict[str, float | None],
    lasting: list[maintenance.Occurrence],
    now: float,
    engine_since: dict[str, float] | None = None,
) -> tuple[set[str], list[Transition]]:
    """Mute the news of alerts a maintenance window covers now (logged in the outbox as
    `muted`, naming the window); return their fingerprints, and the firing alerts whose news
    was muted by a window that has ended since, to be sent now (as firing)."""
    if not config.maintenance:
        return set(), []
    by_name = {rule.name: rule for rule in rules}
    muted: set[str] = set()
    for change in changes:
        rule = by_name.get(change.alert.rule)
        news = change.after == FIRING or (change.after == RESOLVED and change.before == FIRING)
        if rule is None or not news:
            continue
        window = next((o for o in lasting if o.covers(change.alert.replica)), None)
        if window is not None:
            why = f"{MUTED_BY} {window.name!r} (until {_iso(window.end)})"
        elif change.after == RESOLVED and _muted_last(session, change.alert.fingerprint):
            why = f"{MUTED_BY}: its firing fell in one and was never sent"
        else:
            continue
        muted.add(change.alert.fingerprint)
        notice = notice_for(change, rule, config, now, engine_since)  # an ending's why too
        for name in rule.channels:  # kept, so the log says why nothing was sent
            row = put(session, name, notice, now)
            row.state, row.last_error = "muted", why
    changing = {c.alert.fingerprint for c in changes}
    unmuted = [
        Transition(alert, FIRING, FIRING)
        for key, alert in states.items()
        if alert.state == FIRING
        and key not in changing
        and alert.rule in by_name
        # Not notified since it fired (a muted firing leaves notified_at as it was).
        and (notified.get(key) or 0.0) < (alert.fired_at or 0.0)
        and not any(o.covers(alert.replica) for o in lasting)
        and _muted_last(session, key)
    ]
    return muted, unmuted


def _muted_last(session: Session, fingerprint: str) -> bool:
    """Was this alert's last news muted by a maintenance window?"""
    last = session.scalars(
        select(NotificationRow)
        .where(NotificationRow.alert_keys.contains(fingerprint))
        .order_by(NotificationRow.id.desc())
        .limit(1)
    ).first()
    return (
        last is not None and last.state == "muted" and (last.last_error or "").startswith(MUTED_BY)
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def replay_series(
    session: Session, config: Config, since: float, until: float
) -> list[tuple[float, slo.Measured]]:
    """The fleet's increases per running-sums bucket (kneepoint/store/slo_sums.py) in
    [since, until), as (the bucket's end, what each kind of SLO reads): what an SLO replay
    evaluates its burn-rate alerts on (alerts/slo_replay.py). A replica's bucket that a
    maintenance window touches is left out, as is one where its counters or layout changed."""
    size = slo_sums.BUCKET
    low, high = math.floor(since / size) * size, math.floor(until / size) * size
    names = {t.name for t in config.targets if t.kind in ENGINE_KINDS}
    ids = {row.id: name for name, row in queries.targets(session).items() if name in names}
    layouts = queries.histogram_layouts(session)
    found = slo_sums.increments(session, sorted(ids), low, high)
    per_bucket: dict[float, tuple[list[Window], slo.Availability]] = {}
    for target_id, rows in found.items():
        cut = maintenance.excluded(config.maintenance, ids[target_id], low, high)
        for bucket, sig, part in rows:
            if part is None or any(s < bucket + size and e > bucket for s, e in cut):
                continue
            window = summed_window(part, sig, layouts)
            windows, availability = per_bucket.get(bucket, ([], slo.Availability()))
            windows.append(window)
            stalled = part.st or 0.0  # rows summed before the sums kept stalls: none known
            per_bucket[bucket] = (windows, availability + _availability(window, stalled))
    series = []
    for bucket in (low + i * size for i in range(int((high - low) // size))):
        if bucket not in per_bucket:  # nothing summed: nothing measured
            series.append((bucket + size, slo.Measured({}, None)))
            continue
        windows, availability = per_bucket[bucket]
        series.append((bucket + size, slo.Measured(merge(windows).histograms, availability)))
    return series


def slo_replay(
    session: Session, config: Config, proposal: Slo, until: float, span: float
) -> list[slo_replay_.Replayed]:
    """The proposed SLO replayed over [until − span, until], then each configured SLO of the
    same kind (and, for latency, the same metric) over the same span: compliance and budget
    spent from the fleet's window (`measure`, maintenance left out), burn-rate alerts from the
    running sums at every bucket (`replay_series`), each SLO's factors from its own window."""
    since = until - span
    whole = measure(session, config, since, until)
    series = replay_series(session, config, since - slo_replay_.REACH, until)
    same = [
        s
        for s in config.slos
        if s.kind == proposal.kind and (s.kind == "availability" or s.metric == proposal.metric)
    ]
    out = []
    for s, role in [(proposal, "proposed"), *((s, "configured") for s in same)]:
        steps = [(ts, m.of(s)) for ts, m in series]
        out.append(slo_replay_.replay(s, role, since, until, whole.of(s), steps))
    return out
