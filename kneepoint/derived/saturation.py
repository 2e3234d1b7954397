"""Is a replica saturated over a window, and why: the verdict that does not trust the KV
gauge alone (docs/explanation/saturation.md).

A replica is saturated when any of five things holds over the window, each with its
evidence in numbers:

* `kv_full`: KV-cache occupancy above samples.SATURATION for a meaningful share of it;
* `queue_growing`: requests wait in most of its samples and the queue does not drain, or
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
# not fall. A queue present most of the time that is not draining means arrivals keep up
# with or outrun service: the definition of a saturated server (queueing theory's ρ >= 1).
QUEUE_STANDING_SHARE = 0.5
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


def verdict(
    points: Sequence[LoadPoint],
    steps: Histogram | None = None,
    budget: float | None = None,
    ttft_parts: Sequence[Histogram | None] = (),
    rejections: float | None = None,
    no_series: str | None = None,
) -> Saturation:
    """The verdict over a window.

    `points`: the window's samples in time order; `steps`: the window's increase of the
    tokens-per-step histogram; `budget`: the configured per-step token budget (None: inferred
    from the histogram, see `token_budget_full`); `ttft_parts`: the TTFT histogram's increase
    over each of SUB_WINDOWS equal parts of the window, in order; `rejections`: the increase
    of admission rejections (None: the engine does not count them); `no_series`: why the
    caller read no series (then the reasons that need one are not judged, for that reason)."""
    reasons: list[Reason] = []
    unjudged: dict[str, str] = {}
    series: Judged = (None, no_series)
    judges = (
        ("kv_full", kv_full(points) if no_series is None else series),
        ("queue_growing", queue_growing(points) if no_series is None else series),
        ("token_budget_full", token_budget_full(steps, budget, points)),
        ("ttft_rising", ttft_rising(points, ttft_parts) if no_series is None else series),
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


def kv_full(points: Sequence[LoadPoint]) -> Judged:
    known = [
        (p, w) for p, w in zip(points, _spans(points), strict=True) if p.kv_occupancy is not None
    ]
    if len(known) < MIN_POINTS:
        return None, f"KV occupancy known at {len(known)} samples (fewer than {MIN_POINTS})"
    total = sum(w for _, w in known)
    above = sum(w for p, w in known if (p.kv_occupancy or 0.0) > SATURATION)
    share = above / total if total > 0 else 0.0
    if share < KV_FULL_SHARE:
        return None, None
    peak = max(p.kv_occupancy or 0.0 for p, _ in known)
    return _reason(
        "kv_full",
        f"KV occupancy above {SATURATION:.0%} for {share:.0%} of the window (peak {peak:.0%})",
        share,
    ), None


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    dx = x - x.mean()
    denominator = float((dx * dx).sum())
    return float((dx * (y - y.mean())).sum() / denominator) if denominator > 0 else 0.0


def queue_growing(points: Sequence[LoadPoint]) -> Judged:
    known = [p for p in points if p.waiting is not None]
    if len(known) < MIN_POINTS:
        return None, f"requests waiting known at {len(known)} samples (fewer than {MIN_POINTS})"
    waiting = [p.waiting or 0.0 for p in known]
    ts = [p.ts for p in known]
    share = sum(1 for w in waiting if w > 0) / len(waiting)
    slope = _slope(ts, waiting)
    rise = slope * (ts[-1] - ts[0])
    standing = share >= QUEUE_STANDING_SHARE and slope >= 0
    growing = rise >= QUEUE_RISE and share >= QUEUE_GROWING_SHARE
    if not (standing or growing):
        return None, None
    evidence = (
        f"requests waiting in {share:.0%} of samples, fitted trend {rise:+.1f} over the window "
        f"(peak {max(waiting):g} waiting)"
    )
    return _reason("queue_growing", evidence, share), None


def token_budget_full(
    steps: Histogram | None, budget: float | None, points: Sequence[LoadPoint] = ()
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
    if inferred and not any((p.waiting or 0.0) > 0 for p in points):
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


def ttft_rising(points: Sequence[LoadPoint], ttft_parts: Sequence[Histogram | None]) -> Judged:
    """TTFT's mean per sub-window (the histogram's sum ÷ count: exact, no bucket bounds)
    against the mean load (running + waiting) of the samples in it."""
    if len(ttft_parts) < 3:
        return None, "TTFT not read per sub-window"
    if len([p for p in points if p.running is not None]) < MIN_POINTS:
        return None, f"requests running known at fewer than {MIN_POINTS} samples"
    start, end = points[0].ts, points[-1].ts
    step = (end - start) / len(ttft_parts)
    pairs: list[tuple[float, float]] = []
    for index, part in enumerate(ttft_parts):
        if part is None or part.count <= 0:
            continue
        low, high = start + index * step, start + (index + 1) * step
        inside = [
            (p.running or 0.0) + (p.waiting or 0.0)
            for p in points
            if p.running is not None and low <= p.ts <= high
        ]
        if inside:
            pairs.append((sum(inside) / len(inside), part.total / part.count))
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
