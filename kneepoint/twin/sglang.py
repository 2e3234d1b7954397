"""SGLang's /metrics as each release generation writes it, from a twin engine's state.

A twin replica with `engine: sglang` runs the same engine model as a vLLM one; what differs
is what it reports and when, as SGLang's own code does it:

* The scheduler's series (queues, KV pool, retractions, speculative decoding) carry its rank
  labels. Queue and pool gauges are the engine's state at the scrape (SGLang republishes them
  when it goes idle); gen_throughput, spec_accept_length/rate and num_retracted_reqs are what
  its decode log last wrote (every 40 decode steps), cache_hit_rate its last prefill batch's,
  and queue_time_seconds is observed when a request is first scheduled.
* The tokenizer's series (tokens, TTFT / ITL / E2E) are counted per finished request, at the
  outputs the tokenizer actually receives: every step of a streamed request, but only every
  50 tokens and at the end of a non-streamed one (so before 0.5.23 its TTFT is when its 50th
  token, or its last, arrived; 0.5.23 takes the scheduler's first-token time). From 0.5.23
  they are split by `is_streaming`.
* Series SGLang creates at their first observation (tokens, latencies, retraction counters,
  cached tokens) are absent until then, as in prometheus_client's multiprocess mode.

Names, types, HELP texts, labels and buckets come from kneepoint/twin/sglang_catalog.py,
generated from SGLang's wheels; tests/twin/test_sglang.py holds the output against the
fixtures and parses it with kneepoint's SGLang normalizer. The KV pool is reported in the
engine's blocks as pages (a server started with --page-size 16).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from kneepoint.twin.profiles import GIB
from kneepoint.twin.sglang_catalog import BOUNDS, FAMILIES, Family
from kneepoint.twin.simulated_engine import Engine, Request, TokenSink
from kneepoint.twin.stats import Histo

VERSIONS = tuple(FAMILIES)  # newest first
NEWEST = VERSIONS[0]
FORCE_STREAM_INTERVAL = 50  # a non-streamed request's outputs reach the tokenizer this often
DECODE_LOG_INTERVAL = 40  # decode steps between the scheduler's decode logs

# The tokenizer's histograms, by the key the twin keeps them under.
TOKENIZER_HISTOGRAMS = {
    "sglang:time_to_first_token_seconds": "ttft",
    "sglang:inter_token_latency_seconds": "itl",
    "sglang:time_per_output_token_seconds": "itl",  # ≤0.4.3's name (and meaning, see _Track)
    "sglang:e2e_request_latency_seconds": "e2e",
    "sglang:request_time_per_output_token_seconds": "tpot",
    "sglang:prompt_tokens_histogram": "prompt",
    "sglang:uncached_prompt_tokens_histogram": "uncached",
    "sglang:generation_tokens_histogram": "generation",
    "sglang:num_retractions": "retractions",
}
TOKENIZER_COUNTERS = {
    "sglang:prompt_tokens_total": "prompt_tokens",
    "sglang:generation_tokens_total": "generation_tokens",
    "sglang:num_requests_total": "requests",
    "sglang:cached_tokens_total": "cached_tokens",
    "sglang:spec_verify_calls_total": "spec_verify_calls",
}


@dataclass
class _Requests:
    """What SGLang's tokenizer has counted of finished requests (one `is_streaming` value)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0
    cached_tokens: int = 0
    spec_verify_calls: int = 0
    histograms: dict[str, Histo] = field(default_factory=dict)


class SglangMetrics:
    """SGLang's scheduler and tokenizer metric state for one twin engine, kept as it runs."""

    def __init__(self, engine: Engine, version: str = NEWEST) -> None:
        if version not in FAMILIES:
            raise ValueError(f"unknown SGLang version {version!r}; choose one of {VERSIONS}")
        self.engine = engine
        self.version = version
        self.families = FAMILIES[version]
        self._bounds = {
            TOKENIZER_HISTOGRAMS[f.name]: BOUNDS[f.bounds]
            for f in self.families
            if f.name in TOKENIZER_HISTOGRAMS and f.bounds
        }
        queue = next((f for f in self.families if f.name == "sglang:queue_time_seconds"), None)
        self.queue_time = Histo(BOUNDS[queue.bounds]) if queue and queue.bounds else None
        self.by_stream: dict[bool, _Requests] = {}
        # What the scheduler's logs last wrote.
        self.logged: dict[str, float] = {}
        self._decode_steps = 0
        self._mark = self._counters()
        engine.observers.append(self._on_step)

    # --- the tokenizer side -------------------------------------------------------------

    def track(self, request: Request, sink: TokenSink | None, stream: bool) -> TokenSink:
        """Wrap `request`'s sink so SGLang's tokenizer metrics see its outputs."""
        return _Track(self, request, sink, stream)

    def requests(self, stream: bool) -> _Requests:
        kept = self.by_stream.get(stream)
        if kept is None:
            kept = _Requests(histograms={k: Histo(b) for k, b in self._bounds.items()})
            self.by_stream[stream] = kept
        return kept

    def total(self, name: str) -> float:
        return float(sum(getattr(r, name) for r in self.by_stream.values()))

    # --- the scheduler side -------------------------------------------------------------

    def _counters(self) -> tuple[float, int, int, int, int]:
        stats = self.engine.stats
        return (
            self.engine.now,
            stats.generation_tokens,
            stats.preemptions,
            stats.spec_drafts,
            stats.spec_accepted,
        )

    def _on_step(self, work: list[tuple[Request, int]], duration: float) -> None:
        engine = self.engine
        if engine.admitted:  # a prefill batch: SGLang logs its hit rate and queue times
            prompt = sum(r.prompt_len for r in engine.admitted)
            self.logged["cache_hit_rate"] = sum(r.cached for r in engine.admitted) / prompt
            waits = [(r.first_scheduled or r.arrival) - r.arrival for r in engine.admitted]
            self.logged["avg_request_queue_latency"] = sum(waits) / len(waits)
            if self.queue_time is not None:
                for wait in waits:
                    self.queue_time.observe(wait)
        if not any(r.computed > r.prompt_len for r, _ in work):
            return
        self._decode_steps += 1
        if self._decode_steps % DECODE_LOG_INTERVAL:
            return
        now = self._counters()
        then, self._mark = self._mark, now
        elapsed = now[0] - then[0]
        drafts, accepted = now[3] - then[3], now[4] - then[4]
        gamma = engine.config.num_speculative_tokens
        self.logged |= {
            "gen_throughput": (now[1] - then[1]) / elapsed if elapsed > 0 else 0.0,
            "num_retracted_reqs": float(now[2] - then[2]),
            "spec_accept_length": (accepted + drafts) / drafts if drafts else 0.0,
            "spec_accept_rate": accepted / (drafts * gamma) if drafts and gamma else 0.0,
            "decode_sum_seq_lens": float(sum(r.computed for r in engine.running)),
        }

    def scheduler_value(self, name: str) -> float | None:
        """A scheduler series' value, or None where the twin does not model it."""
        engine, config = self.engine, self.engine.config
        kv = engine.kv
        page = kv.block_size
        used = (kv.usable - kv.free) * page
        capacity = kv.usable * page
        idle = engine.idle
        values: dict[str, float] = {
            "num_running_reqs": len(engine.running),
            "num_queue_reqs": len(engine.waiting),
            "token_usage": kv.usage,
            "full_token_usage": kv.usage,
            "num_used_tokens": used,
            "kv_used_tokens": used,
            "kv_evictable_tokens": kv.evictable * page,
            "kv_available_tokens": capacity - used - kv.evictable * page,
            "max_total_num_tokens": capacity,
            "page_size": page,
            "num_pages": kv.usable,
            "context_len": config.max_model_len,
            "spec_num_steps": config.num_speculative_tokens,
            "spec_num_draft_tokens": (
                config.num_speculative_tokens + 1 if config.num_speculative_tokens else 0
            ),
            "weight_memory_usage_gb": config.weight_bytes / GIB,
            "kv_cache_memory_usage_gb": capacity * config.kv_bytes_per_token / GIB,
            "startup_available_gpu_memory_gb": config.gpu.memory_gib,
            "cache_hit_rate": self.logged.get("cache_hit_rate", 0.0),
            "avg_request_queue_latency": self.logged.get("avg_request_queue_latency", 0.0),
            # What the last decode log wrote; the throughput decays to 0 once idle.
            "gen_throughput": 0.0 if idle else self.logged.get("gen_throughput", 0.0),
            "num_retracted_reqs": self.logged.get("num_retracted_reqs", 0.0),
            "spec_accept_length": self.logged.get("spec_accept_length", 0.0),
            "spec_accept_rate": self.logged.get("spec_accept_rate", 0.0),
            "decode_sum_seq_lens": self.logged.get("decode_sum_seq_lens", 0.0),
            "num_retracted_requests_total": engine.stats.preemptions,
            "num_retracted_input_tokens_total": engine.stats.preempted_prompt_tokens,
            "num_retracted_output_tokens_total": engine.stats.preempted_output_tokens,
        }
        value = values.get(name.removeprefix("sglang:"))
        return None if value is None else float(value)


class _Track:
    """One request as SGLang's tokenizer manager sees it (collect_metrics of each release)."""

    def __init__(
        self, metrics: SglangMetrics, request: Request, sink: TokenSink | None, stream: bool
    ) -> None:
        self.metrics, self.request, self.sink, self.stream = metrics, request, sink, stream
        self.generated = 0
        self.steps = 0
        self.first: float | None = None  # when the tokenizer got its first output
        self.last_time = 0.0
        self.last_count = 0

    def __call__(self, count: int, done: bool, at: float) -> None:
        self.generated += count
        self.steps += 1
        if self.sink is not None:
            self.sink(count, done, at)
        version = self.metrics.version
        if not (
            done
            or self.stream
            or (version != "0.4.0" and self.generated % FORCE_STREAM_INTERVAL == 0)
        ):
            return  # the scheduler sends this request nothing at this step
        kept = self.metrics.requests(self.stream)
        histos = kept.histograms
        arrival = self.request.arrival
        if self.first is None:
            self.first = self.last_time = at
            self.last_count = self.generated
            if version == "0.5.23" and self.request.first_token is not None:
                # Non-streamed outputs come in batches: from 0.5.23 the first token's time is
                # the scheduler's (when the prefill finished), not the first output's.
                self.first = self.request.first_token
            histos["ttft"].observe(self.first - arrival)
        elif version == "0.4.0":
            # time_per_output_token: the mean per token since the first, at every output.
            if self.generated >= 2:
                histos["itl"].observe((at - self.first) / (self.generated - 1))
        else:
            new = self.generated - self.last_count
            if new:
                # observe_inter_token_latency: the interval spread over the new tokens.
                histos["itl"].observe((at - self.last_time) / new, new)
                self.last_time, self.last_count = at, self.generated
        if done:
            self._finish(kept, at)

    def _finish(self, kept: _Requests, at: float) -> None:
        request, histos = self.request, kept.histograms
        prompt, generated = request.prompt_len, self.generated
        kept.prompt_tokens += prompt
        kept.generation_tokens += generated
        kept.requests += 1
        kept.cached_tokens += request.cached
        if self.metrics.engine.config.num_speculative_tokens:
            kept.spec_verify_calls += self.steps - 1  # every decode step after the first token
        histos["e2e"].observe(at - request.arrival)
        if self.metrics.version == "0.4.0" and generated >= 1:
            histos["itl"].observe((at - request.arrival) / generated)
        optional = {
            "tpot": (at - (self.first or at)) / (generated - 1) if generated > 1 else None,
            "prompt": prompt,
            "uncached": prompt - request.cached,
            "generation": generated,
            "retractions": request.preemptions,
        }
        for key, value in optional.items():
            if key in histos and value is not None:
                histos[key].observe(value)


# --- the exposition -----------------------------------------------------------------------


class SglangCollector(Collector):
    def __init__(self, metrics: SglangMetrics, served_name: str) -> None:
        self.metrics = metrics
        self.served_name = served_name

    def collect(self) -> Iterator[Metric]:
        base = {
            "model_name": self.served_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
            "pid": str(os.getpid()),
        }
        for family in self.metrics.families:
            name = family.name
            metric = Metric(
                name.removesuffix("_total") if family.type == "counter" else name,
                family.help,
                family.type,
            )
            for extra, value in self._series(family):
                labels = {k: v for k, v in base.items() if k in family.labels} | extra
                _add(metric, family, labels, value)
            if metric.samples:
                yield metric

    def _series(self, family: Family) -> Iterator[tuple[dict[str, str], float | Histo]]:
        """The family's series: (labels beyond the server's own, value or histogram)."""
        metrics, name = self.metrics, family.name
        if name in TOKENIZER_COUNTERS or name in TOKENIZER_HISTOGRAMS:
            yield from self._tokenizer(family)
            return
        if name == "sglang:queue_time_seconds":
            if metrics.queue_time is not None and any(metrics.queue_time.counts):
                yield {}, metrics.queue_time
            return
        if name == "sglang:cache_config_info":  # 0.5.10: the pool's geometry in labels
            kv = metrics.engine.kv
            yield {"page_size": str(kv.block_size), "num_pages": str(kv.usable)}, 1.0
            return
        value = metrics.scheduler_value(name)
        if value is not None and (family.eager or value > 0):
            yield {}, value  # a series SGLang creates at its first increment waits for it
            return
        for labels, default in family.eager:
            if family.type == "histogram":
                yield dict(labels), Histo(BOUNDS[family.bounds or ""])
            else:
                yield dict(labels), default

    def _tokenizer(self, family: Family) -> Iterator[tuple[dict[str, str], float | Histo]]:
        metrics, name = self.metrics, family.name
        seen = [s for s in (True, False) if s in metrics.by_stream]
        groups = (
            [({"is_streaming": "true" if s else "false"}, [metrics.by_stream[s]]) for s in seen]
            if "is_streaming" in family.labels
            else [({}, [metrics.by_stream[s] for s in seen])]
        )
        for extra, kept in groups:
            if not kept or not sum(k.requests for k in kept):
                continue
            if name in TOKENIZER_HISTOGRAMS:
                key = TOKENIZER_HISTOGRAMS[name]
                merged = _merge([k.histograms[key] for k in kept if key in k.histograms])
                if merged is not None and any(merged.counts):
                    yield extra, merged
                continue
            value = sum(getattr(k, TOKENIZER_COUNTERS[name]) for k in kept)
            if name == "sglang:cached_tokens_total" and "cache_source" in family.labels:
                extra = extra | {"cache_source": "device"}  # the scheduler's fallback detail
            if value > 0 or name not in (
                "sglang:cached_tokens_total",
                "sglang:spec_verify_calls_total",
            ):
                yield extra, float(value)


def _merge(histos: list[Histo]) -> Histo | None:
    if not histos:
        return None
    merged = Histo(histos[0].bounds)
    for histo in histos:
        merged.counts = [a + b for a, b in zip(merged.counts, histo.counts, strict=True)]
        merged.total += histo.total
    return merged


def _add(metric: Metric, family: Family, labels: dict[str, str], value: float | Histo) -> None:
    """One series, as prometheus_client's multiprocess collector writes it (labels sorted;
    a histogram's sum, then its buckets, then its count)."""
    name = family.name
    if not isinstance(value, Histo):
        metric.add_sample(name, dict(sorted(labels.items())), value)
        return
    metric.add_sample(f"{name}_sum", dict(sorted(labels.items())), value.total)
    running = 0
    bounds = [*value.bounds, math.inf]
    for bound, count in zip(bounds, value.counts, strict=True):
        running += count
        bucket = dict(sorted((labels | {"le": floatToGoString(bound)}).items()))
        metric.add_sample(f"{name}_bucket", bucket, float(running))
    metric.add_sample(f"{name}_count", dict(sorted(labels.items())), float(running))


def render(metrics: SglangMetrics, served_name: str) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SglangCollector(metrics, served_name))
    return generate_latest(registry)
