"""Replay a replica's stored load through its calibrated twin, in virtual time.

Every stored bucket of the window (15 minutes) is simulated, in order, on one engine whose
state carries from bucket to bucket (simulate_window): the running and waiting requests, the
KV and prefix caches, the sessions. A week step by step would be millions of engine steps,
so each bucket runs a slice of virtual time (SLICE_SECONDS) and its counts are scaled from
the slice to the bucket; docs/explanation/whatif.md ("Replay") measures what the slice
length costs in accuracy.

The load is sessions (closed loop, as agents and chat users are): each session sends a
request, waits for its answer, thinks, and sends the next. At a request rate λ whose
requests took R seconds end to end (the e2e histogram), λ × (R + Z) sessions with a think
time Z send exactly λ per second: the baseline has the measured rate whatever Z is; a change
that makes answers faster or slower moves the rate as real sessions would. A bucket's
requests draw their prompt and output lengths from its stored length histograms (Lengths;
an engine without them: the bucket's mean lengths spread log-normally) and take a share of
their prompt from their session's prefix, sized so that the engine as calibrated hits its
prefix cache as often as the window measured at light load, and lowered in a bucket that
measured fewer hits than that. docs/explanation/whatif.md lists every approximation.
"""

from __future__ import annotations

import bisect
import functools
import gc
import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import numpy as np

from kneepoint.config import Slo
from kneepoint.samples import Histogram
from kneepoint.twin.kvcache import block_hashes
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
    # Every stored bucket, in order, as the replay drives it.
    per_bucket: tuple[BucketLoad, ...] = ()

    @property
    def lengths_from_histograms(self) -> float:
        """The share of the window's requests whose lengths come from stored histograms."""
        total = sum(b.seconds * b.rate for b in self.per_bucket)
        known = sum(
            b.seconds * b.rate
            for b in self.per_bucket
            if b.prompt.from_histogram and b.output.from_histogram
        )
        return known / total if total else 0.0

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
            "buckets": len(self.per_bucket),
            # Requests whose lengths were drawn from the stored length histograms (the rest:
            # the bucket's means, spread log-normally with σ LENGTH_SIGMA).
            "lengths_from_histograms": self.lengths_from_histograms,
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
        per_bucket=bucket_loads(history, float(prompt), float(output)),
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


P = ParamSpec("P")
R = TypeVar("R")


def without_cycle_collection(simulate: Callable[P, R]) -> Callable[P, R]:
    """Run `simulate` with Python's cyclic garbage collector paused (what it frees is freed
    by reference counting as before; a cycle, if any, waits for the next collection after).
    A replay allocates about a million short-lived objects (requests, their block lists,
    token lists), which triggers collections that each walk the process's whole heap: on
    the demo's week they took a fifth of a replay's time (docs/benchmarks.md). The switch is
    the process's: where replays run on several threads at once, the collector is back on
    when the first of them ends (the others then run as before, only slower), and it is
    left off after a replay only where it was off before."""

    @functools.wraps(simulate)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return simulate(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()

    return run


class Prompts:
    """The replay's prompts, each of `length` tokens: the first `everyone` tokens of the prefix
    common to every session, the first `own` of its session's prefix, then fresh ones. The
    prefixes are drawn from `tokens_rng` as far as they are first needed and kept (they grow
    in place), so the same seed gives the same prompts whatever the engine. The chained
    block hashes of each (session, `everyone`) head are kept as well, so a prompt's hashes
    are computed for its fresh blocks only (Engine.add's `known_hashes`): an agent's turn
    resends its session's head, thousands of tokens, each time."""

    def __init__(self, tokens_rng: np.random.Generator, block_size: int) -> None:
        self.tokens_rng = tokens_rng
        self.block_size = block_size
        self.common: list[int] = []
        self.prefixes: dict[int, list[int]] = {}
        self.heads: dict[tuple[int, int], list[int]] = {}

    def compose(
        self, length: int, everyone: int, session: int, own: int
    ) -> tuple[list[int], list[int]]:
        """(the prompt's tokens, the hashes of its head's full blocks)."""
        common, prefix = self.common, self.prefixes.setdefault(session, [])
        for part, size in ((common, everyone), (prefix, own)):
            if len(part) < size:
                part.extend(self.tokens_rng.integers(VOCABULARY, size=size - len(part)).tolist())
        fresh = self.tokens_rng.integers(VOCABULARY, size=max(0, length - everyone - own))
        head = common[:everyone] + prefix[:own]
        full = len(head) // self.block_size
        known = self.heads.get((session, everyone), [])
        if len(known) < full:
            known = self.heads[session, everyone] = block_hashes(head, self.block_size, known)
        return head + fresh.tolist(), known[:full]


@without_cycle_collection
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
    engine = Engine(config, seed=seed, counters_only=True)
    rng = random.Random(seed * 104729 + sessions)
    tokens_rng = np.random.default_rng(seed)
    # The longest sequence the engine takes (max_model_len, or a cache smaller than that).
    limit = max(2, min(config.max_model_len, engine.capacity_tokens - config.block_size))
    pool = max(1, prefixes or sessions)  # session prefixes
    prompts = Prompts(tokens_rng, config.block_size)
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
        tokens, known = prompts.compose(length, everyone, session % pool, own)
        pause = rng.expovariate(1 / think) if think > 0 else 0.0
        times: list[float] = []

        def sink(_count: int, done: bool, at: float) -> None:
            times.append(at)
            if done:
                heapq.heappush(due, (at + pause, session))

        request = engine.add(tokens, output, sink, known_hashes=known)
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


@dataclass(frozen=True)
class Lengths:
    """Token lengths drawn from one stored histogram: a bucket of the histogram by its count,
    then uniformly within its bounds (the +Inf bucket up to twice its lower bound: vLLM's
    bounds go 1, 2, 5, 10, …), every draw then scaled by one factor so that the draws' mean
    is the histogram's (its sum over its count); or, without a histogram, log-normal around
    `mean` with LENGTH_SIGMA."""

    mean: float
    lows: tuple[float, ...] = ()
    highs: tuple[float, ...] = ()
    cumulative: tuple[float, ...] = ()  # normalised, ends at 1
    scale: float = 1.0

    @classmethod
    def of(cls, histogram: Histogram | None, mean: float) -> Lengths:
        if histogram is None or histogram.count <= 0:
            return cls(mean)
        lows, highs, weights = [], [], []
        lower, below = 0.0, 0.0
        for bound, cumulative in zip(histogram.bounds, histogram.counts, strict=True):
            upper = bound if math.isfinite(bound) else max(2 * lower, lower + 1)
            if cumulative > below:
                lows.append(lower)
                highs.append(upper)
                weights.append(cumulative - below)
            lower, below = upper, max(below, cumulative)
        if not weights:
            return cls(mean)
        total = sum(weights)
        expected = sum(w * (a + b) / 2 for w, a, b in zip(weights, lows, highs, strict=True))
        measured = histogram.total / histogram.count if histogram.total > 0 else expected / total
        return cls(
            measured,
            tuple(lows),
            tuple(highs),
            tuple(itertools.accumulate(w / total for w in weights)),
            measured / (expected / total) if expected > 0 else 1.0,
        )

    @property
    def from_histogram(self) -> bool:
        return bool(self.cumulative)

    def draw(self, rng: random.Random) -> float:
        if not self.cumulative:
            return rng.lognormvariate(math.log(self.mean) - LENGTH_SIGMA**2 / 2, LENGTH_SIGMA)
        index = min(bisect.bisect_left(self.cumulative, rng.random()), len(self.lows) - 1)
        return rng.uniform(self.lows[index], self.highs[index]) * self.scale


@dataclass(frozen=True)
class BucketLoad:
    """One stored bucket as the replay drives it."""

    seconds: float
    rate: float  # requests per second, measured
    prompt: Lengths
    output: Lengths
    hit_rate: float | None  # measured prefix-cache hit rate (None: no query)


def bucket_loads(
    history: History, prompt_mean: float, output_mean: float
) -> tuple[BucketLoad, ...]:
    """Each stored bucket's load: its rate, its length histograms (else its mean lengths, else
    the window's, spread log-normally), its hit rate."""
    return tuple(
        BucketLoad(
            b.seconds,
            b.requests_per_second,
            Lengths.of(b.prompt_lengths, b.prompt_tokens_mean or prompt_mean),
            Lengths.of(b.output_lengths, b.output_tokens_mean or output_mean),
            b.hit_rate,
        )
        for b in history.buckets
    )


@dataclass
class BucketRun:
    """What the replay did in one bucket's slice: counter increases and gauge means over the
    slice (scale: the bucket's seconds over the slice's)."""

    seconds: float  # the stored bucket's
    slice_seconds: float  # the virtual time simulated for it
    counts: dict[str, float] = field(default_factory=dict)
    means: dict[str, float] = field(default_factory=dict)

    @property
    def scale(self) -> float:
        return self.seconds / self.slice_seconds if self.slice_seconds > 0 else 0.0


@dataclass
class WindowRun:
    """The window replayed bucket by bucket: per bucket, and every request's latencies with
    the weight its bucket gives it (bucket seconds over slice seconds)."""

    buckets: list[BucketRun]
    samples: dict[str, np.ndarray]
    weights: dict[str, np.ndarray]
    sent: int = 0  # requests simulated
    steps: int = 0  # engine calls made


SLICE_SECONDS = 20.0  # virtual seconds simulated per stored bucket (docs: "Replay")
WARMUP_SECONDS = 30.0  # before the first bucket, at its load, not counted
# A bucket that measured less than this share of the window's prefix-cache hit rate had a
# cold cache (a deploy, new prompts): its session prefixes shrink in proportion. Above it the
# engine's own cache pressure is left to explain a lower hit rate.
COLD_SHARE = 0.5


def advance(engine: Engine, until: float) -> float:
    """Engine.advance(until) (docs/explanation/whatif.md: S's fast-forward) where the engine
    has it; else one step (or, idle, straight to `until`): the caller loops either way."""
    fast = getattr(engine, "advance", None)
    if fast is not None:
        return float(fast(until))
    if engine.idle:
        engine.now = max(engine.now, until)
    else:
        engine.step()
    return engine.now


@without_cycle_collection
def simulate_window(
    config: EngineConfig,
    load: Load,
    shared: float,
    growth: float = 1.0,
    replicas: int = 1,
    round_robin: bool = False,
    slice_seconds: float = SLICE_SECONDS,
    warmup: float = WARMUP_SECONDS,
    seed: int = 0,
    request_overhead: float = 0.0,
) -> WindowRun:
    """Every stored bucket of `load`, in order, on one engine whose state (running and waiting
    requests, KV cache, prefix cache, sessions) carries from one bucket to the next. Bucket k
    runs `slice_seconds` of virtual time (its whole length if shorter) with
    load.sessions_at(rate_k) × growth / replicas closed-loop sessions (sessions start or retire
    at the bucket's edge), prompt and output lengths drawn from its histograms, and a session
    prefix share of `shared` × (its hit rate / the light-load hit rate, at most 1); its counts
    scale by its seconds over the slice's. A request's latencies count for the bucket it was
    sent in; one unanswered at the end counts with the time it had waited (a lower bound)."""
    engine = Engine(config, seed=seed, counters_only=True)
    rng = random.Random(seed * 104729 + 1)
    tokens_rng = np.random.default_rng(seed)
    limit = max(2, min(config.max_model_len, engine.capacity_tokens - config.block_size))
    think = load.think_seconds
    reference = load.hit_rate * COLD_SHARE
    prompts = Prompts(tokens_rng, config.block_size)
    common_tokens = round(load.common_share * load.prompt_tokens_mean) if shared else 0
    due: list[tuple[float, int]] = []
    wanted = 0  # sessions the current bucket keeps
    active: set[int] = set()  # sessions in the loop (waiting for an answer or thinking)
    # request, when sent, (when, tokens) per sink call, weight
    tracked: list[tuple[Request, float, list[tuple[float, int]], float]] = []
    current = load.per_bucket[0]  # the bucket being replayed
    share = shared  # its session-prefix share
    weight = 0.0  # its seconds over its slice's (0 in the warmup: not counted)
    pool = 1  # session prefixes

    def share_of(bucket: BucketLoad) -> float:
        if not shared or bucket.hit_rate is None or not reference:
            return shared
        return shared * min(1.0, bucket.hit_rate / reference)

    def send(session: int) -> None:
        output = max(1, min(round(current.output.draw(rng)), limit // 2))
        length = max(1, min(round(current.prompt.draw(rng)), limit - output))
        everyone = min(common_tokens, length)
        own = min(int(share * length), length - everyone)
        tokens, known = prompts.compose(length, everyone, session % pool, own)
        pause = rng.expovariate(1 / think) if think > 0 else 0.0
        times: list[tuple[float, int]] = []

        def sink(count: int, done: bool, at: float) -> None:
            times.append((at, count))
            if done:
                heapq.heappush(due, (at + pause, session))

        request = engine.add(tokens, output, sink, known_hashes=known)
        if weight:
            tracked.append((request, engine.now, times, weight))

    def run_until(end: float, gauges: dict[str, float] | None) -> int:
        calls = 0
        while engine.now < end:
            while due and due[0][0] <= engine.now:
                session = heapq.heappop(due)[1]
                if session >= wanted:  # the load fell: this session stops here
                    active.discard(session)
                    continue
                send(session)
            until = min(due[0][0], end) if due else end
            before = engine.now
            advance(engine, until)
            calls += 1
            if gauges is not None and engine.now > before:
                span = engine.now - before
                kv = engine.kv.usage
                gauges["kv_cache_usage"] += kv * span
                gauges["running"] += len(engine.running) * span
                gauges["waiting"] += len(engine.waiting) * span
                if kv >= SATURATED or engine.waiting_for_capacity:
                    gauges["saturated"] += span
        return calls

    def set_sessions(bucket: BucketLoad) -> None:
        nonlocal wanted, pool
        total = load.sessions_at(bucket.rate) * growth
        wanted = max(1, round(total / replicas)) if bucket.rate > 0 else 0
        # Round-robin: every session's prefix is here, each request on 1/N of the replicas.
        pool = max(pool, round(total)) if round_robin else max(pool, wanted)
        for session in range(wanted):
            if session not in active:
                active.add(session)
                heapq.heappush(due, (engine.now + rng.uniform(0, max(think, 1.0)), session))

    session_share = 1 / replicas if round_robin else 1.0
    runs: list[BucketRun] = []
    steps = 0
    share = share_of(current) * session_share
    set_sessions(current)
    steps += run_until(warmup, None)
    for bucket in load.per_bucket:
        current = bucket
        share = share_of(bucket) * session_share
        span = min(slice_seconds, bucket.seconds)
        weight = bucket.seconds / span if span > 0 else 0.0
        set_sessions(bucket)
        before, start = _counts(engine), engine.now
        gauges = dict.fromkeys(MEAN_KEYS, 0.0)
        steps += run_until(start + span, gauges)
        after = _counts(engine)
        elapsed = max(engine.now - start, 1e-9)
        run = BucketRun(bucket.seconds, elapsed)
        run.counts = {k: after[k] - before[k] for k in after}
        run.means = {k: v / elapsed for k, v in gauges.items()}
        runs.append(run)
    samples, weights = _weighted_samples(tracked, engine.now, request_overhead)
    return WindowRun(runs, samples, weights, len(tracked), steps)


def _weighted_samples(
    tracked: list[tuple[Request, float, list[tuple[float, int]], float]],
    now: float,
    overhead: float,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    values: dict[str, list[float]] = {k: [] for k in LATENCY_KEYS}
    weights: dict[str, list[float]] = {k: [] for k in LATENCY_KEYS}

    def add(key: str, value: float, weight: float) -> None:
        values[key].append(value)
        weights[key].append(weight)

    for request, sent, times, weight in tracked:
        if times:
            add("ttft", times[0][0] - sent + overhead, weight)
            for (a, _), (b, count) in itertools.pairwise(times):
                # A fast-forwarded stretch reports its tokens at its end: `count` gaps of
                # its mean inter-token time.
                if count > 0:
                    add("itl", (b - a) / count, weight * count)
            if request.generated >= request.max_tokens:
                add("e2e", times[-1][0] - sent + overhead, weight)
        else:
            add("ttft", now - sent + overhead, weight)
        scheduled = request.first_scheduled
        add("queue", (scheduled if scheduled is not None else now) - sent, weight)
    return (
        {k: np.asarray(v) for k, v in values.items()},
        {k: np.asarray(w) for k, w in weights.items()},
    )


@dataclass
class Replay:
    """The window replayed: per-replica and fleet numbers (the JSON's baseline/predicted)."""

    change: Change
    replicas: int
    seconds: float
    numbers: dict[str, Any]
    window: WindowRun
    shared: float = 0.0  # the session prefix share it ran with (reuse_share's)


def replay(
    profile: Profile,
    load: Load,
    change: Change | None = None,
    slos: tuple[Slo, ...] | list[Slo] = (),
    slice_seconds: float = SLICE_SECONDS,
    seed: int = 0,
    shared: float | None = None,
    requests: int = 400,
) -> Replay:
    """The window's load through the profile's twin after `change` (None: the baseline),
    every stored bucket in order (simulate_window).

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
    if not load.per_bucket or max(b.rate for b in load.per_bucket) <= 0:
        raise WhatIfError("the window has no arrivals to replay")
    if shared is None:
        shared = reuse_share(profile, load, seed=seed, requests=requests)
    if not shape.enable_prefix_caching:
        shared = 0.0
    round_robin = change.routing == "round-robin" and replicas > 1
    window = simulate_window(
        config,
        load,
        shared,
        change.growth,
        replicas,
        round_robin,
        slice_seconds,
        seed=seed,
        request_overhead=cost.request_overhead_seconds,
    )
    numbers = aggregate(window, replicas, slos)
    return Replay(change, replicas, load.seconds, numbers, window, shared)


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


def aggregate(
    window: WindowRun, replicas: int, slos: tuple[Slo, ...] | list[Slo]
) -> dict[str, Any]:
    """The window's numbers from its buckets: each bucket's counts scaled from its slice to
    its length, its gauge means weighted by its length, latency samples by their bucket's
    weight."""
    totals = dict.fromkeys(COUNTS, 0.0)
    per_bucket: dict[str, list[float]] = {k: [] for k in MEAN_KEYS}
    spans = [run.seconds for run in window.buckets]
    for run in window.buckets:
        for key in COUNTS:
            if key != "requests":
                totals[key] += run.counts.get(key, 0.0) * run.scale
        for key in MEAN_KEYS:
            per_bucket[key].append(run.means.get(key, 0.0))
    totals["requests"] = float(window.weights["ttft"].sum()) if len(window.weights["ttft"]) else 0.0
    seconds = sum(spans)
    saturated = [m * s for m, s in zip(per_bucket["saturated"], spans, strict=True)]
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
        "kv_cache_occupancy_p95": weighted_quantile(
            _smoothed(per_bucket["kv_cache_usage"], [r.slice_seconds for r in window.buckets]),
            spans,
            0.95,
        ),
        "saturated_seconds": float(sum(saturated)),
        "waiting_mean": float(np.dot(per_bucket["waiting"], spans) / seconds),
        "running_mean": float(np.dot(per_bucket["running"], spans) / seconds),
    }
    for key in LATENCY_KEYS:
        values, weights = window.samples[key], window.weights[key]
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            out[f"{key}_{name}_seconds"] = (
                weighted_quantile(values, weights, q) if len(values) else None
            )
    out["slo_compliance"] = {
        slo.name: _compliance(window, slo)
        for slo in slos
        if slo.kind == "latency" and slo.metric and slo.threshold
    }
    return out


def _smoothed(means: list[float], spans: list[float]) -> list[float]:
    """Each bucket's mean over its slice and its neighbours' (the engine runs the slices one
    after another, so three of them are one stretch of its virtual time): a slice's mean
    is noisier than a 15-minute bucket's, and a quantile over noisy means reads high."""
    out = []
    for index in range(len(means)):
        near = range(max(0, index - 1), min(len(means), index + 2))
        weight = sum(spans[i] for i in near)
        out.append(sum(means[i] * spans[i] for i in near) / weight if weight else means[index])
    return out


def _compliance(window: WindowRun, slo: Slo) -> float | None:
    if slo.metric is None or slo.threshold is None or slo.metric not in window.samples:
        return None
    values, weights = window.samples[slo.metric], window.weights[slo.metric]
    if not weights.sum():
        return None
    return float(weights[values <= slo.threshold].sum() / weights.sum())
