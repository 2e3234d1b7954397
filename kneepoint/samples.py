"""The canonical quantities one scrape yields, whatever engine, engine version or DCGM version
produced them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from kneepoint import catalogue

# Engine generations a vLLM target can speak (docs/reference/metrics.md, vLLM's generations).
GENERATIONS = ("v0", "v1-0.8", "v1-0.10", "v1")

# The canonical quantities an engine may be unable to give (the keys of
# ReplicaSample.unavailable), each with the numbers of `kneepoint status --json` and of the
# alert rules (alerts/rules.py METRICS) that it makes unavailable (kneepoint/catalogue.py).
# A quantity an engine lacks is reported with its reason, never as 0 and never as a silent
# "no data" alert.
QUANTITIES: dict[str, tuple[str, ...]] = catalogue.quantities()


def unavailable_reason(unavailable: dict[str, str], number: str) -> str | None:
    """Why `number` (a status key, an alert metric or a quantity) is unavailable, or None."""
    if number in unavailable:
        return unavailable[number]
    for quantity, numbers in QUANTITIES.items():
        if number in numbers and quantity in unavailable:
            return unavailable[quantity]
    return None


# KV-cache occupancy above which a replica counts as saturated.
SATURATION = 0.9

# vLLM's sleep levels (the `sleep_level` gauge, vllm:engine_sleep_state) in words, as status,
# the timeline and the pages name them.
SLEEP_STATES = {0: "awake", 1: "weights offloaded", 2: "everything discarded"}


def sleep_state(level: float | None) -> str | None:
    """The words for a stored sleep level; None where the engine does not say. A summary
    row's level is its bucket's mean: above 0 but below 1 was asleep for part of it, named
    "asleep" (as `level > 0` is asleep everywhere)."""
    if level is None:
        return None
    if level <= 0:
        return SLEEP_STATES[0]
    return SLEEP_STATES[2] if level >= 2 else SLEEP_STATES[1] if level >= 1 else "asleep"


# Histogram families whose buckets are stored, so quantiles work over any window.
HISTOGRAMS = ("ttft", "itl", "e2e", "queue")
# Histograms of load, stored like the latency ones but never an SLO's: tokens per engine step
# (vLLM: iteration_tokens_total), whose top buckets show a full per-step token budget; each
# finished request's prompt and output length in tokens (vLLM: request_prompt_tokens,
# request_generation_tokens), which the what-if replays bucket by bucket (migration 0022).
LOAD_HISTOGRAMS = ("iteration_tokens", "prompt_length", "output_length")

# Monotonic counters of a replica, stored cumulative; windowed values come from their increase.
REPLICA_COUNTERS = (
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prompt_tokens_local_compute",
    "prompt_tokens_local_cache_hit",
    "prompt_tokens_external",
    "requests_finished_stop",
    "requests_finished_length",
    "requests_finished_abort",
    "requests_finished_error",
    "requests_finished_repetition",
    "request_prompt_tokens_sum",
    "request_prompt_tokens_count",
    "request_generation_tokens_sum",
    "request_generation_tokens_count",
    "spec_decode_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
    "http_requests",  # the API server's (vLLM: http_requests_total), and those with a 5xx
    "http_requests_5xx",
    # The engine's steps (vLLM: the count of the iteration_tokens_total histogram), the
    # stalled-engine signal beside the token counters (kneepoint/derived/stall.py).
    "engine_steps",
    # vLLM 0.32's (docs/reference/metrics.md): requests refused at admission because a queue
    # limit (max_num_queued_reqs / max_num_queued_tokens) was reached, all reasons summed.
    "admission_rejections",
    # The model's own estimate of its work per GPU (--enable-mfu-metrics), summed over the
    # replica's engines: FLOPs, and bytes read and written; recompute after a preemption is
    # included (it is built from the tokens actually scheduled).
    "estimated_flops",
    "estimated_read_bytes",
    "estimated_write_bytes",
    # Cached prompt tokens by the tier that supplied them (prompt_tokens_cached_by_source).
    "prompt_tokens_cached_device",
    "prompt_tokens_cached_host",
    "prompt_tokens_cached_p2p",
    "prompt_tokens_cached_disk",
    "prompt_tokens_cached_external",
    # A KV connector's (LMCache etc.) prefix-cache lookups and hits, in tokens.
    "external_prefix_cache_queries",
    "external_prefix_cache_hits",
    # Prompt tokens actually computed at each request's first prefill (prompt − cached).
    "prefill_kv_computed_tokens_sum",
    "prefill_kv_computed_tokens_count",
    "mm_cache_queries",
    "mm_cache_hits",
    "corrupted_requests",
    # KV blocks moved between the GPU and the offload tier (CPU), bytes.
    "kv_offload_load_bytes",
    "kv_offload_store_bytes",
)

# Point-in-time values of a replica (the latest scrape is what they mean).
REPLICA_GAUGES = (
    "kv_cache_usage",
    "kv_cache_usage_mean",
    "requests_running",
    "requests_waiting",
    "requests_waiting_capacity",
    "requests_swapped",
    # The engine's own hit rate where it has no hit and query counters (vLLM v0, SGLang 0.4.0)
    "prefix_cache_hit_rate_gauge",
    # The engine's own speculative-decoding figures where it has no draft/accept counters
    # (SGLang's spec_accept_length / spec_accept_rate, TensorRT-LLM's acceptance length).
    "spec_decode_acceptance_length_gauge",
    "spec_decode_acceptance_rate_gauge",
    # vLLM's engine_sleep_state: 0 awake, 1 weights offloaded, 2 everything discarded (the
    # deepest over the replica's engines); a bucket's mean is the level weighted by time.
    "sleep_level",
    # LoRA adapters named running and waiting in vLLM's lora_requests_info.
    "lora_adapters_running",
    "lora_adapters_waiting",
    # The CPU offload tier's occupancy, 0..1 (vllm:kv_offload_cpu_cache_usage_perc).
    "kv_offload_usage",
)

# Point-in-time values kept as the last sample's, never averaged (a summary row holds its
# bucket's last): the API server process's start time (vLLM: process_start_time_seconds),
# epoch seconds; it moving forward is a restart (kneepoint/timeline.py).
REPLICA_LAST_GAUGES = ("process_start_time",)


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram: upper bounds (ending in +Inf), cumulative counts, and the sum."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    total: float

    @property
    def count(self) -> float:
        return self.counts[-1] if self.counts else 0.0


@dataclass
class CacheConfig:
    """What `cache_config_info` tells about the KV cache."""

    block_size: int | None = None
    num_gpu_blocks: int | None = None
    cache_dtype: str | None = None
    enable_prefix_caching: bool | None = None
    gpu_memory_utilization: float | None = None
    capacity_tokens: int | None = None


class LoraAdapters(TypedDict):
    """LoRA adapters as the engine names them (vLLM: lora_requests_info's labels)."""

    running: list[str]
    waiting: list[str]
    max_lora: int | None


@dataclass
class ReplicaSample:
    """One inference engine's scrape (vLLM, SGLang, llama.cpp, TGI or TensorRT-LLM),
    aggregated over its data-parallel engines / ranks.

    Counters and queues are summed over engines, occupancy is the max (and the mean); fields
    the server did not expose are None, never 0. `engine` names the engine (one of
    collectors.engines.ENGINES) and `generation` its release generation as the engine's
    normalizer names it.
    `unavailable` maps a canonical quantity this engine (at this generation) cannot give to
    the reason in words, e.g. {"kv_cache_occupancy": "not exposed by llama.cpp since its KV
    gauges were removed"}: its keys are the keys of `gauges`, `counters`, `histograms` or a
    derived number of `kneepoint status` (kv_cache_occupancy, kv_cache_capacity_tokens,
    prefix_cache_hit_rate, preemptions, spec_decode_acceptance, ttft, itl, e2e, ...).
    """

    generation: str
    engines: int
    model_names: list[str]
    gauges: dict[str, float | None] = field(default_factory=dict)
    counters: dict[str, float | None] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    accepted_per_position: list[float] | None = None
    cache: CacheConfig = field(default_factory=CacheConfig)
    engine: str = "vllm"
    unavailable: dict[str, str] = field(default_factory=dict)
    lora: LoraAdapters | None = None  # None without LoRA


@dataclass
class GpuSample:
    """One GPU as one dcgm-exporter scrape shows it."""

    host: str
    index: int
    uuid: str | None = None
    model: str | None = None
    pod: str | None = None
    namespace: str | None = None
    utilization: float | None = None
    gr_engine_active: float | None = None
    sm_active: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    power_watts: float | None = None
    energy_mj: float | None = None
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    xid_error: float | None = None
    # DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (CLOCKS_EVENT_REASONS in DCGM 3.3+): NVML's bitmask.
    clock_events: float | None = None
