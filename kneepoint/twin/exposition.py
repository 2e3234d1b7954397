"""vLLM's /metrics as each generation writes it, from a twin engine's state.

Families, labels, HELP texts and buckets follow a real vLLM 0.32 server (its capture is in
../shared/fixtures); `version` 0.10, 0.8 and 0.5 write that release's names
(docs/reference/metrics.md). The text comes from prometheus_client, as vLLM's own does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample

from kneepoint.twin.simulated_engine import Engine
from kneepoint.twin.stats import FINISH_REASONS, Histo

VERSIONS = ("0.32", "0.10", "0.8", "0.5")

HELP = {
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "request_time_per_output_token_seconds": (
        "Histogram of time_per_output_token_seconds per request."
    ),
    "e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
    "request_prompt_tokens": "Number of prefill tokens processed.",
    "request_generation_tokens": "Number of generation tokens processed.",
    "request_max_num_generation_tokens": (
        "Histogram of maximum number of requested generation tokens."
    ),
    "request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "request_prefill_kv_computed_tokens": (
        "Histogram of new KV tokens computed during prefill (excluding cached tokens)."
    ),
    "request_params_n": "Histogram of the n request parameter.",
    "request_num_preemptions": "Histogram of the number of times a request was preempted.",
    "iteration_tokens_total": "Histogram of number of tokens per engine_step.",
}
# Histograms each generation exposes (v0 and early V1 lack the newer ones).
HISTOGRAMS_BY_VERSION = {
    "0.32": tuple(HELP),
    "0.10": tuple(h for h in HELP if h != "request_prefill_kv_computed_tokens"),
    "0.8": (
        "time_to_first_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_inference_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_prompt_tokens",
        "request_generation_tokens",
        "request_max_num_generation_tokens",
        "request_params_max_tokens",
        "request_params_n",
        "iteration_tokens_total",
    ),
    "0.5": (
        "time_to_first_token_seconds",
        "e2e_request_latency_seconds",
        "request_prompt_tokens",
        "request_generation_tokens",
        "request_params_n",
    ),
}


@dataclass
class Snapshot:
    """A consistent copy of what the exposition needs, taken under the replica's lock."""

    engine: Engine
    served_name: str
    started_at: float
    gpu_memory_utilization: float


class VllmCollector(Collector):
    def __init__(self, snapshot: Callable[[], Snapshot], version: str = "0.32") -> None:
        if version not in VERSIONS:
            raise ValueError(f"unknown vLLM version {version!r}; choose one of {VERSIONS}")
        self.snapshot = snapshot
        self.version = version

    def collect(self) -> Iterator[Metric]:
        snap: Snapshot = self.snapshot()
        yield from _families(snap, self.version)


def render(snapshot: Snapshot, version: str = "0.32") -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(VllmCollector(lambda: snapshot, version))
    return generate_latest(registry)


def _families(snap: Snapshot, version: str) -> Iterator[Metric]:
    engine, stats = snap.engine, snap.engine.stats
    v1 = version != "0.5"
    labels = ["model_name", "engine"] if version in ("0.32", "0.10") else ["model_name"]
    values = [snap.served_name, "0"][: len(labels)]
    created = snap.started_at if v1 else None
    usage = engine.kv.usage

    def gauge(name: str, doc: str, value: float) -> Metric:
        family = GaugeMetricFamily(f"vllm:{name}", doc, labels=labels)
        family.add_metric(values, value)
        return family

    def counter(name: str, doc: str, value: float) -> Metric:
        family = CounterMetricFamily(f"vllm:{name}", doc, labels=labels)
        family.add_metric(values, value, created=created)
        return family

    yield from _cache_config(snap, version)
    yield gauge(
        "num_requests_running",
        "Number of requests in model execution batches.",
        len(engine.running),
    )
    yield gauge(
        "num_requests_waiting", "Number of requests waiting to be processed.", len(engine.waiting)
    )
    if version == "0.32":
        family = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity', 'deferred'.",
            labels=[*labels, "reason"],
        )
        family.add_metric([*values, "capacity"], engine.waiting_for_capacity)
        family.add_metric([*values, "deferred"], len(engine.waiting) - engine.waiting_for_capacity)
        yield family
    if version in ("0.32", "0.10"):
        yield gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
    if version != "0.32":
        yield gauge("gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", usage)
    if version == "0.5":
        yield gauge("num_requests_swapped", "Number of requests swapped to CPU.", 0)
        yield gauge("cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.", 0)
        rate = (
            stats.prefix_cache_hits / stats.prefix_cache_queries
            if stats.prefix_cache_queries
            else 0
        )
        yield gauge("gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.", rate)
    if version in ("0.32", "0.10"):
        yield counter(
            "prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_cache_queries,
        )
        yield counter(
            "prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            stats.prefix_cache_hits,
        )
    if version in ("0.10", "0.8"):
        yield counter(
            "gpu_prefix_cache_queries",
            "GPU prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_cache_queries,
        )
        yield counter(
            "gpu_prefix_cache_hits",
            "GPU prefix cache hits, in terms of number of cached tokens.",
            stats.prefix_cache_hits,
        )
    yield counter(
        "num_preemptions", "Cumulative number of preemption from the engine.", stats.preemptions
    )
    yield counter("prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens)
    yield counter(
        "generation_tokens", "Number of generation tokens processed.", stats.generation_tokens
    )
    if version == "0.32":
        yield from _prompt_sources(snap, labels, values, created)
        yield from _v032_families(snap, labels, values, created)
    finished = CounterMetricFamily(
        "vllm:request_success",
        "Count of successfully processed requests.",
        labels=[*labels, "finished_reason"],
    )
    for reason in FINISH_REASONS if v1 else ("stop", "length"):
        finished.add_metric([*values, reason], stats.finished[reason], created=created)
    yield finished
    yield from _spec_decode(snap, labels, values, created, version)
    for name in HISTOGRAMS_BY_VERSION[version]:
        yield _histogram(
            f"vllm:{name}", HELP[name], labels, values, stats.histograms[name], created
        )
    if version in ("0.10", "0.8", "0.5"):
        # The name inter-token latency had before 0.10 (both are exposed in 0.10 and 0.11).
        yield _histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            labels,
            values,
            stats.histograms["inter_token_latency_seconds"],
        )
    if version == "0.5":
        yield gauge(
            "avg_generation_throughput_toks_per_s", "Average generation throughput in tokens/s.", 0
        )


def _histogram(
    name: str,
    doc: str,
    labels: list[str],
    values: list[str],
    histo: Histo,
    created: float | None = None,
) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=labels)
    bounds = [*(_le(b) for b in histo.bounds), "+Inf"]
    family.add_metric(values, list(zip(bounds, histo.cumulative(), strict=True)), histo.total)
    if created is not None:
        # As prometheus_client's own Histogram does; its family helper has no such argument.
        family.samples.append(
            Sample(f"{name}_created", dict(zip(labels, values, strict=True)), created)
        )
    return family


def _le(bound: float) -> str:
    return repr(float(bound))


# The labels vLLM 0.32 adds to cache_config_info, with the values a plain deployment shows.
V032_CACHE_CONFIG = {
    "_block_size_resolved": "True",
    "cache_hit_alignment_tokens": "None",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


def _cache_config(snap: Snapshot, version: str) -> Iterator[Metric]:
    config = snap.engine.config
    info = {
        "block_size": str(config.block_size),
        "cache_dtype": "fp8" if config.fp8_kv_cache else "auto",
        "enable_prefix_caching": str(config.enable_prefix_caching),
        "gpu_memory_utilization": str(config.gpu_memory_utilization),
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(snap.engine.kv.num_blocks),
        "num_gpu_blocks_override": "None",
        "sliding_window": "None",
    }
    if version == "0.32":
        capacity = snap.engine.capacity_tokens
        info |= V032_CACHE_CONFIG | {
            "effective_attention_block_size": str(config.block_size),
            "engine": "0",
            "kv_cache_size_tokens": str(capacity),
            "kv_cache_max_concurrency": repr(capacity / config.max_model_len),
            "kv_cache_memory_bytes": str(int(capacity * config.kv_bytes_per_token)),
        }
        if config.kv_offload_gib > 0:
            info["kv_offloading_size"] = repr(float(config.kv_offload_gib))
    family = GaugeMetricFamily(
        "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=sorted(info)
    )
    family.add_metric([info[key] for key in sorted(info)], 1.0)
    yield family


def _prompt_sources(
    snap: Snapshot, labels: list[str], values: list[str], created: float | None
) -> Iterator[Metric]:
    stats = snap.engine.stats
    family = CounterMetricFamily(
        "vllm:prompt_tokens_by_source",
        "Number of prompt tokens by source.",
        labels=[*labels, "source"],
    )
    for source, value in (
        ("local_compute", stats.prompt_local_compute),
        ("local_cache_hit", stats.prompt_cache_hit),
        ("external_kv_transfer", stats.prompt_host_hit),
    ):
        family.add_metric([*values, source], value, created=created)
    yield family
    cached = CounterMetricFamily(
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        labels=labels,
    )
    cached.add_metric(values, stats.prompt_cache_hit + stats.prompt_host_hit, created=created)
    yield cached
    tiers = CounterMetricFamily(
        "vllm:prompt_tokens_cached_by_source",
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
        "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
        "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
        "vllm:external_prefix_cache_hits.",
        labels=[*labels, "source"],
    )
    by_tier = {"device": stats.prompt_cache_hit, "host": stats.prompt_host_hit}
    for tier in ("device", "host", "p2p", "disk", "external_unspecified"):
        tiers.add_metric([*values, tier], by_tier.get(tier, 0), created=created)
    yield tiers


def _spec_decode(
    snap: Snapshot, labels: list[str], values: list[str], created: float | None, version: str
) -> Iterator[Metric]:
    stats = snap.engine.stats
    if not snap.engine.config.num_speculative_tokens:
        return
    pairs = [
        ("num_draft_tokens", stats.spec_draft_tokens, "Number of draft tokens."),
        ("num_accepted_tokens", stats.spec_accepted, "Number of accepted tokens."),
    ]
    if version != "0.5":
        pairs.insert(0, ("num_drafts", stats.spec_drafts, "Number of spec decoding drafts."))
    for name, value, doc in pairs:
        family = CounterMetricFamily(f"vllm:spec_decode_{name}", doc, labels=labels)
        family.add_metric(values, value, created=created)
        yield family
    if version == "0.5":
        return
    family = CounterMetricFamily(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "Accepted tokens per draft position.",
        labels=[*labels, "position"],
    )
    for position, value in enumerate(stats.spec_accepted_per_position):
        family.add_metric([*values, str(position)], value, created=created)
    yield family


def _v032_families(
    snap: Snapshot, labels: list[str], values: list[str], created: float | None
) -> Iterator[Metric]:
    """The families vLLM 0.32 added: sleep state, the MFU estimates, the offloading
    connector's hits, the multi-modal cache (always 0: the twin serves text), admission
    rejections, and with a CPU offload tier its usage and bytes moved."""
    engine, stats = snap.engine, snap.engine.stats
    sleep = GaugeMetricFamily(
        "vllm:engine_sleep_state",
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
        "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        labels=[*labels, "sleep_state"],
    )
    level = engine.sleep_level
    for state, value in (
        ("awake", float(level == 0)),
        ("weights_offloaded", float(level == 1)),
        ("discard_all", float(level == 2)),
    ):
        sleep.add_metric([*values, state], value)
    yield sleep
    for name, doc, value in (
        (
            "estimated_flops_per_gpu",
            "Estimated number of floating point operations per GPU "
            "(for Model Flops Utilization calculations).",
            stats.estimated_flops,
        ),
        (
            "estimated_read_bytes_per_gpu",
            "Estimated number of bytes read from memory per GPU "
            "(for Model Flops Utilization calculations).",
            stats.estimated_read_bytes,
        ),
        (
            "estimated_write_bytes_per_gpu",
            "Estimated number of bytes written to memory per GPU "
            "(for Model Flops Utilization calculations).",
            stats.estimated_write_bytes,
        ),
        (
            "external_prefix_cache_queries",
            "External prefix cache queries from KV connector "
            "cross-instance cache sharing, in terms of number of queried tokens.",
            stats.external_prefix_cache_queries,
        ),
        (
            "external_prefix_cache_hits",
            "External prefix cache hits from KV connector "
            "cross-instance cache sharing, in terms of number of cached tokens.",
            stats.external_prefix_cache_hits,
        ),
        (
            "mm_cache_queries",
            "Multi-modal cache queries, in terms of number of queried items.",
            0.0,
        ),
        ("mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", 0.0),
    ):
        family = CounterMetricFamily(f"vllm:{name}", doc, labels=labels)
        family.add_metric(values, float(value), created=created)
        yield family
    rejections = CounterMetricFamily(
        "vllm:admission_rejections",
        "Number of admission attempts rejected by a queue limit, by reason.",
        labels=["model_name", "reason"],
    )
    for reason, count in stats.admission_rejections.items():
        rejections.add_metric([values[0], reason], float(count), created=created)
    yield rejections
    if engine.host is None:
        return
    # vllm/v1/kv_offload/cpu/common.py and .../kv_connector/v1/offloading/metrics.py
    usage = GaugeMetricFamily(
        "vllm:kv_offload_cpu_cache_usage_perc",
        "CPU KV cache usage percentage for offloading.",
        labels=labels,
    )
    usage.add_metric(values, engine.host.usage)
    yield usage
    for name, doc, value in (
        (
            "kv_offload_load_bytes",
            "Total bytes loaded from offload storage to GPU.",
            stats.kv_offload_load_bytes,
        ),
        (
            "kv_offload_store_bytes",
            "Total bytes stored from GPU to offload storage.",
            stats.kv_offload_store_bytes,
        ),
    ):
        family = CounterMetricFamily(f"vllm:{name}", doc, labels=labels)
        family.add_metric(values, value, created=created)
        yield family
