"""Normalize a TensorRT-LLM `trtllm-serve` Prometheus scrape into the canonical ReplicaSample
that vLLM's normalizer produces.

trtllm-serve serves Prometheus text at `/prometheus/metrics` (only with
`return_perf_metrics: true`); its `/metrics` is JSON iteration stats, which is refused here
with the way out. It runs prometheus_client in multiprocess mode: no `_created` series, and
every gauge carries a `pid` label (summed here; occupancy takes the max). Its names went
through three stages (docs/reference/engines.md, TensorRT-LLM), each a generation here:

* "trtllm-basic": PR #5785 (trtllm-serve 1.0-1.2) exposed five unprefixed request metrics
  (`request_success_total`, the e2e / TTFT / TPOT / queue-time histograms) labelled
  `model_name="undefined"`; Dynamo re-exposed them as `trtllm:…`, later `trtllm_…`.
* "trtllm-kv": PR #11243 (~1.3, 2026-02) made the `trtllm_` prefix native and added the
  `trtllm_kv_cache_utilization` and `trtllm_kv_cache_hit_rate` gauges.
* "trtllm-full": PR #12545 and later (2026-03) added iteration stats (running, waiting, KV
  blocks; with `enable_iter_perf_stats: true`), token counters, phase histograms, prompt-cache
  and speculative-decoding counters.

A series exists only once recorded (labelled prometheus_client metrics), so the stages are
told apart by the names present; what a stage lacks is `unavailable` with the reason, never 0.
"""

from __future__ import annotations

from collectors.engines.common import (
    Engine,
    blank_numbers,
    by_position,
    histogram_names,
    mean,
    model_names,
    read_histograms,
    sum_where,
    total_or_none,
)
from collectors.parse import (
    MAX_SERIES,
    ParsedScrape,
    ScrapeFormatError,
    SeriesCache,
    as_int,
    checked,
    parse_exposition,
)
from kneepoint.samples import CacheConfig, ReplicaSample

PREFIX = "trtllm_"

# PR #5785's names, exposed without a prefix: read as their later `trtllm_` names.
UNPREFIXED = (
    "request_success_total",
    *(
        f"{base}_{part}"
        for base in (
            "e2e_request_latency_seconds",
            "time_to_first_token_seconds",
            "time_per_output_token_seconds",
            "request_queue_time_seconds",
        )
        for part in ("bucket", "sum", "count")
    ),
)

UTILIZATION = "trtllm_kv_cache_utilization"
HIT_RATE = "trtllm_kv_cache_hit_rate"
MAX_BLOCKS = "trtllm_kv_cache_max_blocks"
USED_BLOCKS = "trtllm_kv_cache_used_blocks"
TOKENS_PER_BLOCK = "trtllm_kv_cache_tokens_per_block"
RUNNING = "trtllm_num_requests_running"
WAITING = "trtllm_num_requests_waiting"
PROMPT_TOKENS = "trtllm_prompt_tokens_total"
GENERATION_TOKENS = "trtllm_generation_tokens_total"
CACHED_TOKENS = "trtllm_prompt_cached_tokens_total"
# Cached prompt tokens per KV cache level (PR #12545); its `cache_tier` label names the memory
# backing the level: gpu, host or disk ("pages already prefetched from disk to host count as
# host"). Levels sharing a tier add up.
CACHED_BY_LEVEL = "trtllm_prompt_cache_hit_tokens_total"
CACHE_TIERS = {"gpu": "device", "host": "host", "disk": "disk"}
REUSED_BLOCKS = "trtllm_kv_cache_reused_blocks_total"
MISSED_BLOCKS = "trtllm_kv_cache_missed_blocks_total"
SUCCESS = "trtllm_request_success_total"
DRAFT_TOKENS = "trtllm_spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "trtllm_spec_decode_num_accepted_tokens_total"
DRAFTED_PER_POSITION = "trtllm_spec_decode_drafted_tokens_total"
ACCEPTED_PER_POSITION = "trtllm_spec_decode_accepted_tokens_total"
ACCEPTANCE_LENGTH = "trtllm_spec_decode_acceptance_length"
# Its `token_position` label is bounded by parse.MAX_POSITIONS, as every engine's.

# Iteration stats: published only with `enable_iter_perf_stats: true`.
ITERATION = (UTILIZATION, MAX_BLOCKS, USED_BLOCKS, TOKENS_PER_BLOCK, RUNNING, WAITING)
# Names of the production metrics (PR #12545 and later) that mark "trtllm-full".
FULL_MARKERS = (
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    CACHED_TOKENS,
    REUSED_BLOCKS,
    RUNNING,
    MAX_BLOCKS,
)

HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("trtllm_time_to_first_token_seconds",),
    # A per-request mean time per output token (TPOT), the closest TRT-LLM has to an ITL.
    "itl": ("trtllm_time_per_output_token_seconds",),
    "e2e": ("trtllm_e2e_request_latency_seconds",),
    "queue": ("trtllm_request_queue_time_seconds",),
}
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

JSON_BODY = (
    "this is trtllm-serve's JSON /metrics (iteration stats), not Prometheus text: point "
    "the target at /prometheus/metrics on the same port (served with "
    "return_perf_metrics: true)"
)
ITER_STATS = "needs enable_iter_perf_stats: true in trtllm-serve's config"
BEFORE_FULL = "not exposed by trtllm-serve before PR #12545 (2026-03), which added its"
# Quantities no trtllm-serve exposes.
UNAVAILABLE: dict[str, str] = {
    "admission_rejections": (
        "not exposed by TensorRT-LLM: it counts no requests refused at admission"
    ),
    "preemptions": (
        "not exposed by TensorRT-LLM: it counts no preemptions "
        "(trtllm_num_paused_requests is only a gauge of paused requests)"
    ),
    "requests_waiting_capacity": (
        "not exposed by TensorRT-LLM: its waiting queue is not split by reason"
    ),
}


def canonical_name(name: str) -> str:
    """Dynamo's `trtllm:` and PR #5785's unprefixed names, read as `trtllm_…`."""
    if name[:7] == "trtllm:":
        return PREFIX + name[7:]
    if name in UNPREFIXED:
        return PREFIX + name
    return name


def _wanted_names() -> frozenset[str]:
    names = {
        UTILIZATION,
        HIT_RATE,
        *ITERATION,
        PROMPT_TOKENS,
        GENERATION_TOKENS,
        CACHED_TOKENS,
        CACHED_BY_LEVEL,
        REUSED_BLOCKS,
        MISSED_BLOCKS,
        SUCCESS,
        DRAFT_TOKENS,
        ACCEPTED_TOKENS,
        DRAFTED_PER_POSITION,
        ACCEPTED_PER_POSITION,
        ACCEPTANCE_LENGTH,
    }
    names.update(histogram_names(base for bases in HISTOGRAMS.values() for base in bases))
    return frozenset(names)


WANTED = _wanted_names()
# What earlier scrapes decided about each series line (parse.SeriesCache).
_SERIES = SeriesCache()


def parse_trtllm(text: str, max_series: int = MAX_SERIES) -> ReplicaSample:
    """Parse and normalize one trtllm-serve /prometheus/metrics body; raise ScrapeFormatError
    if it is not one (with the way out when it is the JSON /metrics)."""
    if text.lstrip()[:1] in ("{", "["):
        raise ScrapeFormatError(JSON_BODY)
    if not text.strip():
        raise ScrapeFormatError(
            "the response body is empty (trtllm-serve shows a series only once recorded: "
            "before its first finished request, with no iteration stats, there is none)"
        )
    parsed = parse_exposition(
        text, WANTED.__contains__, canonical_name, max_series=max_series, cache=_SERIES
    )
    if not parsed.samples:
        raise ScrapeFormatError(
            "no TensorRT-LLM metric (trtllm_* or trtllm-serve's request metrics) found; is "
            "this trtllm-serve's /prometheus/metrics?"
        )
    return normalize_trtllm(parsed)


def normalize_trtllm(parsed: ParsedScrape) -> ReplicaSample:
    generation = detect_generation(parsed)
    gauges, counters = blank_numbers()
    usage = _usage(parsed)
    if usage:
        gauges["kv_cache_usage"] = max(usage)
        gauges["kv_cache_usage_mean"] = sum(usage) / len(usage)
    gauges["requests_running"] = total_or_none(parsed.series(RUNNING))
    gauges["requests_waiting"] = total_or_none(parsed.series(WAITING))
    gauges["prefix_cache_hit_rate_gauge"] = mean(parsed.series(HIT_RATE))
    # The engine's own figure from its last iteration, beside the counters.
    gauges["spec_decode_acceptance_length_gauge"] = mean(parsed.series(ACCEPTANCE_LENGTH))
    counters["prompt_tokens"] = total_or_none(parsed.series(PROMPT_TOKENS))
    counters["generation_tokens"] = total_or_none(parsed.series(GENERATION_TOKENS))
    counters["prefix_cache_queries"], counters["prefix_cache_hits"] = _prefix_cache(parsed)
    counters.update(_cached_by_tier(parsed))
    for reason in FINISH_REASONS:
        # The merged code labels it finished_reason; PR #5785's sample shows finish_reason.
        counters[f"requests_finished_{reason}"] = sum_where(
            parsed, SUCCESS, reason, "finished_reason", "finish_reason"
        )
    drafted = by_position(parsed, DRAFTED_PER_POSITION, "token_position")
    accepted = by_position(parsed, ACCEPTED_PER_POSITION, "token_position")
    if drafted is not None and accepted is not None:
        accepted += [0.0] * (len(drafted) - len(accepted))  # counted only once above 0
    counters["spec_decode_draft_tokens"] = total_or_none(parsed.series(DRAFT_TOKENS))
    counters["spec_decode_accepted_tokens"] = total_or_none(parsed.series(ACCEPTED_TOKENS))
    if drafted is not None:
        # Every draft drafts position 0: its count is the number of drafts.
        counters["spec_decode_drafts"] = drafted[0]
        if counters["spec_decode_draft_tokens"] is None:
            counters["spec_decode_draft_tokens"] = sum(drafted)
            counters["spec_decode_accepted_tokens"] = sum(accepted or [])
    return checked(
        ReplicaSample(
            engine=ENGINE.kind,
            generation=generation,
            engines=1,
            # "undefined": hard-coded before PR #12545.
            model_names=model_names(parsed, skip=("", "undefined")),
            gauges=gauges,
            counters=counters,
            histograms=read_histograms(parsed, HISTOGRAMS, require_inf=True),
            accepted_per_position=accepted if drafted is not None else None,
            cache=_cache(parsed),
            unavailable=_unavailable(parsed, generation),
        )
    )


def detect_generation(parsed: ParsedScrape) -> str:
    """Name the stage of trtllm-serve's metrics from the names it exposes (module doc)."""
    if any(parsed.has(name) for name in FULL_MARKERS):
        return "trtllm-full"
    if parsed.has(UTILIZATION) or parsed.has(HIT_RATE):
        return "trtllm-kv"
    return "trtllm-basic"


def _unavailable(parsed: ParsedScrape, generation: str) -> dict[str, str]:
    reasons = dict(UNAVAILABLE)
    if not parsed.has(CACHED_BY_LEVEL):
        reasons["prompt_tokens_by_tier"] = (
            "not exposed by this trtllm-serve: cached prompt tokens per cache level "
            "(prompt_cache_hit_tokens_total) came with PR #12545 (2026-03)"
        )
    has_kv = parsed.has(UTILIZATION) or (parsed.has(USED_BLOCKS) and parsed.has(MAX_BLOCKS))
    if generation == "trtllm-full":
        iteration = f"not published by this trtllm-serve: {ITER_STATS}"
        if not has_kv:
            reasons["kv_cache_occupancy"] = iteration
        if not (parsed.has(MAX_BLOCKS) and parsed.has(TOKENS_PER_BLOCK)):
            reasons["kv_cache_capacity_tokens"] = iteration
        if not parsed.has(RUNNING):
            reasons["requests_running"] = iteration
        if not parsed.has(WAITING):
            reasons["requests_waiting"] = iteration
        return reasons
    if not has_kv:
        reasons["kv_cache_occupancy"] = (
            "not exposed by this trtllm-serve: its KV gauges came with PR #11243 (~1.3) and "
            "are published only with enable_iter_perf_stats: true"
        )
    if not parsed.has(HIT_RATE):
        reasons["prefix_cache_hit_rate"] = (
            "not exposed by this trtllm-serve: its KV-cache hit rate came with PR #11243 "
            "(~1.3) and needs enable_iter_perf_stats: true"
        )
    for quantity in ("kv_cache_capacity_tokens", "requests_running", "requests_waiting"):
        reasons[quantity] = f"{BEFORE_FULL} iteration stats"
    for quantity in ("prompt_tokens", "generation_tokens"):
        reasons[quantity] = f"{BEFORE_FULL} token counters"
    reasons["spec_decode_acceptance"] = f"{BEFORE_FULL} speculative-decoding counters"
    return reasons


def _cached_by_tier(parsed: ParsedScrape) -> dict[str, float | None]:
    """Cached prompt tokens per tier (samples' prompt_tokens_cached_<tier>) from the per-level
    counter; a tier TensorRT-LLM does not have (p2p, external) stays None."""
    series = parsed.series(CACHED_BY_LEVEL)
    if not series:
        return {}
    tiers: dict[str, float | None] = {
        f"prompt_tokens_cached_{tier}": 0.0 for tier in CACHE_TIERS.values()
    }
    for labels, value in series:
        tier = CACHE_TIERS.get(labels.get("cache_tier", ""))
        if tier is not None:
            tiers[f"prompt_tokens_cached_{tier}"] = (
                tiers[f"prompt_tokens_cached_{tier}"] or 0.0
            ) + value
    return tiers


def _usage(parsed: ParsedScrape) -> list[float]:
    """KV occupancy per process: the utilization gauge (used / max blocks), or that ratio
    from the block gauges where only they are present."""
    usage = [value for _, value in parsed.series(UTILIZATION)]
    if usage:
        return usage
    used, blocks = (
        total_or_none(parsed.series(USED_BLOCKS)),
        total_or_none(parsed.series(MAX_BLOCKS)),
    )
    return [used / blocks] if used is not None and blocks else []


def _prefix_cache(parsed: ParsedScrape) -> tuple[float | None, float | None]:
    """(queries, hits): in tokens where the prompt-cache counter exists (queries are all
    prompt tokens, which include the cached ones), else in blocks (reused + missed)."""
    hits = total_or_none(parsed.series(CACHED_TOKENS))
    queries = total_or_none(parsed.series(PROMPT_TOKENS))
    if hits is not None and queries is not None:
        return queries, hits
    reused, missed = (
        total_or_none(parsed.series(REUSED_BLOCKS)),
        total_or_none(parsed.series(MISSED_BLOCKS)),
    )
    if reused is not None and missed is not None:
        return reused + missed, reused
    return None, None


def _cache(parsed: ParsedScrape) -> CacheConfig:
    blocks = total_or_none(parsed.series(MAX_BLOCKS))
    per_block = mean(parsed.series(TOKENS_PER_BLOCK))
    if blocks is None or per_block is None:
        return CacheConfig()
    block_size, num_blocks = as_int(per_block, TOKENS_PER_BLOCK), as_int(blocks, MAX_BLOCKS)
    return CacheConfig(
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        capacity_tokens=as_int(block_size * num_blocks, "the KV capacity in tokens"),
    )


ENGINE = Engine(
    kind="trtllm",
    name="TensorRT-LLM",
    order=50,
    # `trtllm_` since PR #11243; Dynamo re-exposed the older names as `trtllm:`.
    prefixes=(PREFIX, "trtllm:"),
    parse=parse_trtllm,
    unavailable=UNAVAILABLE,
    # trtllm-serve before its prefix (PR #5785, 1.0/1.1): unprefixed names carrying
    # `engine_type="undefined"`; nothing else serves `request_success_total` unprefixed.
    unprefixed=frozenset({"request_success_total", "e2e_request_latency_seconds_count"}),
    json_body=JSON_BODY,
)
