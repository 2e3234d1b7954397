"""Replay a replica's stored load through its calibrated twin, in virtual time.

A week step by step is millions of engine steps, so the window is replayed by load level, as
the twin's own backfill builds a week (kneepoint/twin/backfill.py): the twin runs a few
steady loads spanning the window's request rates, each until steady, and each bucket of the
window (15 minutes) takes what the two levels around its rate did, weighted by how close it
is (counters and means linearly, latency samples as a mixture).

The load is sessions (closed loop, as agents and chat users are): each session sends a
request, waits for its answer, thinks, and sends the next. At a request rate λ whose
requests took R seconds end to end (the e2e histogram), λ × (R + Z) sessions with a think
time Z send exactly λ per second: the baseline has the measured rate whatever Z is; a change
that makes answers faster or slower moves the rate as real sessions would. Requests have the
window's mean prompt and output lengths (spread log-normally: the store keeps the length
histograms' sums and counts, not their buckets) and take a share of their prompt from their
session's prefix, sized so that the engine as calibrated hits its prefix cache as often as
the window measured. docs/explanation/whatif.md lists every approximation.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kneepoint.config import Slo
from kneepoint.twin.simulated_engine import Engine, EngineConfig, Request
from kneepoint.whatif.changes import Change, apply
from kneepoint.whatif.history import SATURATED, History, weighted_quantile
from kneepoint.whatif.profile import Profile, WhatIfError

THINK_SECONDS = 5.0  # a session's mean pause between an answer and its next request
MAX_SECONDS = 3600.0  # the longest a level runs in virtual time
LENGTH_SIGMA = 0.5  # log-normal spread of prompt and output lengths around their means
VOCABULARY = 150_000


@dataclass(frozen=True)
class Load:
    """The replica's load over the window, as the twin needs it."""

    buckets: tuple[tuple[float, float], ...]  # (seconds, requests per second) per bucket
    prompt_tokens_mean: float
    output_tokens_mean: float
    hit_rate: float  # prefix-cache hit rate, token-weighted
    # Mean end-to-end latency at a request rate, measured: (rate, seconds) points by rate.
    latency: tuple[tuple[float, float], ...]
    think_seconds: float = THINK_SECONDS
    # The hit rate at light load (the third of the window with the lowest request rate) and
    # that rate: the traffic's reuse where the cache is least pressed.
    light: tuple[float, float] = (0.0, 0.0)
    # The share of each prompt every session has in common (a system prompt): running
    # requests share its blocks, so the KV they hold is less than their prompts.
    common_share: float = 0.0

    @property
    def seconds(self) -> float:
        return sum(s for s, _ in self.buckets)

    @property
    def requests(self) -> float:
        return sum(s * r for s, r in self.buckets)

    def e2e_at(self, rate: float) -> float:
        """The measured mean end-to-end latency at `rate` (interpolated between rates)."""
        if not self.latency:
            return 0.0
        rates, seconds = zip(*self.latency, strict=True)
        return float(np.interp(rate, rates, seconds))

    def sessions_at(self, rate: float) -> float:
        """Sessions that send `rate` requests per second (Little's law over R + Z)."""
        return rate * (self.e2e_at(rate) + self.think_seconds)

    def as_dict(self) -> dict[str, Any]:
        peak = max((r for _, r in self.buckets), default=0.0)
        return {
            "seconds": self.seconds,
            "requests": self.requests,
            "requests_per_second_mean": self.requests / self.seconds if self.seconds else 0.0,
            "requests_per_second_peak": peak,
            "prompt_tokens_mean": self.prompt_tokens_mean,
            "output_tokens_mean": self.output_tokens_mean,
            "prefix_cache_hit_rate": self.hit_rate,
            "think_seconds": self.think_seconds,
            "sessions_at_peak": self.sessions_at(peak),
        }


def load_of(history: History, think_seconds: float = THINK_SECONDS) -> Load:
    """The load of a stored window; WhatIfError when it saw no request."""
    requests = sum(b.requests_per_second * b.seconds for b in history.buckets)
    if requests <= 0:
        raise WhatIfError(f"{history.replica} served no request in the window: nothing to replay")
    prompt = history.mean("prompt_tokens_mean", "requests")
    output = history.mean("output_tokens_mean", "requests")
    if not prompt or not output:
        raise WhatIfError(
            f"{history.replica}'s history has no request prompt/generation token counts"
        )
    if think_seconds < 0:
        raise WhatIfError("think time must not be negative")
    queries = [(b.hit_rate, b.prompt_tokens_per_second * b.seconds) for b in history.buckets]
    known = [(h, w) for h, w in queries if h is not None and w > 0]
    weight = sum(w for _, w in known)
    hit = sum(h * w for h, w in known) / weight if weight else 0.0
    return Load(
        buckets=tuple((b.seconds, b.requests_per_second) for b in history.buckets),
        prompt_tokens_mean=float(prompt),
        output_tokens_mean=float(output),
        hit_rate=float(hit),
        latency=_latency_curve(history),
        think_seconds=think_seconds,
        light=_light(history),
        common_share=_common_share(history, float(prompt), float(output)),
    )


def _common_share(history: History, prompt: float, output: float) -> float:
    """The share of a prompt common to all sessions, from what running requests hold: b
    requests of mean length L (prompt and half the output) sharing C tokens hold
    b·L − (b − 1)·C, so C = (b·L − held) / (b − 1), held = occupancy × capacity."""
    capacity = history.capacity_tokens
    if not capacity:
        return 0.0
    length = prompt + output / 2
    estimates = [
        (
            (b.running * length - b.kv_cache_usage * capacity) / (b.running - 1),
            b.seconds * b.running,
        )
        for b in history.buckets
        if b.running >= 2
    ]
    weight = sum(w for _, w in estimates)
    if not weight:
        return 0.0
    common = sum(c * w for c, w in estimates) / weight
    return float(min(max(common / prompt, 0.0), 0.9))


def _light(history: History) -> tuple[float, float]:
    """(request rate, hit rate) over the third of the window's time with the lowest rate."""
    busy = sorted(
        (b for b in history.buckets if b.requests_per_second > 0 and b.hit_rate is not None),
        key=lambda b: b.requests_per_second,
    )
    total = sum(b.seconds for b in busy)
    chosen, seen = [], 0.0
    for bucket in busy:
        if seen >= total / 3:
            break
        chosen.append(bucket)
        seen += bucket.seconds
    requests = sum(b.requests_per_second * b.seconds for b in chosen)
    queries = sum(b.prompt_tokens_per_second * b.seconds for b in chosen)
    if not requests or not queries:
        return (0.0, 0.0)
    hits = sum((b.hit_rate or 0.0) * b.prompt_tokens_per_second * b.seconds for b in chosen)
    return (requests / seen, hits / queries)


def _latency_curve(history: History, groups: int = 8) -> tuple[tuple[float, float], ...]:
    """Mean e2e latency by request rate: buckets in `groups` of equal count by rate."""
    known = sorted(
        (b.requests_per_second, b.e2e_mean_seconds, b.requests_per_second * b.seconds)
        for b in history.buckets
        if b.e2e_mean_seconds is not None and b.requests_per_second > 0
    )
    if not known:  # no e2e histogram (the engine does not expose it): sessions think only
        return ()
    points = []
    for group in np.array_split(np.asarray(known, dtype=float), min(groups, len(known))):
        if len(group) and group[:, 2].sum() > 0:
            weights = group[:, 2]
            points.append(
                (
                    float(np.average(group[:, 0], weights=weights)),
                    float(np.average(group[:, 1], weights=weights)),
                )
            )
    return tuple(points)


@dataclass
class LevelRun:
    """What one replica did per second at a steady load."""

    rate: float  # the request rate the level stands for (the measured one)
    sessions: int
    seconds: float
    rates: dict[str, float] = field(default_factory=dict)  # per second
    means: dict[str, float] = field(default_factory=dict)  # time means
    samples: dict[str, np.ndarray] = field(default_factory=dict)  # latency samples


COUNTS = (
    "requests",
    "generation_tokens",
    "prompt_tokens",
    "computed_prompt_tokens",
    "preemptions",
    "recomputed_prefill_tokens",
    "prefix_cache_hits",
    "prefix_cache_queries",
)
MEAN_KEYS = ("kv_cache_usage", "running", "waiting", "saturated")
LATENCY_KEYS = ("ttft", "itl", "e2e", "queue")


def simulate_level(
    config: EngineConfig,
    rate: float,
    sessions: int,
    load: Load,
    shared: float,
    prefixes: int | None = None,
    session_share: float = 1.0,
    seconds: float = 120.0,
    warmup: float = 30.0,
    seed: int = 0,
    request_overhead: float = 0.0,
    requests: int = 400,
) -> LevelRun:
    """`sessions` closed-loop sessions (think time load.think_seconds, exponential) on a
    fresh engine, for a warmup and then at least `seconds` and long enough for about
    `requests` requests at `rate` (at most MAX_SECONDS) of virtual time; what happened after
    the warmup, per second. Each request's prompt begins with load.common_share of tokens
    common to every session, then `shared` × `session_share` of its session's own prefix
    (sessions share `prefixes` of those, default one each; round-robin routing lowers
    `session_share`). A request still
    waiting for its first token at the end counts with the time it had waited (a lower
    bound). The same seed gives the same sessions and lengths whatever the engine, so a
    change is compared with its baseline on the same requests."""
    run = LevelRun(rate, sessions, seconds)
    if rate <= 0 or sessions <= 0:
        run.rates = dict.fromkeys(COUNTS, 0.0)
        run.means = dict.fromkeys(MEAN_KEYS, 0.0)
        run.samples = {k: np.zeros(0) for k in LATENCY_KEYS}
        return run
    seconds = min(max(seconds, requests / rate), MAX_SECONDS)
    end = warmup + seconds
    engine = Engine(config, seed=seed)
    rng = random.Random(seed * 104729 + sessions)
    tokens_rng = np.random.default_rng(seed)
    # The longest sequence the engine takes (max_model_len, or a cache smaller than that).
    limit = max(2, min(config.max_model_len, engine.capacity_tokens - config.block_size))
    pool: list[list[int]] = [[] for _ in range(max(1, prefixes or sessions))]
    common: list[int] = []
    # The common prefix has one length (its blocks are the same for every request).
    common_tokens = round(load.common_share * load.prompt_tokens_mean) if shared else 0
    mu_prompt = math.log(load.prompt_tokens_mean) - LENGTH_SIGMA**2 / 2
    mu_output = math.log(load.output_tokens_mean) - LENGTH_SIGMA**2 / 2
    think = load.think_seconds
    tracked: list[tuple[Request, float, list[float]]] = []
    due: list[tuple[float, int]] = []  # (when a session sends next, session)
    order = itertools.count()

    def send(session: int) -> None:
        output = max(1, min(round(rng.lognormvariate(mu_output, LENGTH_SIGMA)), limit // 2))
        length = max(1, min(round(rng.lognormvariate(mu_prompt, LENGTH_SIGMA)), limit - output))
        everyone = min(common_tokens, length)
        own = min(int(shared * session_share * length), length - everyone)
        prefix = pool[session % len(pool)]
        for part, size in ((common, everyone), (prefix, own)):
            if len(part) < size:
                part.extend(tokens_rng.integers(VOCABULARY, size=size - len(part)).tolist())
        fresh = tokens_rng.integers(VOCABULARY, size=max(0, length - everyone - own))
        tokens = common[:everyone] + prefix[:own] + fresh.tolist()
        pause = rng.expovariate(1 / think) if think > 0 else 0.0
        times: list[float] = []

        def sink(_count: int, done: bool, at: float) -> None:
            times.append(at)
            if done:
                heapq.heappush(due, (at + pause, session))

        request = engine.add(tokens, output, sink)
        if engine.now >= warmup:
            tracked.append((request, engine.now, times))
        next(order)

    for session in range(sessions):  # sessions start spread over one think time
        heapq.heappush(due, (rng.uniform(0, max(think, 1.0)), session))
    gauges = dict.fromkeys(MEAN_KEYS, 0.0)
    before: dict[str, float] | None = None
    sent_before = 0
    while engine.now < end:
        while due and due[0][0] <= engine.now:
            send(heapq.heappop(due)[1])
        if before is None and engine.now >= warmup:
            before, sent_before = _counts(engine), len(tracked)
        if engine.idle:
            engine.now = min(due[0][0], end) if due else end
            continue
        duration = engine.step()
        if before is not None:
            kv = engine.kv.usage
            gauges["kv_cache_usage"] += kv * duration
            gauges["running"] += len(engine.running) * duration
            gauges["waiting"] += len(engine.waiting) * duration
            if kv >= SATURATED or engine.waiting_for_capacity:
                gauges["saturated"] += duration
    if before is None:
        before = _counts(engine)
    after = _counts(engine)
    span = max(engine.now - warmup, 1e-9)
    run.seconds = span
    run.rates = {k: (after[k] - before[k]) / span for k in COUNTS if k != "requests"}
    run.rates["requests"] = (len(tracked) - sent_before) / span
    run.means = {k: v / span for k, v in gauges.items()}
    run.samples = _samples(tracked, engine.now, request_overhead)
    return run


def _samples(
    tracked: list[tuple[Request, float, list[float]]], now: float, overhead: float
) -> dict[str, np.ndarray]:
    ttft: list[float] = []
    itl: list[float] = []
    e2e: list[float] = []
    queue: list[float] = []
    for request, sent, times in tracked:
        if times:
            ttft.append(times[0] - sent + overhead)
            itl.extend(b - a for a, b in itertools.pairwise(times))
            if request.generated >= request.max_tokens:
                e2e.append(times[-1] - sent + overhead)
        else:
            ttft.append(now - sent + overhead)
        scheduled = request.first_scheduled
        queue.append((scheduled if scheduled is not None else now) - sent)
    return {
        "ttft": np.asarray(ttft),
        "itl": np.asarray(itl),
        "e2e": np.asarray(e2e),
        "queue": np.asarray(queue),
    }


def _counts(engine: Engine) -> dict[str, float]:
    stats = engine.stats
    return {
        "generation_tokens": stats.generation_tokens,
        "prompt_tokens": stats.prompt_tokens,
        "computed_prompt_tokens": stats.prompt_local_compute,
        "preemptions": stats.preemptions,
        "recomputed_prefill_tokens": stats.preempted_prompt_tokens + stats.preempted_output_tokens,
        "prefix_cache_hits": stats.prefix_cache_hits,
        "prefix_cache_queries": stats.prefix_cache_queries,
    }


@dataclass
class Replay:
    """The window replayed: per-replica and fleet numbers (the JSON's baseline/predicted)."""

    change: Change
    replicas: int
    seconds: float
    numbers: dict[str, Any]
    levels: list[LevelRun]


def replay(
    profile: Profile,
    load: Load,
    change: Change | None = None,
    slos: tuple[Slo, ...] | list[Slo] = (),
    levels: int = 6,
    seconds: float = 120.0,
    warmup: float = 30.0,
    seed: int = 0,
    requests: int = 400,
    shared: float | None = None,
) -> Replay:
    """The window's load through the profile's twin after `change` (None: the baseline).

    Fleet-level changes: `growth` k multiplies the sessions; `replicas` N share them (sticky
    routing keeps each session on one replica: each replica sees 1/N of the sessions and
    their prefixes; round-robin spreads each session's requests over all replicas: each
    replica carries 1/N of the load but sees every session's prefix, and a request finds
    its session's prefix there only 1/N of the time). Raises UntrustedProfile for an
    untrusted fit. `shared`: reuse_share's answer, when the caller has it already."""
    profile.require_trusted()
    change = change or Change()
    shape, cost = apply(profile, change)
    config = shape.engine_config(cost)
    replicas = change.replicas
    peak = max((r for _, r in load.buckets), default=0.0)
    if peak <= 0:
        raise WhatIfError("the window has no arrivals to replay")
    if shared is None:
        shared = reuse_share(profile, load, seconds, warmup, seed, requests)
    if not shape.enable_prefix_caching:
        shared = 0.0
    round_robin = change.routing == "round-robin" and replicas > 1
    grid = [peak * k / levels for k in range(levels + 1)]
    runs = []
    for rate in grid:
        total = load.sessions_at(rate) * change.growth  # sessions of the whole traffic
        mine = max(1, round(total / replicas)) if rate > 0 else 0
        runs.append(
            simulate_level(
                config,
                rate * change.growth / replicas,
                mine,
                load,
                shared,
                max(1, round(total)) if round_robin else None,
                1 / replicas if round_robin else 1.0,
                seconds,
                warmup,
                seed,
                cost.request_overhead_seconds,
                requests,
            )
        )
    numbers = aggregate(runs, grid, list(load.buckets), replicas, slos)
    return Replay(change, replicas, load.seconds, numbers, runs)


def reuse_share(
    profile: Profile,
    load: Load,
    seconds: float = 120.0,
    warmup: float = 30.0,
    seed: int = 0,
    requests: int = 400,
) -> float:
    """The share of each prompt taken from its session's prefix for which the calibrated
    engine, as it is, hits its prefix cache as often as the window measured at light load
    (Load.light: where the cache is least pressed, so the hit rate is the traffic's reuse,
    not the cache's size): only whole blocks hit and a session's first request misses, so
    the share is above the hit rate. Two corrections of the ratio. Under heavier load the
    replay's hit rate then falls as the cache fills, as the replica's did."""
    rate, target = load.light
    if not target or not rate or not profile.shape.enable_prefix_caching:
        return 0.0
    config = profile.engine_config()
    sessions = max(1, round(load.sessions_at(rate)))
    shared = max(target - load.common_share, 0.0)
    for _ in range(2):
        run = simulate_level(
            config, rate, sessions, load, shared, None, 1.0, seconds, warmup, seed, 0.0, requests
        )
        queries = run.rates["prefix_cache_queries"]
        achieved = run.rates["prefix_cache_hits"] / queries if queries else 0.0
        if achieved <= 0:
            break
        own = achieved - load.common_share  # what the session prefixes gave
        if own <= 0:
            break
        shared = min(0.99 - load.common_share, shared * (target - load.common_share) / own)
    return shared


def _weights(grid: list[float], rate: float) -> tuple[int, int, float]:
    """The two levels around `rate` and the upper one's weight."""
    step = grid[1] - grid[0]
    position = min(rate / step, len(grid) - 1) if step > 0 else 0.0
    low = min(int(position), len(grid) - 2)
    return low, low + 1, position - low


def aggregate(
    runs: list[LevelRun],
    grid: list[float],
    buckets: list[tuple[float, float]],
    replicas: int,
    slos: tuple[Slo, ...] | list[Slo],
) -> dict[str, Any]:
    """The window's numbers from the level runs, each bucket interpolated between the levels
    around its measured request rate."""
    time_at = np.zeros(len(runs))  # seconds of the window each level stands for
    per_bucket: dict[str, list[float]] = {k: [] for k in MEAN_KEYS}
    totals = dict.fromkeys(COUNTS, 0.0)
    spans = [span for span, _ in buckets]
    for span, rate in buckets:
        low, high, w = _weights(grid, rate)
        time_at[low] += span * (1 - w)
        time_at[high] += span * w
        for key in COUNTS:
            totals[key] += span * _mix(runs[low].rates[key], runs[high].rates[key], w)
        for key in MEAN_KEYS:
            per_bucket[key].append(_mix(runs[low].means[key], runs[high].means[key], w))
    seconds = sum(spans)
    out: dict[str, Any] = {
        "seconds": seconds,
        "replicas": replicas,
        # Fleet totals (every replica together): what the traffic got.
        "requests": replicas * totals["requests"],
        "generation_tokens_per_second": replicas * totals["generation_tokens"] / seconds,
        "prompt_tokens_per_second": replicas * totals["prompt_tokens"] / seconds,
        "generation_tokens": replicas * totals["generation_tokens"],
        "prompt_tokens": replicas * totals["prompt_tokens"],
        "preemptions": replicas * totals["preemptions"],
        "recomputed_prefill_tokens": replicas * totals["recomputed_prefill_tokens"],
        "prefix_cache_hit_rate": (
            totals["prefix_cache_hits"] / totals["prefix_cache_queries"]
            if totals["prefix_cache_queries"]
            else None
        ),
        # Per replica (each alike): occupancy, queue and saturation.
        "kv_cache_occupancy_p95": weighted_quantile(per_bucket["kv_cache_usage"], spans, 0.95),
        "saturated_seconds": float(np.dot(per_bucket["saturated"], spans)),
        "waiting_mean": float(np.dot(per_bucket["waiting"], spans) / seconds),
        "running_mean": float(np.dot(per_bucket["running"], spans) / seconds),
    }
    for key in LATENCY_KEYS:
        values, weights = _mixture(runs, time_at, key)
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            out[f"{key}_{name}_seconds"] = (
                weighted_quantile(values.tolist(), weights.tolist(), q) if len(values) else None
            )
    out["slo_compliance"] = {
        slo.name: _compliance(runs, time_at, slo)
        for slo in slos
        if slo.kind == "latency" and slo.metric and slo.threshold
    }
    return out


def _mix(a: float, b: float, w: float) -> float:
    return a + (b - a) * w


def _mixture(runs: list[LevelRun], time_at: np.ndarray, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Every level's samples, each weighted by the window time its level stands for over the
    virtual time it was measured in."""
    values, weights = [], []
    for run, at in zip(runs, time_at, strict=True):
        samples = run.samples.get(key, np.zeros(0))
        if len(samples) and at > 0:
            values.append(samples)
            weights.append(np.full(len(samples), at / run.seconds))
    if not values:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(values), np.concatenate(weights)


def _compliance(runs: list[LevelRun], time_at: np.ndarray, slo: Slo) -> float | None:
    if slo.metric is None or slo.threshold is None:
        return None
    values, weights = _mixture(runs, time_at, slo.metric)
    if not weights.sum():
        return None
    return float(weights[values <= slo.threshold].sum() / weights.sum())
