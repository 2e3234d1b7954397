"""Normalize a vLLM /metrics scrape (v0 0.5 to V1 0.32) into one canonical ReplicaSample.

Each canonical quantity lists its vLLM names newest first; the first one present wins, so a
release that exposes a deprecated name next to its replacement (0.10, 0.11) is counted once.
"""

from __future__ import annotations

import math
from collections import defaultdict

from collectors.engines.common import (
    Engine,
    by_position,
    first_present,
    histogram_names,
    maximum,
    mean,
    model_names,
    read_histograms,
    sum_first,
    sum_where,
)
from collectors.parse import (
    MAX_INT,
    MAX_SERIES,
    ParsedScrape,
    ScrapeFormatError,
    Series,
    SeriesCache,
    checked,
    parse_exposition,
)
from kneepoint.samples import CacheConfig, LoraAdapters, ReplicaSample

GAUGES: dict[str, tuple[str, ...]] = {
    "requests_running": ("vllm:num_requests_running",),
    "requests_waiting": ("vllm:num_requests_waiting",),
    "requests_swapped": ("vllm:num_requests_swapped",),
}
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
V0_PREFIX_HIT_RATE = "vllm:gpu_prefix_cache_hit_rate"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
# The API server process's start time (prometheus_client's process collector; no vllm:
# prefix), epoch seconds: the timeline's restarts of a replica whose counts were all zero.
# The newest where several processes export it; absent (older releases, no process
# collector): None.
PROCESS_START = "process_start_time_seconds"

COUNTERS: dict[str, tuple[str, ...]] = {
    "preemptions": ("vllm:num_preemptions_total",),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "prefix_cache_queries": (
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
    ),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "request_prompt_tokens_sum": ("vllm:request_prompt_tokens_sum",),
    "request_prompt_tokens_count": ("vllm:request_prompt_tokens_count",),
    "request_generation_tokens_sum": ("vllm:request_generation_tokens_sum",),
    "request_generation_tokens_count": ("vllm:request_generation_tokens_count",),
    "spec_decode_drafts": ("vllm:spec_decode_num_drafts_total",),
    "spec_decode_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_decode_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
    # The API server's requests (prometheus-fastapi-instrumentator; no vllm: prefix; it
    # leaves /metrics and /health out): every handler and status, and the 5xx below.
    "http_requests": ("http_requests_total",),
    # Engine steps: `iteration_tokens_total` is a histogram (despite its name) observed once
    # per engine step with the step's token count, so its `_count` counts steps (V1 releases
    # and later v0 ones expose it; absent: None). In V1 a step is observed only when it
    # emits output (async_llm.py: `IterationStats() if (log_stats and num_outputs)`): a
    # chunk of a longer prefill that samples no token does not move it. A wedged engine
    # moves nothing.
    "engine_steps": ("vllm:iteration_tokens_total_count",),
    # vLLM 0.32's. Admission rejections carry no `engine` label: one series per reason.
    "admission_rejections": ("vllm:admission_rejections_total",),
    "estimated_flops": ("vllm:estimated_flops_per_gpu_total",),
    "estimated_read_bytes": ("vllm:estimated_read_bytes_per_gpu_total",),
    "estimated_write_bytes": ("vllm:estimated_write_bytes_per_gpu_total",),
    "external_prefix_cache_queries": ("vllm:external_prefix_cache_queries_total",),
    "external_prefix_cache_hits": ("vllm:external_prefix_cache_hits_total",),
    "prefill_kv_computed_tokens_sum": ("vllm:request_prefill_kv_computed_tokens_sum",),
    "prefill_kv_computed_tokens_count": ("vllm:request_prefill_kv_computed_tokens_count",),
    "mm_cache_queries": ("vllm:mm_cache_queries_total",),
    "mm_cache_hits": ("vllm:mm_cache_hits_total",),
    "corrupted_requests": ("vllm:corrupted_requests_total",),
    "kv_offload_load_bytes": ("vllm:kv_offload_load_bytes_total",),
    "kv_offload_store_bytes": ("vllm:kv_offload_store_bytes_total",),
}
# Counters split by a label: canonical name -> (vLLM name, label, label value).
LABELLED_COUNTERS: dict[str, tuple[str, str, str]] = {
    "prompt_tokens_local_compute": (
        "vllm:prompt_tokens_by_source_total",
        "source",
        "local_compute",
    ),
    "prompt_tokens_local_cache_hit": (
        "vllm:prompt_tokens_by_source_total",
        "source",
        "local_cache_hit",
    ),
    "prompt_tokens_external": (
        "vllm:prompt_tokens_by_source_total",
        "source",
        "external_kv_transfer",
    ),
    **{
        f"requests_finished_{reason}": ("vllm:request_success_total", "finished_reason", reason)
        for reason in ("stop", "length", "abort", "error", "repetition")
    },
    "http_requests_5xx": ("http_requests_total", "status", "5xx"),
    **{
        f"prompt_tokens_cached_{tier}": (
            "vllm:prompt_tokens_cached_by_source_total",
            "source",
            source,
        )
        for tier, source in (
            ("device", "device"),
            ("host", "host"),
            ("p2p", "p2p"),
            ("disk", "disk"),
            ("external", "external_unspecified"),
        )
    },
}
CACHED_TIERS = ("device", "host", "p2p", "disk", "external")
# The offload transfer counters' deprecated spelling (vLLM 0.32 still exports it beside the
# flat names): one family with a direction label, read where the flat name is absent.
OFFLOAD_BYTES_DEPRECATED = "vllm:kv_offload_total_bytes_total"
OFFLOAD_DIRECTIONS = {"kv_offload_load_bytes": "CPU_to_GPU", "kv_offload_store_bytes": "GPU_to_CPU"}
OFFLOAD_USAGE = "vllm:kv_offload_cpu_cache_usage_perc"  # a fraction 0..1 despite the name
SLEEP_STATE = "vllm:engine_sleep_state"
# Its `sleep_state` label: the level each state means (awake = 1 is level 0).
SLEEP_LEVELS = {"weights_offloaded": 1, "discard_all": 2}
LORA_INFO = "vllm:lora_requests_info"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# Its `position` label is bounded by parse.MAX_POSITIONS, as every engine's: a larger one is
# a broken exporter, refused with ScrapeFormatError.

HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds", "vllm:time_in_queue_requests"),
    # samples.LOAD_HISTOGRAMS
    "iteration_tokens": ("vllm:iteration_tokens_total",),
    "prompt_length": ("vllm:request_prompt_tokens",),
    "output_length": ("vllm:request_generation_tokens",),
}
CACHE_CONFIG = "vllm:cache_config_info"
# Families only v0 exposes: they tell v0 apart from the early V1 engine (0.8), which shares
# the `gpu_cache_usage_perc` name with it.
V0_MARKERS = (
    "vllm:num_requests_swapped",
    "vllm:cpu_cache_usage_perc",
    V0_PREFIX_HIT_RATE,
    "vllm:avg_prompt_throughput_toks_per_s",
    "vllm:time_in_queue_requests_count",
)


def _wanted_names() -> frozenset[str]:
    names: set[str] = {
        *KV_USAGE,
        V0_PREFIX_HIT_RATE,
        WAITING_BY_REASON,
        CACHE_CONFIG,
        PROCESS_START,
        OFFLOAD_BYTES_DEPRECATED,
        OFFLOAD_USAGE,
        SLEEP_STATE,
        LORA_INFO,
    }
    names.update(*GAUGES.values(), *COUNTERS.values(), V0_MARKERS)
    names.update(name for name, _, _ in LABELLED_COUNTERS.values())
    names.add(ACCEPTED_PER_POSITION)
    names.update(histogram_names(name for aliases in HISTOGRAMS.values() for name in aliases))
    return frozenset(names)


WANTED = _wanted_names()
# What earlier scrapes decided about each series line (parse.SeriesCache).
_SERIES = SeriesCache()


def canonical_name(name: str) -> str:
    """Map Ray's `vllm_…` spelling to the usual `vllm:…`."""
    return "vllm:" + name[5:] if name[:5] == "vllm_" else name


def parse_vllm(text: str, max_series: int = MAX_SERIES) -> ReplicaSample:
    """Parse and normalize one vLLM /metrics body; raise ScrapeFormatError if it is not one."""
    return normalize_vllm(
        parse_exposition(
            text, WANTED.__contains__, canonical_name, max_series=max_series, cache=_SERIES
        )
    )


def normalize_vllm(parsed: ParsedScrape) -> ReplicaSample:
    usage_name = first_present(parsed, KV_USAGE)
    if usage_name is None:
        raise ScrapeFormatError(
            "no vLLM KV-cache metric (kv_cache_usage_perc or gpu_cache_usage_perc) found; "
            "is this a vLLM /metrics endpoint?"
        )
    usage = _per_engine(parsed.series(usage_name))
    engines = sorted(usage)
    gauges: dict[str, float | None] = {
        "kv_cache_usage": max(usage.values()),
        "kv_cache_usage_mean": sum(usage.values()) / len(usage),
        "requests_waiting_capacity": sum_where(parsed, WAITING_BY_REASON, "capacity", "reason"),
        "prefix_cache_hit_rate_gauge": mean(parsed.series(V0_PREFIX_HIT_RATE)),
        "process_start_time": maximum(parsed.series(PROCESS_START)),
        "sleep_level": _sleep_level(parsed.series(SLEEP_STATE)),
        "kv_offload_usage": maximum(parsed.series(OFFLOAD_USAGE)),
    }
    for field, aliases in GAUGES.items():
        gauges[field] = sum_first(parsed, aliases)
    counters: dict[str, float | None] = {
        field: sum_first(parsed, aliases) for field, aliases in COUNTERS.items()
    }
    for field, (name, label, value) in LABELLED_COUNTERS.items():
        counters[field] = sum_where(parsed, name, value, label)
    for field, direction in OFFLOAD_DIRECTIONS.items():
        if counters[field] is None:
            counters[field] = sum_where(
                parsed, OFFLOAD_BYTES_DEPRECATED, direction, "transfer_type"
            )
    lora = _lora(parsed.series(LORA_INFO))
    gauges["lora_adapters_running"] = None if lora is None else len(lora["running"])
    gauges["lora_adapters_waiting"] = None if lora is None else len(lora["waiting"])
    if counters["http_requests"] is not None and counters["http_requests_5xx"] is None:
        counters["http_requests_5xx"] = 0.0  # the instrumentator adds a status once seen
    unavailable = {}
    if all(counters[f"prompt_tokens_cached_{tier}"] is None for tier in CACHED_TIERS):
        unavailable["prompt_tokens_by_tier"] = (
            "not exposed by this vLLM release (prompt_tokens_cached_by_source arrived in 0.32)"
        )
    if counters["admission_rejections"] is None:
        unavailable["admission_rejections"] = (
            "not exposed by this vLLM release (admission_rejections_total is 0.32's)"
        )
    if gauges["requests_waiting_capacity"] is None:
        unavailable["requests_waiting_capacity"] = (
            "not exposed by this vLLM release (num_requests_waiting_by_reason is newer)"
        )
    return checked(
        ReplicaSample(
            engine=ENGINE.kind,
            unavailable=unavailable,
            generation=detect_generation(parsed),
            engines=len(engines),
            model_names=model_names(parsed, names=(usage_name,)),
            gauges=gauges,
            counters=counters,
            # vLLM's errors have always named a histogram by its `_bucket` family.
            histograms=read_histograms(parsed, HISTOGRAMS, shown=lambda base: f"{base}_bucket"),
            accepted_per_position=by_position(parsed, ACCEPTED_PER_POSITION, "position"),
            cache=_cache_config(parsed.series(CACHE_CONFIG)),
            lora=lora,
        )
    )


def detect_generation(parsed: ParsedScrape) -> str:
    """Name the engine generation from which names the server exposes
    (docs/reference/metrics.md)."""
    new, old = parsed.has(KV_USAGE[0]), parsed.has(KV_USAGE[1])
    if new:
        return "v1-0.10" if old else "v1"
    return "v0" if any(parsed.has(marker) for marker in V0_MARKERS) else "v1-0.8"


def _engine(labels: dict[str, str]) -> str:
    # Releases before the `engine` label have one engine per server.
    return labels.get("engine", "0")


def _per_engine(series: Series) -> dict[str, float]:
    values: dict[str, float] = defaultdict(float)
    for labels, value in series:
        values[_engine(labels)] += value
    return dict(values)


def _sleep_level(series: Series) -> float | None:
    """The deepest sleep level over the engines (0 awake), or None where not exposed."""
    levels: dict[str, float] = {}
    for labels, value in series:
        engine = _engine(labels)
        levels.setdefault(engine, 0.0)
        level = SLEEP_LEVELS.get(labels.get("sleep_state", ""))
        if level is not None and value >= 1:
            levels[engine] = max(levels[engine], float(level))
    return max(levels.values()) if levels else None


def _lora(series: Series) -> LoraAdapters | None:
    """The adapters of `lora_requests_info`'s newest series: its value is the time it was set,
    and the series of earlier label sets stay exported beside it. None without LoRA."""
    if not series:
        return None
    labels, _ = max(series, key=lambda line: line[1])

    def names(label: str) -> list[str]:
        return [name for name in labels.get(label, "").split(",") if name]

    return {
        "running": names("running_lora_adapters"),
        "waiting": names("waiting_lora_adapters"),
        "max_lora": _as_int(labels.get("max_lora")),
    }


def _cache_config(series: Series) -> CacheConfig:
    if not series:
        return CacheConfig()
    labels = series[0][0]
    per_engine_tokens = [
        _as_int(lbl.get("kv_cache_size_tokens"))
        or _product(_as_int(lbl.get("block_size")), _as_int(lbl.get("num_gpu_blocks")))
        for lbl, _ in series
    ]
    known = [tokens for tokens in per_engine_tokens if tokens is not None]
    return CacheConfig(
        block_size=_as_int(labels.get("block_size")),
        num_gpu_blocks=_as_int(labels.get("num_gpu_blocks")),
        cache_dtype=labels.get("cache_dtype"),
        enable_prefix_caching=_as_bool(labels.get("enable_prefix_caching")),
        gpu_memory_utilization=_as_float(labels.get("gpu_memory_utilization")),
        # One series per data-parallel engine, each with its own cache: capacities add up.
        capacity_tokens=sum(known) if len(known) == len(per_engine_tokens) else None,
    )


def _product(a: int | None, b: int | None) -> int | None:
    if a is None or b is None or abs(a * b) > MAX_INT:  # unknown, as a label "1e999" is
        return None
    return a * b


def _as_int(text: str | None) -> int | None:
    number = _as_float(text)
    # A label beyond any integer a sample holds ("1e999") is as unknown as "abc".
    return None if number is None or abs(number) > MAX_INT else int(number)


def _as_float(text: str | None) -> float | None:
    try:
        number = float(text) if text not in (None, "", "None") else None
    except ValueError:
        return None
    return number if number is None or math.isfinite(number) else None  # "nan", "inf"


def _as_bool(text: str | None) -> bool | None:
    return {"true": True, "false": False}.get((text or "").lower())


ENGINE = Engine(
    kind="vllm",
    name="vLLM",
    order=10,
    # Ray's metrics (`vllm_…`) come through a gateway with `:` turned into `_`.
    prefixes=("vllm:", "vllm_"),
    parse=parse_vllm,
)
