"""A replica's stored week as the what-if needs it: its load per bucket of time (arrival
rate, prompt and output lengths, prefix reuse), what it measured (the numbers a prediction
is compared with), and its production load levels for calibration.

Everything is read through kneepoint/store/queries.py; counter increases handle resets as
PromQL's increase() does (kneepoint.counters), latency quantiles come from the summed
histogram buckets as histogram_quantile interpolates them (kneepoint.derived.latency).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sqlalchemy.orm import Session

from kneepoint.derived.latency import histogram_quantile, window_histogram
from kneepoint.samples import Histogram
from kneepoint.store import queries
from kneepoint.whatif.calibrate import Level
from kneepoint.whatif.profile import WhatIfError

BUCKET_SECONDS = 900.0  # the replay's unit of time: 15 minutes
SATURATED = 0.95  # KV occupancy at or above this counts as saturated (or any request waits
# for KV capacity)
COUNTERS = (
    "generation_tokens",
    "prompt_tokens",
    "prompt_tokens_local_compute",
    "preemptions",
    "prefix_cache_hits",
    "prefix_cache_queries",
    "request_prompt_tokens_sum",
    "request_prompt_tokens_count",
    "request_generation_tokens_sum",
    "request_generation_tokens_count",
    "spec_decode_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
)
GAUGES = ("kv_cache_usage", "requests_running", "requests_waiting", "requests_waiting_capacity")
LATENCIES = ("ttft", "itl", "e2e", "queue")
# samples.LOAD_HISTOGRAMS: each finished request's prompt and output length (vLLM's
# request_prompt_tokens and request_generation_tokens), read per bucket for the replay.
LENGTHS = ("prompt_length", "output_length")
EDGE_HISTOGRAMS = (*LATENCIES, *LENGTHS)


@dataclass(frozen=True)
class Bucket:
    """What one bucket of time saw (per second, or means over it)."""

    start: float
    seconds: float
    requests_per_second: float
    prompt_tokens_mean: float | None
    output_tokens_mean: float | None
    hit_rate: float | None
    generation_tokens_per_second: float
    prompt_tokens_per_second: float
    computed_prompt_tokens_per_second: float
    preemptions: float
    kv_cache_usage: float  # mean over the bucket
    running: float
    waiting: float
    saturated_seconds: float
    itl_mean_seconds: float | None
    e2e_mean_seconds: float | None = None
    # The bucket's prompt and output lengths (what its histograms gained over it); None where
    # the engine exports no length histogram (SGLang, TGI, …: the replay then spreads the
    # means) or the bucket finished no request.
    prompt_lengths: Histogram | None = None
    output_lengths: Histogram | None = None


@dataclass
class History:
    """A replica's window: buckets, window-summed latency histograms, totals."""

    replica: str
    start: float
    end: float
    buckets: list[Bucket]
    histograms: dict[str, Histogram | None] = field(default_factory=dict)
    capacity_tokens: int | None = None
    totals: dict[str, float] = field(default_factory=dict)  # counter increases
    running_peak: float = 0.0  # the most requests running in one sample

    @property
    def seconds(self) -> float:
        return sum(b.seconds for b in self.buckets)

    def mean(self, name: str, weight: str = "seconds") -> float | None:
        """The weighted mean of a bucket field (None where no bucket has it)."""
        pairs = [
            (getattr(b, name), b.seconds * (b.requests_per_second if weight != "seconds" else 1))
            for b in self.buckets
            if getattr(b, name) is not None
        ]
        total = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / total if total > 0 else None

    def measured(self) -> dict[str, float | None]:
        """The window's measured numbers, computed as the replay computes its own."""
        seconds = self.seconds
        gen = sum(b.generation_tokens_per_second * b.seconds for b in self.buckets)
        prompt = sum(b.prompt_tokens_per_second * b.seconds for b in self.buckets)
        out: dict[str, float | None] = {
            "seconds": seconds,
            "generation_tokens_per_second": gen / seconds if seconds else None,
            "prompt_tokens_per_second": prompt / seconds if seconds else None,
            "generation_tokens": gen,
            "prompt_tokens": prompt,
            "preemptions": sum(b.preemptions for b in self.buckets),
            "kv_cache_occupancy_p95": weighted_quantile(
                [b.kv_cache_usage for b in self.buckets], [b.seconds for b in self.buckets], 0.95
            ),
            "saturated_seconds": sum(b.saturated_seconds for b in self.buckets),
            "waiting_mean": self.mean("waiting"),
            "prefix_cache_hit_rate": self.mean("hit_rate", "requests"),
        }
        for name in LATENCIES:
            histogram = self.histograms.get(name)
            out[f"{name}_p50_seconds"] = histogram_quantile(0.5, histogram)
            out[f"{name}_p99_seconds"] = histogram_quantile(0.99, histogram)
        return out

    def levels(self, count: int = 6) -> list[Level]:
        """Production load levels for calibration: buckets grouped by requests running into
        `count` groups of equal time, each group's means (ITL from its histogram)."""
        busy = [b for b in self.buckets if b.running >= 0.5 and b.itl_mean_seconds]
        if not busy:
            return []
        busy.sort(key=lambda b: b.running)
        groups = [list(g) for g in np.array_split(np.asarray(busy, dtype=object), count) if len(g)]
        levels = []
        for group in groups:
            seconds = sum(b.seconds for b in group)

            def mean(name: str, group: list[Bucket] = group, seconds: float = seconds) -> float:
                return sum(getattr(b, name) * b.seconds for b in group) / seconds

            levels.append(
                Level(
                    running=mean("running"),
                    generation_tokens_per_second=mean("generation_tokens_per_second"),
                    computed_prompt_tokens_per_second=mean("computed_prompt_tokens_per_second"),
                    kv_cache_usage=mean("kv_cache_usage"),
                    itl_mean_seconds=mean("itl_mean_seconds"),
                    seconds=seconds,
                )
            )
        return levels


def weighted_quantile(
    values: Sequence[float] | np.ndarray, weights: Sequence[float] | np.ndarray, q: float
) -> float | None:
    """The smallest value with at least q of the weight at or below it (values of no weight,
    and values that are not finite, left out)."""
    v, w = np.asarray(values, dtype=float), np.asarray(weights, dtype=float)
    if v.shape != w.shape:
        raise ValueError(f"{len(v)} values but {len(w)} weights")
    keep = (w > 0) & np.isfinite(v)
    v, w = v[keep], w[keep]
    if not len(v):
        return None
    order = np.lexsort((w, v))  # by value, then weight: as sorting the (value, weight) pairs
    v, running = v[order], np.add.accumulate(w[order])  # added in order, as a loop adds
    total = float(running[-1])
    if total <= 0:
        return None
    reached = np.flatnonzero(running >= q * total - 1e-12)
    return float(v[reached[0]] if len(reached) else v[-1])


def fraction_at_most(histogram: Histogram | None, threshold: float) -> float | None:
    """Share of a histogram's observations at or below `threshold` (linear inside the
    bucket, as histogram_quantile assumes)."""
    if histogram is None or histogram.count <= 0:
        return None
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(histogram.bounds, histogram.counts, strict=True):
        if threshold < bound:
            if math.isinf(bound):
                return below / histogram.count
            share = (threshold - lower) / (bound - lower) if bound > lower else 1.0
            return (below + share * (cumulative - below)) / histogram.count
        lower, below = bound, cumulative
    return 1.0


def load_history(
    session: Session,
    replica: str,
    start: float,
    end: float,
    bucket: float = BUCKET_SECONDS,
) -> History:
    """The replica's stored rows over [start, end] in buckets of `bucket` seconds.

    Raises WhatIfError for an unknown replica or a window without history."""
    target = queries.targets(session).get(replica)
    if target is None or target.kind == "dcgm":
        raise WhatIfError(f"unknown replica {replica!r}")
    columns = [*COUNTERS, *GAUGES]
    # Rows no coarser than a bucket (the store's hourly summaries would merge buckets).
    frame = queries.replica_frame(
        session, start, end, [target.id], columns=columns, coarsest=int(bucket)
    )
    if len(frame) < 2:
        raise WhatIfError(f"no history of {replica} between the window's start and end")
    frame = frame.sort_values("ts", ignore_index=True)
    ts = frame.ts.astype(float).to_numpy()
    values = frame[list(COUNTERS)].astype(float).ffill()
    steps = values.diff()
    increases = steps.where(steps.isna() | (steps >= 0), values).fillna(0.0)
    seconds = np.diff(ts, prepend=ts[0])
    index = ((ts - ts[0]) // bucket).astype(int)
    gauges = frame[list(GAUGES)].astype(float).fillna(0.0)
    saturated = (gauges.kv_cache_usage >= SATURATED) | (gauges.requests_waiting_capacity > 0)
    edges, ordered = _edges(session, target.id, frame.ts, index)
    buckets = []
    for number in np.unique(index):
        mask = index == number
        span = float(seconds[mask].sum())
        if span <= 0:
            continue
        d = increases[mask].sum()
        weight = seconds[mask]
        requests = d.request_prompt_tokens_count
        own = edges.get(int(number), {})
        itl, e2e = own.get("itl"), own.get("e2e")
        buckets.append(
            Bucket(
                start=float(ts[mask][0]),
                seconds=span,
                requests_per_second=requests / span,
                prompt_tokens_mean=d.request_prompt_tokens_sum / requests if requests else None,
                output_tokens_mean=(
                    d.request_generation_tokens_sum / d.request_generation_tokens_count
                    if d.request_generation_tokens_count
                    else None
                ),
                hit_rate=(
                    d.prefix_cache_hits / d.prefix_cache_queries if d.prefix_cache_queries else None
                ),
                generation_tokens_per_second=d.generation_tokens / span,
                prompt_tokens_per_second=d.prompt_tokens / span,
                computed_prompt_tokens_per_second=d.prompt_tokens_local_compute / span,
                preemptions=float(d.preemptions),
                kv_cache_usage=float(np.average(gauges.kv_cache_usage[mask], weights=weight)),
                running=float(np.average(gauges.requests_running[mask], weights=weight)),
                waiting=float(np.average(gauges.requests_waiting[mask], weights=weight)),
                saturated_seconds=float(weight[saturated[mask].to_numpy()].sum()),
                itl_mean_seconds=itl.total / itl.count if itl is not None and itl.count else None,
                e2e_mean_seconds=e2e.total / e2e.count if e2e is not None and e2e.count else None,
                prompt_lengths=_counted(own.get("prompt_length")),
                output_lengths=_counted(own.get("output_length")),
            )
        )
    if not buckets:
        raise WhatIfError(f"no history of {replica} between the window's start and end")
    histograms = {name: window_histogram(ordered[name]) for name in LATENCIES}
    totals = {name: float(increases[name].sum()) for name in COUNTERS}
    return History(
        replica,
        start,
        end,
        buckets,
        histograms,
        target.capacity_tokens,
        totals,
        float(gauges.requests_running.max()),
    )


def _edges(
    session: Session, target_id: int, times: pd.Series, index: np.ndarray
) -> tuple[dict[int, dict[str, Histogram | None]], dict[str, list[Histogram | None]]]:
    """Each bucket's latency histograms (the increase from the bucket's edge to the next),
    and the edge samples' histograms in time order (for the window's, resets handled)."""
    firsts = pd.Series(times.to_numpy()).groupby(index).first()
    ends = [*firsts.iloc[1:].tolist(), float(times.iloc[-1])]
    keys = pd.DataFrame({"target_id": target_id, "ts": [*firsts.tolist(), ends[-1]]})
    rows = queries.replica_rows_at(session, keys.drop_duplicates())
    layouts = queries.histogram_layouts(session)
    decoded = {
        float(ts): dict(zip(EDGE_HISTOGRAMS, hists, strict=True))
        for ts, *hists in zip(
            rows.ts,
            *(queries.histograms(rows[f"hist_{name}"], layouts) for name in EDGE_HISTOGRAMS),
            strict=True,
        )
    }
    out: dict[int, dict[str, Histogram | None]] = {}
    for number, first, last in zip(firsts.index, firsts.tolist(), ends, strict=True):
        out[int(number)] = {
            name: difference(_at(decoded, first, name), _at(decoded, last, name))
            for name in EDGE_HISTOGRAMS
        }
    ordered = {name: [decoded[ts][name] for ts in sorted(decoded)] for name in LATENCIES}
    return out, ordered


def _counted(histogram: Histogram | None) -> Histogram | None:
    """A bucket's histogram where it counted something (else None: nothing to sample)."""
    return histogram if histogram is not None and histogram.count > 0 else None


def _at(
    decoded: dict[float, dict[str, Histogram | None]], ts: float, name: str
) -> Histogram | None:
    return decoded.get(float(ts), {}).get(name)


def difference(before: Histogram | None, after: Histogram | None) -> Histogram | None:
    """What a histogram gained between two samples (after a reset: all of `after`)."""
    if after is None:
        return None
    if before is None or before.bounds != after.bounds or after.count < before.count:
        return after if before is None or after.count < before.count else None
    counts = tuple(max(0.0, a - b) for a, b in zip(after.counts, before.counts, strict=True))
    return Histogram(after.bounds, counts, max(0.0, after.total - before.total))
