"""Is a replica saturated over a window, and why: the verdict that does not trust the KV
gauge alone (docs/explanation/saturation.md).

A replica is saturated when any of five things holds over the window, each with its
evidence in numbers:

* `kv_full`: KV-cache occupancy above samples.SATURATION for a meaningful share of it;
* `queue_growing`: requests wait in most of its samples and the queue does not drain (its
  fitted trend falls by less than a whole request), or
  the queue's fitted trend rises by whole requests over it (not a single spike);
* `token_budget_full`: most engine steps carry a full per-step token budget
  (`max_num_batched_tokens`; vLLM's `iteration_tokens_total` histogram);
* `ttft_rising`: time to first token rises with the load across the window's sub-windows;
* `load_shedding`: the engine refused requests at admission (vLLM's
  `admission_rejections_total`).

A reason whose inputs the window lacks is not judged (`unjudged` says why); the verdict is
`None` only when no reason could be judged at all. Pure functions over plain values: the
reads are kneepoint/status.py's."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from kneepoint.samples import SATURATION, Histogram

REASONS = ("kv_full", "queue_growing", "token_budget_full", "ttft_rising", "load_shedding")

# Samples below which a series says nothing about a window's course (a trend needs three).
MIN_POINTS = 3
# KV full: above SATURATION for a quarter of the window. One scrape above the line is a
# moment; a quarter of the window is a regime a user of that replica felt.
KV_FULL_SHARE = 0.25
# Queue standing: requests wait in at least half of the samples, and the fitted trend does
# not fall by a whole request (QUEUE_DRAIN) or more over the window. A queue present most of
# the time that is not draining means arrivals keep up with or outrun service: the
# definition of a saturated server (queueing theory's ρ >= 1). A queue standing at 2-3
# requests fits a line whose slope has either sign (on a real vLLM: -0.3 requests over 40 s
# with requests waiting in 93 % of the scrapes); a draining queue falls by whole requests.
QUEUE_STANDING_SHARE = 0.5
QUEUE_DRAIN = 1.0
# Queue growing: the least-squares line through the waiting requests rises by at least two
# whole requests over the window, with requests waiting in at least a quarter of the
# samples: a queue building up late in the window, which one outlier cannot make.
QUEUE_RISE = 2.0
QUEUE_GROWING_SHARE = 0.25
# Token budget full: at least half of the window's steps at the budget. Decode-only steps
# carry one token per sequence; a step at the budget is prefill work cut to fit, so most
# steps at it means the scheduler had more tokens to run than a step could hold.
BUDGET_FULL_SHARE = 0.5
# TTFT rising with load: over SUB_WINDOWS equal parts of the window, the busiest part's mean
# TTFT is at least TTFT_RISE × the quietest part's, the load itself differs by LOAD_RISE ×,
# and TTFT and load move together (Pearson correlation across the parts >= TTFT_LOAD_CORR).
SUB_WINDOWS = 4
TTFT_RISE = 1.5
LOAD_RISE = 1.5
TTFT_LOAD_CORR = 0.7
# Load shedding: one refused request is shedding (the engine's queue limit was reached).
SHED_MIN = 1.0


class Reason(TypedDict):
    """One reason a replica is saturated, with its evidence (in words) and its number."""

    reason: str  # one of REASONS
    evidence: str
    value: float


class Saturation(TypedDict):
    """A replica's saturation verdict over a window (status JSON `saturation`)."""

    saturated: bool | None  # None: nothing could be judged (`unknown` says why)
    reasons: list[Reason]
    unjudged: dict[str, str]  # a reason not judged -> why
    unknown: str | None


@dataclass(frozen=True)
class LoadPoint:
    """One stored sample's load gauges (None: not exposed at that sample)."""

    ts: float
    kv_occupancy: float | None
    waiting: float | None
    running: float | None


@dataclass(frozen=True)
class LoadStats:
    """A replica's load series over a window reduced to what the verdict reads: counts, sums
    and a few times. Two sources give it, the same numbers (to rounding) for the same rows:
    `of` over the samples in Python (a small fleet's rows are read whole), and the
    database's GROUP BY at fleet size (kneepoint/store/saturation_sql.py).

    A sample's weight is half the time to its neighbours (the window's ends count half).
    `waiting` is the series queue_growing reads; its least-squares fit is kept as the sums
    of the centred products (t̄, w̄: the means over the samples that know waiting), as the
    fit is computed from them. `part_load`/`part_samples`: over each of SUB_WINDOWS equal
    parts [start + k·step, start + (k + 1)·step] of [start, end] (both ends inclusive, as a
    sample on a boundary belongs to both), Σ (running + waiting) and the number of samples
    with running known."""

    start: float | None = None  # the first and last sample's time (None: no samples)
    end: float | None = None
    kv_known: int = 0
    kv_seconds: float = 0.0
    kv_above_seconds: float = 0.0  # KV occupancy above SATURATION
    kv_peak: float | None = None
    waiting_known: int = 0
    waiting_positive: int = 0
    waiting_first: float | None = None  # the first and last time waiting is known
    waiting_last: float | None = None
    waiting_peak: float | None = None
    waiting_sxx: float = 0.0  # Σ (t − t̄)²
    waiting_sxy: float = 0.0  # Σ (t − t̄)(w − w̄)
    running_known: int = 0
    part_load: tuple[float, ...] = (0.0,) * SUB_WINDOWS
    part_samples: tuple[int, ...] = (0,) * SUB_WINDOWS

    @staticmethod
    def of(points: Sequence[LoadPoint]) -> LoadStats:
        """The statistics of the samples `points`, in time order."""
        if not points:
            return LoadStats()
        weights = _spans(points)
        kv = [(p.kv_occupancy, w) for p, w in zip(points, weights, strict=True)]
        kv_known = [(k, w) for k, w in kv if k is not None]
        waiting = [(p.ts, p.waiting) for p in points if p.waiting is not None]
        ts = np.asarray([t for t, _ in waiting], dtype=float)
        ws = np.asarray([w for _, w in waiting], dtype=float)
        dt = ts - ts.mean() if len(ts) else ts
        start, end = points[0].ts, points[-1].ts
        step = (end - start) / SUB_WINDOWS
        loads, counts = [0.0] * SUB_WINDOWS, [0] * SUB_WINDOWS
        for p in points:
            if p.running is None:
                continue
            for k in range(SUB_WINDOWS):
                if start + k * step <= p.ts <= start + (k + 1) * step:
                    loads[k] += p.running + (p.waiting or 0.0)
                    counts[k] += 1
        return LoadStats(
            start=start,
            end=end,
            kv_known=len(kv_known),
            kv_seconds=sum(w for _, w in kv_known),
            kv_above_seconds=sum(w for k, w in kv_known if k > SATURATION),
            kv_peak=max((k for k, _ in kv_known), default=None),
            waiting_known=len(waiting),
            waiting_positive=sum(1 for _, w in waiting if w > 0),
            waiting_first=waiting[0][0] if waiting else None,
            waiting_last=waiting[-1][0] if waiting else None,
            waiting_peak=max((w for _, w in waiting), default=None),
            waiting_sxx=float((dt * dt).sum()),
            waiting_sxy=float((dt * (ws - ws.mean())).sum()) if len(ws) else 0.0,
            running_known=sum(1 for p in points if p.running is not None),
            part_load=tuple(loads),
            part_samples=tuple(counts),
        )


def verdict(
    loads: Sequence[LoadPoint] | LoadStats,
    steps: Histogram | None = None,
    budget: float | None = None,
    ttft_parts: Sequence[Histogram | None] = (),
    rejections: float | None = None,
) -> Saturation:
    """The verdict over a window.

    `loads`: the window's samples in time order, or their LoadStats; `steps`: the window's
    increase of the tokens-per-step histogram; `budget`: the configured per-step token budget
    (None: inferred from the histogram, see `token_budget_full`); `ttft_parts`: the TTFT
    histogram's increase over each of SUB_WINDOWS equal parts of the window, in order;
    `rejections`: the increase of admission rejections (None: the engine does not count
    them)."""
    stats = loads if isinstance(loads, LoadStats) else LoadStats.of(loads)
    reasons: list[Reason] = []
    unjudged: dict[str, str] = {}
    judges = (
        ("kv_full", kv_full(stats)),
        ("queue_growing", queue_growing(stats)),
        ("token_budget_full", token_budget_full(steps, budget, stats)),
        ("ttft_rising", ttft_rising(stats, ttft_parts)),
        ("load_shedding", load_shedding(rejections)),
    )
    for name, (found, why) in judges:
        if found is not None:
            reasons.append(found)
        elif why is not None:
            unjudged[name] = why
    if len(unjudged) == len(REASONS):
        return {
            "saturated": None,
            "reasons": [],
            "unjudged": unjudged,
            "unknown": "no reason could be judged: " + "; ".join(dict.fromkeys(unjudged.values())),
        }
    return {"saturated": bool(reasons), "reasons": reasons, "unjudged": unjudged, "unknown": None}


# Each judge returns (reason, None) when it holds, (None, None) when it was judged and does
# not hold, and (None, why) when it could not be judged.
Judged = tuple[Reason | None, str | None]


def _spans(points: Sequence[LoadPoint]) -> list[float]:
    """Each sample's weight: half the time to its neighbours (the window's ends count half)."""
    ts = [p.ts for p in points]
    return [
        ((ts[i + 1] if i + 1 < len(ts) else ts[i]) - (ts[i - 1] if i > 0 else ts[i])) / 2
        for i in range(len(ts))
    ]


def kv_full(stats: LoadStats) -> Judged:
    if stats.kv_known < MIN_POINTS:
        return None, f"KV occupancy known at {stats.kv_known} samples (fewer than {MIN_POINTS})"
    total = stats.kv_seconds
    share = stats.kv_above_seconds / total if total > 0 else 0.0
    if share < KV_FULL_SHARE:
        return None, None
    peak = stats.kv_peak or 0.0
    return _reason(
        "kv_full",
        f"KV occupancy above {SATURATION:.0%} for {share:.0%} of the window (peak {peak:.0%})",
        share,
    ), None


def queue_growing(stats: LoadStats) -> Judged:
    known = stats.waiting_known
    if known < MIN_POINTS:
        return None, f"requests waiting known at {known} samples (fewer than {MIN_POINTS})"
    share = stats.waiting_positive / known
    slope = stats.waiting_sxy / stats.waiting_sxx if stats.waiting_sxx > 0 else 0.0
    rise = slope * ((stats.waiting_last or 0.0) - (stats.waiting_first or 0.0))
    standing = share >= QUEUE_STANDING_SHARE and rise > -QUEUE_DRAIN
    growing = rise >= QUEUE_RISE and share >= QUEUE_GROWING_SHARE
    if not (standing or growing):
        return None, None
    evidence = (
        f"requests waiting in {share:.0%} of samples, fitted trend {rise:+.1f} over the window "
        f"(peak {stats.waiting_peak or 0.0:g} waiting)"
    )
    return _reason("queue_growing", evidence, share), None


def token_budget_full(
    steps: Histogram | None, budget: float | None, stats: LoadStats | None = None
) -> Judged:
    """Most steps at the per-step token budget.

    The histogram's buckets are powers of two (vLLM: 1, 8, 16, … 16384), so a step counts as
    "at the budget" when it falls in the bucket holding the budget: within a factor two of
    it. With `budget` configured that is the bucket whose upper bound is the first at or
    above it. Without it (vLLM does not export max_num_batched_tokens) the budget is
    inferred as the top finite bound that holds steps, and the reason then also needs
    requests to have waited in the window: steps that are all alike (every prompt the same
    length, nothing waiting) would otherwise look like a full budget."""
    if steps is None:
        return None, "no tokens-per-step histogram (the engine does not export one)"
    if steps.count <= 0:
        return None, "no engine steps in the window"
    finite = [i for i, b in enumerate(steps.bounds) if not math.isinf(b)]
    if budget is not None:
        top = next((i for i in finite if steps.bounds[i] >= budget), None)
        if top is None:
            return None, f"the budget {budget:g} is above the histogram's top bound"
        inferred = False
    else:
        holding = [i for i in finite if steps.counts[i] - (steps.counts[i - 1] if i else 0) > 0]
        if not holding:
            return None, "every step is above the histogram's top bound"
        top = holding[-1]
        inferred = True
    below = steps.counts[top - 1] if top > 0 else 0.0
    at_budget = steps.counts[top] - below
    # Steps above the budget's bucket (a configured budget below the real one) count too.
    above = steps.count - steps.counts[top]
    share = (at_budget + above) / steps.count
    if share < BUDGET_FULL_SHARE:
        return None, None
    if inferred and (stats is None or stats.waiting_positive == 0):
        return None, None
    lower = steps.bounds[top - 1] if top > 0 else 0.0
    source = (
        f"budget {budget:g} tokens (configured)"
        if not inferred
        else f"budget inferred as the top bucket holding steps, {steps.bounds[top]:g}"
    )
    evidence = (
        f"{share:.0%} of {steps.count:g} steps carried {lower:g}–{steps.bounds[top]:g} "
        f"tokens or more ({source})"
    )
    return _reason("token_budget_full", evidence, share), None


def ttft_rising(stats: LoadStats, ttft_parts: Sequence[Histogram | None]) -> Judged:
    """TTFT's mean per sub-window (the histogram's sum ÷ count: exact, no bucket bounds)
    against the mean load (running + waiting) of the samples in it."""
    if len(ttft_parts) != SUB_WINDOWS:
        return None, "TTFT not read per sub-window"
    if stats.running_known < MIN_POINTS:
        return None, f"requests running known at fewer than {MIN_POINTS} samples"
    pairs: list[tuple[float, float]] = []
    for part, load, inside in zip(ttft_parts, stats.part_load, stats.part_samples, strict=True):
        if part is None or part.count <= 0:
            continue
        if inside:
            pairs.append((load / inside, part.total / part.count))
    if len(pairs) < 3:
        return None, f"first tokens in {len(pairs)} sub-windows (fewer than 3)"
    loads = [load for load, _ in pairs]
    ttfts = [ttft for _, ttft in pairs]
    busiest, quietest = pairs[loads.index(max(loads))], pairs[loads.index(min(loads))]
    if quietest[0] <= 0 or busiest[0] < LOAD_RISE * quietest[0]:
        return None, None
    if quietest[1] <= 0 or busiest[1] < TTFT_RISE * quietest[1]:
        return None, None
    if float(np.std(ttfts)) == 0.0 or float(np.corrcoef(loads, ttfts)[0, 1]) < TTFT_LOAD_CORR:
        return None, None
    ratio = busiest[1] / quietest[1]
    evidence = (
        f"mean TTFT {quietest[1]:.3g} s at load {quietest[0]:.3g} rose to {busiest[1]:.3g} s "
        f"at load {busiest[0]:.3g} ({ratio:.1f}×)"
    )
    return _reason("ttft_rising", evidence, ratio), None


def load_shedding(rejections: float | None) -> Judged:
    if rejections is None:
        return None, "the engine does not count requests refused at admission"
    if rejections < SHED_MIN:
        return None, None
    return _reason(
        "load_shedding", f"{rejections:g} requests refused at admission (queue limit)", rejections
    ), None


def _reason(name: str, evidence: str, value: float) -> Reason:
    return {"reason": name, "evidence": evidence, "value": float(value)}


def labels(saturation: Saturation | None) -> str | None:
    """The verdict in a few words for a table cell: the reasons, "no", or None."""
    if saturation is None or saturation["saturated"] is None:
        return None
    if not saturation["saturated"]:
        return "no"
    return ", ".join(r["reason"].replace("_", " ") for r in saturation["reasons"])
