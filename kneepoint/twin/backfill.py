"""A week of history for the demo, through the same engine model, in seconds.

Simulating a week step by step would take hours, so each replica's engine is run in virtual
time at a few levels of agent load until it is steady; what it does per second at each level
(token and request rates, histogram fills, occupancy, queues, GPU activity) is then laid
along a daily load shape, scrape by scrape, and written to the store as the collector would.

An SGLang replica is measured through its twin's SGLang exposition, read by kneepoint's own
SGLang normalizer: its history has exactly the numbers, histogram buckets and unavailable
quantities its live scrapes have.
"""

from __future__ import annotations

import copy
import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from collectors.engines.sglang import parse_sglang
from kneepoint.config import Retention
from kneepoint.samples import CacheConfig, GpuSample, Histogram, ReplicaSample
from kneepoint.store.rollup import rollup
from kneepoint.store.writer import ensure_targets, record_gpu_history, record_replica_history
from kneepoint.twin.agents import daily_load, session
from kneepoint.twin.dcgm import GpuState
from kneepoint.twin.fleet import Fleet
from kneepoint.twin.openai_api import chat_prompt, tokenize
from kneepoint.twin.sglang import SglangMetrics
from kneepoint.twin.sglang import render as render_sglang
from kneepoint.twin.simulated_engine import Engine, EngineConfig, Rejected
from kneepoint.twin.stats import Stats

LEVELS = (1, 3, 8, 20, 48)  # concurrent agent sessions measured per replica
# Each level's virtual seconds. A day is read by interpolating between levels, so counts that
# happen in bursts near the knee (preemptions) are estimates: at 90 s one run at 20 sessions
# saw 3× the preemption rate of ten-minute runs, and a straight line from 8 to 20 sessions
# puts preemptions where the curve has almost none. The what-if's replay tests, whose truth
# this is, measure more levels for longer (tests/whatif/conftest.py); the demo keeps these.
LEVEL_SECONDS = 90.0
HISTOGRAMS = {
    "ttft": "time_to_first_token_seconds",
    "itl": "inter_token_latency_seconds",
    "e2e": "e2e_request_latency_seconds",
    "queue": "request_queue_time_seconds",
    # samples.LOAD_HISTOGRAMS: the lengths the what-if replays per bucket
    "prompt_length": "request_prompt_tokens",
    "output_length": "request_generation_tokens",
}


@dataclass
class Level:
    """What one replica does per second when `sessions` agents work on it."""

    sessions: float
    rates: dict[str, float] = field(default_factory=dict)  # canonical counter -> per second
    gauges: dict[str, float] = field(default_factory=dict)  # time-weighted means
    buckets: dict[str, list[float]] = field(default_factory=dict)  # histogram -> per second
    sums: dict[str, float] = field(default_factory=dict)
    per_position: list[float] = field(default_factory=list)
    gpu: dict[str, float] = field(default_factory=dict)  # busy, compute, memory fractions
    bounds: dict[str, tuple[float, ...]] = field(default_factory=dict)  # finite, if not vLLM's


def counters(stats: Stats, offload: bool = False) -> dict[str, float]:
    """The canonical counters (kneepoint.samples) of an engine's cumulative stats; the
    offload tier's bytes only with `offload` (a replica without one does not expose them)."""
    histos = stats.histograms
    computed = histos["request_prefill_kv_computed_tokens"]
    values = {
        "preemptions": stats.preemptions,
        "prompt_tokens": stats.prompt_tokens,
        "generation_tokens": stats.generation_tokens,
        "prefix_cache_queries": stats.prefix_cache_queries,
        "prefix_cache_hits": stats.prefix_cache_hits,
        "prompt_tokens_local_compute": stats.prompt_local_compute,
        "prompt_tokens_local_cache_hit": stats.prompt_cache_hit,
        "prompt_tokens_external": stats.prompt_host_hit,
        "prompt_tokens_cached_device": stats.prompt_cache_hit,
        "prompt_tokens_cached_host": stats.prompt_host_hit,
        "prompt_tokens_cached_p2p": 0,
        "prompt_tokens_cached_disk": 0,
        "prompt_tokens_cached_external": 0,
        "external_prefix_cache_queries": stats.external_prefix_cache_queries,
        "external_prefix_cache_hits": stats.external_prefix_cache_hits,
        "admission_rejections": sum(stats.admission_rejections.values()),
        "estimated_flops": stats.estimated_flops,
        "estimated_read_bytes": stats.estimated_read_bytes,
        "estimated_write_bytes": stats.estimated_write_bytes,
        "prefill_kv_computed_tokens_sum": computed.total,
        "prefill_kv_computed_tokens_count": sum(computed.counts),
        "mm_cache_queries": 0,
        "mm_cache_hits": 0,
        "engine_steps": sum(histos["iteration_tokens_total"].counts),
        "request_prompt_tokens_sum": histos["request_prompt_tokens"].total,
        "request_prompt_tokens_count": sum(histos["request_prompt_tokens"].counts),
        "request_generation_tokens_sum": histos["request_generation_tokens"].total,
        "request_generation_tokens_count": sum(histos["request_generation_tokens"].counts),
    }
    if offload:
        values |= {
            "kv_offload_load_bytes": stats.kv_offload_load_bytes,
            "kv_offload_store_bytes": stats.kv_offload_store_bytes,
        }
    values |= {f"requests_finished_{reason}": n for reason, n in stats.finished.items()}
    if stats.num_speculative_tokens:
        values |= {
            "spec_decode_drafts": stats.spec_drafts,
            "spec_decode_draft_tokens": stats.spec_draft_tokens,
            "spec_decode_accepted_tokens": stats.spec_accepted,
        }
    return {name: float(value) for name, value in values.items()}


def measure(
    config: EngineConfig,
    sessions: int,
    seconds: float = LEVEL_SECONDS,
    warmup: float = 30.0,
    seed: int = 0,
    sglang_version: str | None = None,
) -> Level:
    """Run `sessions` closed-loop agents on a fresh engine in virtual time; return per second.

    With `sglang_version` the engine is an SGLang replica's: its counters and histograms are
    what kneepoint's SGLang normalizer reads from its exposition."""
    engine = Engine(config, seed=seed)
    metrics = SglangMetrics(engine, sglang_version) if sglang_version else None
    rng = random.Random(seed)
    due: list[tuple[float, int]] = []  # (time the next step is sent, session number)
    scripts = {}
    gauges = {
        "kv_cache_usage": 0.0,
        "requests_running": 0.0,
        "requests_waiting": 0.0,
        "requests_waiting_capacity": 0.0,
    }
    if engine.host is not None:
        gauges["kv_offload_usage"] = 0.0

    def start(number: int, at: float) -> None:
        scripts[number] = session(random.Random(rng.random()), 1, number)
        heapq.heappush(due, (at, number))

    def send(number: int) -> None:
        step = next(scripts[number], None)
        if step is None:
            start(number + 10_000, engine.now)  # this agent's task is done: the next begins
            return

        def sink(_count: int, done: bool, at: float) -> None:
            if done:
                heapq.heappush(due, (at + step.pause_after, number))

        try:
            request = engine.add(tokenize(chat_prompt(step.messages)), step.max_tokens, sink)
        except Rejected:  # shed (HTTP 503): the agent goes on after its pause, as live
            heapq.heappush(due, (engine.now + step.pause_after, number))
            return
        if metrics is not None:  # agents call without streaming, as the live traffic does
            request.sink = metrics.track(request, sink, stream=False)

    for number in range(sessions):
        start(number, rng.uniform(0, 5))
    before: Stats | None = None
    measured_from = warmup
    scraped: ReplicaSample | None = None
    while engine.now < warmup + seconds:
        while due and due[0][0] <= engine.now:
            send(heapq.heappop(due)[1])
        if engine.idle:
            engine.now = due[0][0] if due else engine.now + 1.0
            continue
        if before is None and engine.now >= warmup:
            before = copy.deepcopy(engine.stats)
            scraped = _scrape(metrics) if metrics else None
            measured_from = engine.now
        duration = engine.step()
        if before is not None:
            gauges["kv_cache_usage"] += engine.kv.usage * duration
            gauges["requests_running"] += len(engine.running) * duration
            gauges["requests_waiting"] += len(engine.waiting) * duration
            gauges["requests_waiting_capacity"] += engine.waiting_for_capacity * duration
            if engine.host is not None:
                gauges["kv_offload_usage"] += engine.host.usage * duration
    assert before is not None
    # Time-weighted means over the time actually stepped through: the last step may end
    # past the level's seconds, and a mean over `seconds` would then exceed a full gauge.
    elapsed = engine.now - measured_from
    if elapsed > 0:
        gauges = {name: total * seconds / elapsed for name, total in gauges.items()}
    offload = engine.host is not None
    level = _per_second(sessions, before, engine.stats, gauges, seconds, offload)
    if metrics is None or scraped is None:
        return level
    return _sglang_level(level, scraped, _scrape(metrics), before, engine.stats, seconds)


def _scrape(metrics: SglangMetrics) -> ReplicaSample:
    return parse_sglang(render_sglang(metrics, "twin").decode())


def _sglang_level(
    level: Level,
    before: ReplicaSample,
    after: ReplicaSample,
    old: Stats,
    new: Stats,
    seconds: float,
) -> Level:
    """The level as an SGLang scrape tells it: its counters, its histograms' buckets, its
    own hit-rate and speculative-decoding gauges (the engine's time-weighted queues and
    occupancy kept)."""
    rates = {
        name: (value - (before.counters.get(name) or 0.0)) / seconds
        for name, value in after.counters.items()
        if value is not None
    }
    gauges = {k: v for k, v in level.gauges.items() if k != "requests_waiting_capacity"}
    queries = new.prefix_cache_queries - old.prefix_cache_queries
    hits = new.prefix_cache_hits - old.prefix_cache_hits
    gauges["prefix_cache_hit_rate_gauge"] = hits / queries if queries else 0.0
    drafts = new.spec_drafts - old.spec_drafts
    if drafts:
        accepted = new.spec_accepted - old.spec_accepted
        gauges["spec_decode_acceptance_length_gauge"] = (accepted + drafts) / drafts
        gauges["spec_decode_acceptance_rate_gauge"] = accepted / (
            new.spec_draft_tokens - old.spec_draft_tokens
        )
    out = Level(level.sessions, rates, gauges, gpu=level.gpu)
    for name, histogram in after.histograms.items():
        start = before.histograms.get(name)
        counts = _per_bucket(histogram.counts)
        first = _per_bucket(start.counts) if start else [0.0] * len(counts)
        out.buckets[name] = [(b - a) / seconds for a, b in zip(first, counts, strict=True)]
        out.sums[name] = (histogram.total - (start.total if start else 0.0)) / seconds
        out.bounds[name] = tuple(b for b in histogram.bounds if math.isfinite(b))
    return out


def _per_bucket(cumulative: tuple[float, ...]) -> list[float]:
    return [b - a for a, b in zip((0.0, *cumulative[:-1]), cumulative, strict=True)]


def _per_second(
    sessions: float,
    before: Stats,
    after: Stats,
    gauges: dict[str, float],
    seconds: float,
    offload: bool = False,
) -> Level:
    start, end = counters(before, offload), counters(after, offload)
    level = Level(sessions)
    level.rates = {name: (end[name] - start[name]) / seconds for name in end}
    level.gauges = {name: total / seconds for name, total in gauges.items()}
    for field_name, histogram in HISTOGRAMS.items():
        old, new = before.histograms[histogram], after.histograms[histogram]
        level.buckets[field_name] = [
            (b - a) / seconds for a, b in zip(old.counts, new.counts, strict=True)
        ]
        level.sums[field_name] = (new.total - old.total) / seconds
    level.per_position = [
        (b - a) / seconds
        for a, b in zip(
            before.spec_accepted_per_position, after.spec_accepted_per_position, strict=True
        )
    ]
    level.gpu = {
        "busy": (after.busy_seconds - before.busy_seconds) / seconds,
        "compute": (after.compute_seconds - before.compute_seconds) / seconds,
        "memory": (after.memory_seconds - before.memory_seconds) / seconds,
    }
    return level


def profile(
    config: EngineConfig,
    seed: int = 0,
    sglang_version: str | None = None,
    levels: tuple[int, ...] = LEVELS,
    seconds: float = LEVEL_SECONDS,
) -> list[Level]:
    """The replica's levels from idle to overload, sorted by load: `levels` sessions, each
    measured for `seconds` after a warm-up."""
    idle = Level(0.0)
    measured = [
        measure(config, sessions, seconds, seed=seed, sglang_version=sglang_version)
        for sessions in levels
    ]
    _align(measured)
    idle.rates = dict.fromkeys(measured[0].rates, 0.0)
    idle.gauges = dict.fromkeys(measured[0].gauges, 0.0)
    idle.buckets = {name: [0.0] * len(b) for name, b in measured[0].buckets.items()}
    idle.sums = dict.fromkeys(measured[0].sums, 0.0)
    idle.per_position = [0.0] * len(measured[0].per_position)
    idle.gpu = dict.fromkeys(measured[0].gpu, 0.0)
    idle.bounds = measured[0].bounds
    return [idle, *measured]


def _align(levels: list[Level]) -> None:
    """Give every level the counters and histograms any has (an SGLang series appears at its
    first observation: a light load may never retract a request)."""
    for level in levels:
        for other in levels:
            for name in other.rates:
                level.rates.setdefault(name, 0.0)
            for name, per_bucket in other.buckets.items():
                level.buckets.setdefault(name, [0.0] * len(per_bucket))
                level.sums.setdefault(name, 0.0)
            for name, bounds in other.bounds.items():
                level.bounds.setdefault(name, bounds)


def at_load(levels: list[Level], sessions: float) -> Level:
    """Linear interpolation between measured levels (held at the last beyond it)."""
    sessions = max(0.0, min(sessions, levels[-1].sessions))
    upper = next(i for i, level in enumerate(levels) if level.sessions >= sessions)
    if upper == 0:
        return levels[0]
    low, high = levels[upper - 1], levels[upper]
    w = (sessions - low.sessions) / (high.sessions - low.sessions)

    def mix(a: float, b: float) -> float:
        return a + (b - a) * w

    return Level(
        sessions,
        {k: mix(low.rates[k], high.rates[k]) for k in high.rates},
        {k: mix(low.gauges[k], high.gauges[k]) for k in high.gauges},
        {
            k: [mix(a, b) for a, b in zip(low.buckets[k], high.buckets[k], strict=True)]
            for k in high.buckets
        },
        {k: mix(low.sums[k], high.sums[k]) for k in high.sums},
        [mix(a, b) for a, b in zip(low.per_position, high.per_position, strict=True)],
        {k: mix(low.gpu[k], high.gpu[k]) for k in high.gpu},
        high.bounds,
    )


@dataclass
class History:
    """Cumulative counters of one replica and its GPU, advanced scrape by scrape."""

    config: EngineConfig
    served_name: str
    levels: list[Level]
    gpu: GpuState
    totals: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, list[float]] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)
    per_position: list[float] = field(default_factory=list)
    # An SGLang replica's scrape shape (engine, generation, cache, unavailable), else None.
    template: ReplicaSample | None = None
    _offload_usage: float = 0.0

    def advance(
        self, sessions: float, seconds: float, cold_cache: bool = False, sleep_level: int = 0
    ) -> tuple[ReplicaSample, GpuSample]:
        """One scrape `seconds` after the last at `sessions` agents; with `sleep_level` the
        engine sleeps: no work, its counters frozen, its GPU idle and nearly empty."""
        level = at_load(self.levels, 0.0 if sleep_level else sessions)
        rates = dict(level.rates)
        if cold_cache:  # a prompt deploy: every prefix misses, all of it is computed
            if "prompt_tokens_local_cache_hit" in rates:
                rates["prompt_tokens_local_compute"] += rates["prompt_tokens_local_cache_hit"]
                rates["prompt_tokens_local_cache_hit"] = 0.0
            if "prefix_cache_hits" in rates:
                rates["prefix_cache_hits"] = 0.0
            if "prefix_cache_hit_rate_gauge" in level.gauges:
                level.gauges = {**level.gauges, "prefix_cache_hit_rate_gauge": 0.0}
        for name, rate in rates.items():
            self.totals[name] = self.totals.get(name, 0.0) + rate * seconds
        for name, per_bucket in level.buckets.items():
            kept = self.buckets.setdefault(name, [0.0] * len(per_bucket))
            for index, rate in enumerate(per_bucket):
                kept[index] += rate * seconds
            self.sums[name] = self.sums.get(name, 0.0) + level.sums[name] * seconds
        if not self.per_position:
            self.per_position = [0.0] * len(level.per_position)
        for index, rate in enumerate(level.per_position):
            self.per_position[index] += rate * seconds
        replica = self._replica(level) if self.template is None else self._sglang(level)
        if self.template is None:  # vLLM's sleep state (SGLang has none)
            replica.gauges["sleep_level"] = float(sleep_level)
            if "kv_offload_usage" in replica.gauges and sleep_level:
                # The host tier keeps what it holds while the GPU sleeps.
                replica.gauges["kv_offload_usage"] = self._offload_usage
            self._offload_usage = replica.gauges.get("kv_offload_usage") or 0.0
        busy, compute, memory = (level.gpu[k] for k in ("busy", "compute", "memory"))
        self.gpu.busy, self.gpu.tensor = min(1.0, busy), min(1.0, 0.85 * compute)
        self.gpu.dram = min(1.0, 0.9 * memory)
        self.gpu.asleep = bool(sleep_level)
        self.gpu.sample(seconds)
        return replica, self._gpu()

    def _replica(self, level: Level) -> ReplicaSample:
        config = self.config
        counts: dict[str, float | None] = {
            name: float(math.floor(value)) for name, value in self.totals.items()
        }
        histograms = {}
        for name, per_bucket in self.buckets.items():
            bounds = (*(level.bounds.get(name) or self._bounds(name)), math.inf)
            running, cumulative = 0.0, []
            for value in per_bucket:
                running += value
                cumulative.append(float(math.floor(running)))
            histograms[name] = Histogram(bounds, tuple(cumulative), self.sums[name])
        gauges: dict[str, float | None] = {
            k: round(v, 4) if k in ("kv_cache_usage", "kv_offload_usage") else float(round(v))
            for k, v in level.gauges.items()
        }
        gauges["kv_cache_usage_mean"] = gauges["kv_cache_usage"]
        return ReplicaSample(
            generation="v1",
            engines=1,
            model_names=[self.served_name],
            gauges=gauges,
            counters=counts,
            histograms=histograms,
            accepted_per_position=[float(math.floor(v)) for v in self.per_position] or None,
            cache=CacheConfig(
                config.block_size,
                config.num_gpu_blocks,
                "fp8" if config.fp8_kv_cache else "auto",
                config.enable_prefix_caching,
                config.gpu_memory_utilization,
                config.num_gpu_blocks * config.block_size,
            ),
        )

    def _bounds(self, name: str) -> tuple[float, ...]:
        return Stats(self.config.max_model_len).histograms[HISTOGRAMS[name]].bounds

    def _sglang(self, level: Level) -> ReplicaSample:
        """The scrape an SGLang replica's normalizer gives at this level."""
        template = self.template
        assert template is not None
        sample = self._replica(level)
        gauges: dict[str, float | None] = dict.fromkeys(template.gauges)
        for name, value in level.gauges.items():
            if name in ("kv_cache_usage", "requests_running", "requests_waiting"):
                gauges[name] = sample.gauges[name]
            else:
                gauges[name] = round(value, 4)
        gauges["kv_cache_usage_mean"] = gauges["kv_cache_usage"]
        return ReplicaSample(
            generation=template.generation,
            engines=template.engines,
            model_names=[self.served_name],
            gauges=gauges,
            counters=sample.counters,
            histograms=sample.histograms,
            cache=template.cache,
            engine=template.engine,
            unavailable=template.unavailable,
        )

    def _gpu(self) -> GpuSample:
        gpu = self.gpu
        fb = gpu.profile.memory_gib * 1024
        return GpuSample(
            host="",
            index=gpu.index,
            uuid=gpu.uuid,
            model=gpu.profile.name,
            pod=gpu.pod,
            utilization=min(1.0, gpu.busy * 1.15),
            gr_engine_active=gpu.busy * 0.97,
            tensor_active=gpu.tensor,
            dram_active=gpu.dram,
            power_watts=gpu.power,
            energy_mj=gpu.energy_mj,
            temperature_c=round(gpu.temperature),
            fb_used_mib=round(fb * gpu.fb_used_fraction),
            fb_free_mib=round(fb * (1 - gpu.fb_used_fraction)),
        )


def load_at(peak_sessions: float, jitter: random.Random) -> Callable[[float], float]:
    """Sessions at time t over real days: the daily shape with a little noise."""
    return lambda t: peak_sessions * daily_load(t, 86400.0) * jitter.uniform(0.9, 1.1)


@dataclass(frozen=True)
class Sleep:
    """A replica put to sleep every day from `start_hour` (UTC) for `hours`, at `level`;
    its agents go to `covered_by` (another replica of its model) meanwhile."""

    start_hour: float
    hours: float
    level: int = 1
    covered_by: str | None = None

    def at(self, t: float) -> int:
        hour = (t % 86400) / 3600
        return self.level if (hour - self.start_hour) % 24 < self.hours else 0


@dataclass(frozen=True)
class Overload:
    """A burst of `factor` times the usual load, `hours_ago` before the end, for `hours`."""

    hours_ago: float
    hours: float
    factor: float


def _loads(
    fleet: Fleet,
    peaks: dict[str, float],
    now: float,
    sleeps: dict[str, Sleep],
    overloads: dict[str, Overload],
) -> dict[str, Callable[[float], float]]:
    """Each replica's sessions at time t: its own daily shape, its overload burst, and the
    agents of a sleeping replica it covers for."""
    own: dict[str, Callable[[float], float]] = {}
    for seed, spec in enumerate(fleet.spec.replicas):
        base = load_at(peaks.get(spec.name, 8.0), random.Random(seed))
        burst = overloads.get(spec.name)
        if burst is not None:
            begins = now - burst.hours_ago * 3600
            ends = begins + burst.hours * 3600

            def with_burst(
                t: float,
                base: Callable[[float], float] = base,
                burst: Overload = burst,
                begins: float = begins,
                ends: float = ends,
            ) -> float:
                return base(t) * (burst.factor if begins <= t < ends else 1.0)

            own[spec.name] = with_burst
        else:
            own[spec.name] = base
    loads = dict(own)
    for name, sleep in sleeps.items():
        if sleep.covered_by is None:
            continue
        helper, sleeper = own[sleep.covered_by], own[name]

        def covering(
            t: float,
            helper: Callable[[float], float] = helper,
            sleeper: Callable[[float], float] = sleeper,
            sleep: Sleep = sleep,
        ) -> float:
            return helper(t) + (sleeper(t) if sleep.at(t) else 0.0)

        loads[sleep.covered_by] = covering
    return loads


def backfill_week(
    sessions: sessionmaker[Session],
    fleet: Fleet,
    peaks: dict[str, float],
    now: float,
    days: float = 7.0,
    progress: Callable[[str], None] = lambda _: None,
    sleeps: dict[str, Sleep] | None = None,
    overloads: dict[str, Overload] | None = None,
    levels: tuple[int, ...] = LEVELS,
    level_seconds: float = LEVEL_SECONDS,
) -> int:
    """Write `days` of scrapes for every replica of `fleet` and its GPU, ending at `now`;
    return the number of rows. Rows older than two days are one a minute, newer every 15 s,
    as the collector's rollups would leave them; a prompt deploy each day at 10:00 UTC
    empties every prefix cache for 20 minutes. `sleeps` puts replicas to sleep each day,
    `overloads` gives one a burst of load (past its queue limits, it sheds); `levels` and
    `level_seconds`: the steady loads each replica is measured at (profile)."""
    sleeps, overloads = sleeps or {}, overloads or {}
    loads = _loads(fleet, peaks, now, sleeps, overloads)
    start = now - days * 86400
    times = [*_range(start, now - 2 * 86400, 60.0), *_range(now - 2 * 86400, now, 15.0)]
    written = 0
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in fleet.targets()])
    for seed, spec in enumerate(fleet.spec.replicas):
        progress(f"profiling {spec.name} under agent load")
        replica = fleet.replicas[spec.name]
        live = fleet.nodes[spec.node].gpus[spec.gpu_index]
        gpu = GpuState(
            live.index,
            live.profile,
            memory_fraction=live.memory_fraction,
            pod=live.pod,
            uuid=live.uuid,
        )
        version = replica.sglang.version if replica.sglang else None
        history = History(
            replica.engine.config,
            replica.served_name,
            profile(replica.engine.config, seed, version, levels, level_seconds),
            gpu,
            template=_scrape(replica.sglang) if replica.sglang else None,
        )
        load = loads[spec.name]
        sleep = sleeps.get(spec.name)
        replica_rows: list[tuple[float, ReplicaSample]] = []
        gpu_rows: list[tuple[float, GpuSample]] = []
        previous = times[0]
        for ts in times:
            deploy = (ts % 86400) - 10 * 3600
            sample, reading = history.advance(
                load(ts),
                ts - previous or 15.0,
                cold_cache=0 <= deploy < 1200,
                sleep_level=sleep.at(ts) if sleep else 0,
            )
            reading.host = spec.node
            replica_rows.append((ts, sample))
            gpu_rows.append((ts, reading))
            previous = ts
        progress(f"writing {len(replica_rows)} scrapes of {spec.name}")
        with sessions.begin() as session:
            record_replica_history(session, ids[spec.name], replica_rows)
            record_gpu_history(session, ids[spec.node], gpu_rows)
        written += len(replica_rows) + len(gpu_rows)
    with sessions.begin() as session:
        rollup(session, now, Retention())
    return written


def _range(start: float, stop: float, step: float) -> list[float]:
    count = max(0, int((stop - start) // step))
    return [start + index * step for index in range(count)]
