"""Normalize an SGLang /metrics scrape (the `name` label of its first metrics PR, 0.4.0 to
0.5.23) into one canonical ReplicaSample.

SGLang has two kinds of series (docs/reference/engines.md, SGLang). The scheduler's (queues,
KV pool, retraction, speculative decoding, queue time) carry rank labels (`tp_rank`, `pp_rank`,
`moe_ep_rank`, `dp_rank` since 0.5.0) and are written by the scheduler of attention-TP rank 0
of each data-parallel rank, or by every TP rank with --enable-metrics-for-all-schedulers, so: one
series per `dp_rank` is kept (the lowest pp/tp/ep rank's; the others repeat it), and those are
added (or for occupancy, the max and mean taken). With priority scheduling the total is the
series with `priority=""` and the per-priority breakdown beside it is dropped. The
tokenizer's series (tokens, TTFT / ITL / E2E) carry no rank and are split by request labels
(`priority`, `is_streaming`, `cache_source`, custom labels): all of them add up.

Every canonical quantity names its SGLang series newest first; the generation is told by the
newest family or label present. A quantity this generation of SGLang does not expose is in
`unavailable` with the reason; one the scrape merely lacks (no request finished yet, no
speculative decoding configured) is None without a reason.
"""

from __future__ import annotations

from collections import defaultdict

from collectors.engines.common import (
    Engine,
    histogram_names,
    model_names,
    read_histograms,
    sum_first,
    total,
)
from collectors.parse import (
    MAX_INT,
    MAX_SERIES,
    ParsedScrape,
    ScrapeFormatError,
    Series,
    SeriesCache,
    as_int,
    checked,
    parse_exposition,
)
from kneepoint.samples import CacheConfig, ReplicaSample

P = "sglang:"

# Scheduler gauges (rank-labelled).
RUNNING = P + "num_running_reqs"
WAITING = P + "num_queue_reqs"
TOKEN_USAGE = P + "token_usage"
CACHE_HIT_RATE = P + "cache_hit_rate"
SPEC_ACCEPT_LENGTH = P + "spec_accept_length"
SPEC_ACCEPT_RATE = P + "spec_accept_rate"
MAX_TOTAL_TOKENS = P + "max_total_num_tokens"
PAGE_SIZE = P + "page_size"
NUM_PAGES = P + "num_pages"
CACHE_CONFIG = P + "cache_config_info"  # 0.5.10 only: labels page_size, num_pages
RETRACTED_TOTAL = P + "num_retracted_requests_total"
RETRACTED_GAUGE = P + "num_retracted_reqs"  # per log interval, reset each interval (0.5.4+)
RETRACTED_GAUGE_OLD = P + "total_retracted_reqs"  # 0.5.0rc0

# Tokenizer counters (request-labelled).
COUNTERS: dict[str, tuple[str, ...]] = {
    "prompt_tokens": (P + "prompt_tokens_total",),
    "generation_tokens": (P + "generation_tokens_total",),
    "request_prompt_tokens_sum": (P + "prompt_tokens_histogram_sum",),
    "request_prompt_tokens_count": (P + "prompt_tokens_histogram_count",),
    "request_generation_tokens_sum": (P + "generation_tokens_histogram_sum",),
    "request_generation_tokens_count": (P + "generation_tokens_histogram_count",),
}
CACHED_TOKENS = P + "cached_tokens_total"
# Its `cache_source` label (0.5.10+, "Number of cached prompt tokens by source
# (device/host/storage)"): the tier of HiCache, SGLang's hierarchical cache, that supplied the
# tokens: device (the GPU radix cache), host (HiCache's L2 in CPU memory) and storage (its L3
# storage backend: a file store, Mooncake, 3FS, NIXL... outside the engine's memory, the role
# a KV connector's store plays for vLLM, so: external). "total" (no per-tier details given)
# names no tier. Counted per token, incremented per finished request, like vLLM's.
CACHE_SOURCES = {"device": "device", "host": "host", "storage": "external"}
TIERS = ("device", "host", "p2p", "disk", "external")

HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": (P + "time_to_first_token_seconds",),
    # ≤0.4.3: a running mean per token since the first, observed at each streamed chunk.
    "itl": (P + "inter_token_latency_seconds", P + "time_per_output_token_seconds"),
    "e2e": (P + "e2e_request_latency_seconds",),
    "queue": (P + "queue_time_seconds",),  # scheduler-side (rank-labelled), 0.5.4+
}

# Quantities no SGLang release exposes.
UNAVAILABLE: dict[str, str] = {
    "requests_waiting_capacity": "not exposed by SGLang: its waiting queue "
    "(num_queue_reqs) is not split by reason",
    "admission_rejections": "not exposed by SGLang: it counts no requests refused at admission",
}

# Families and labels that name a generation, newest first: the first one present decides.
GENERATION_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "0.5.23",
        (
            P + "request_time_per_output_token_seconds_count",
            P + "prefill_effective_tokens_total",
            P + "max_total_num_tokens_swa",
            P + "startup_time_seconds",
        ),
    ),
    (
        "0.5.16",
        (
            PAGE_SIZE,
            NUM_PAGES,
            P + "kv_used_tokens",
            P + "kv_available_tokens",
            P + "spec_verify_calls_total",
            P + "context_len",
        ),
    ),
    ("0.5.10", (RETRACTED_TOTAL, CACHE_CONFIG, P + "realtime_tokens_total")),
)
RANKS = ("pp_rank", "tp_rank", "moe_ep_rank")
# Generations before max_total_num_tokens and the retraction counter (0.5.10).
OLD = ("pre-0.4", "0.4.0", "0.4.6", "0.5.0")


def _wanted() -> frozenset[str]:
    names = {
        RUNNING,
        WAITING,
        TOKEN_USAGE,
        CACHE_HIT_RATE,
        SPEC_ACCEPT_LENGTH,
        SPEC_ACCEPT_RATE,
        MAX_TOTAL_TOKENS,
        PAGE_SIZE,
        NUM_PAGES,
        CACHE_CONFIG,
        RETRACTED_TOTAL,
        RETRACTED_GAUGE,
        RETRACTED_GAUGE_OLD,
        CACHED_TOKENS,
        P + "num_used_tokens",
        P + "gen_throughput",
    }
    for aliases in COUNTERS.values():
        names.update(aliases)
    names.update(histogram_names(name for aliases in HISTOGRAMS.values() for name in aliases))
    for _, markers in GENERATION_MARKERS:
        names.update(markers)
    return frozenset(names)


WANTED = _wanted()
# What earlier scrapes decided about each series line (parse.SeriesCache).
_SERIES = SeriesCache()


def canonical_name(name: str) -> str:
    """Map a gateway's `sglang_…` spelling (SGLang's model gateway rewrites `:`) to `sglang:…`."""
    return P + name[7:] if name[:7] == "sglang_" else name


def parse_sglang(text: str, max_series: int = MAX_SERIES) -> ReplicaSample:
    """Parse and normalize one SGLang /metrics body; raise ScrapeFormatError if it is not one."""
    return normalize_sglang(
        parse_exposition(
            text, WANTED.__contains__, canonical_name, max_series=max_series, cache=_SERIES
        )
    )


def normalize_sglang(parsed: ParsedScrape) -> ReplicaSample:
    if not parsed.samples:
        raise ScrapeFormatError(
            "no SGLang metric (sglang:num_running_reqs, sglang:token_usage, "
            "sglang:prompt_tokens_total, ...) found; is this an SGLang /metrics endpoint "
            "started with --enable-metrics?"
        )
    generation = detect_generation(parsed)
    usage = _per_dp(parsed, TOKEN_USAGE)
    gauges: dict[str, float | None] = {
        "kv_cache_usage": max(usage.values()) if usage else None,
        "kv_cache_usage_mean": sum(usage.values()) / len(usage) if usage else None,
        "requests_running": _scheduler_sum(parsed, RUNNING),
        "requests_waiting": _scheduler_sum(parsed, WAITING),
        "requests_waiting_capacity": None,
        "requests_swapped": None,
        "prefix_cache_hit_rate_gauge": _scheduler_mean(parsed, CACHE_HIT_RATE),
        # Last-interval gauges, 0 when no speculative step ran in the interval (or none is
        # configured): absent then, never a zero.
        "spec_decode_acceptance_length_gauge": _positive(
            _scheduler_mean(parsed, SPEC_ACCEPT_LENGTH)
        ),
        "spec_decode_acceptance_rate_gauge": None,
    }
    if gauges["spec_decode_acceptance_length_gauge"] is not None:
        gauges["spec_decode_acceptance_rate_gauge"] = _scheduler_mean(parsed, SPEC_ACCEPT_RATE)
    counters: dict[str, float | None] = {
        field: sum_first(parsed, aliases) for field, aliases in COUNTERS.items()
    }
    counters["preemptions"] = _scheduler_sum(parsed, RETRACTED_TOTAL)
    has_cached_family = generation not in ("pre-0.4", "0.4.0")
    if parsed.has(CACHED_TOKENS) or (has_cached_family and counters["prompt_tokens"] is not None):
        # Prompt tokens include cached ones (unlike llama.cpp), so they are the lookups and
        # cached_tokens_total the hits. The counter is only incremented when a request had
        # cached tokens, so before the first hit it is absent: no hit yet, i.e. 0.
        counters["prefix_cache_queries"] = counters["prompt_tokens"]
        counters["prefix_cache_hits"] = _sum(parsed.series(CACHED_TOKENS))
    counters.update(_cached_by_tier(parsed, generation))
    return checked(
        ReplicaSample(
            engine=ENGINE.kind,
            generation=generation,
            engines=max(1, len(usage) or len(_per_dp(parsed, RUNNING))),
            # The first metrics PR (pre-0.4) labelled the model `name`.
            model_names=model_names(parsed, ("model_name", "name"), skip=("",)),
            gauges=gauges,
            counters=counters,
            # Scheduler-side histograms (queue time) carry ranks: one rank's each.
            histograms=read_histograms(parsed, HISTOGRAMS, select=_scheduler),
            cache=_cache(parsed),
            unavailable=_unavailable(parsed, generation),
        )
    )


def detect_generation(parsed: ParsedScrape) -> str:
    """The SGLang generation whose names and labels the scrape shows: `pre-0.4` (label
    `name`, sglang PR #1853), `0.4.0` (label `model_name` only, time_per_output_token),
    `0.4.6` (label `engine_type`, inter_token_latency), `0.5.0` (rank labels), `0.5.10`
    (max_total_num_tokens, the retraction counter, label moe_ep_rank), `0.5.16` (page_size,
    num_pages, KV token gauges, spec_verify_calls_total), `0.5.23` (is_streaming, per-request
    TPOT). Each means "the names of that release and the ones after it up to the next
    generation"."""
    labels = {key for series in parsed.samples.values() for lbl, _ in series for key in lbl}
    if "name" in labels and "model_name" not in labels:
        return "pre-0.4"  # its configuration gauges (context_len…) came back much later
    for generation, markers in GENERATION_MARKERS:
        if any(parsed.has(marker) for marker in markers):
            return generation
    if "is_streaming" in labels:
        return "0.5.23"
    if (parsed.has(MAX_TOTAL_TOKENS) and "name" not in labels) or "moe_ep_rank" in labels:
        return "0.5.10"
    if "tp_rank" in labels or parsed.has(RETRACTED_GAUGE) or parsed.has(RETRACTED_GAUGE_OLD):
        return "0.5.0"
    if (
        "engine_type" in labels
        or parsed.has(P + "inter_token_latency_seconds_count")
        or parsed.has(CACHED_TOKENS)
    ):
        return "0.4.6"
    return "0.4.0"


def _tiers_known(parsed: ParsedScrape, generation: str) -> bool:
    """Whether the scrape says which tier cached tokens came from: SGLang 0.5.10 and later,
    when a named tier's series is present, or no cached_tokens_total series at all (a tier's
    series appears at its first hit, so none yet means nothing cached from any tier). A scrape
    with only cache_source="total" names no tier."""
    if generation in OLD:
        return False
    series = parsed.series(CACHED_TOKENS)
    return not series or any(labels.get("cache_source") in CACHE_SOURCES for labels, _ in series)


def _cached_by_tier(parsed: ParsedScrape, generation: str) -> dict[str, float | None]:
    """Cached prompt tokens per tier (samples' prompt_tokens_cached_<tier>) where the scrape
    says the tiers (`_tiers_known`): a tier without its series yet is 0 beside the others;
    SGLang has no p2p or disk tier (None)."""
    if not _tiers_known(parsed, generation):
        return {}
    tiers: dict[str, float | None] = dict.fromkeys(
        (f"prompt_tokens_cached_{tier}" for tier in TIERS), None
    )
    for named in CACHE_SOURCES.values():
        tiers[f"prompt_tokens_cached_{named}"] = 0.0
    for labels, value in parsed.series(CACHED_TOKENS):
        source = CACHE_SOURCES.get(labels.get("cache_source", ""))
        if source is not None:
            key = f"prompt_tokens_cached_{source}"
            tiers[key] = (tiers[key] or 0.0) + value
    return tiers


def _unavailable(parsed: ParsedScrape, generation: str) -> dict[str, str]:
    out = dict(UNAVAILABLE)
    if not _tiers_known(parsed, generation):
        out["prompt_tokens_by_tier"] = (
            "not exposed by SGLang before 0.5.10, nor where it counts cached tokens only as "
            "cache_source=total (its hierarchical cache's tiers are device, host and storage)"
        )
    if not parsed.has(RETRACTED_TOTAL) and generation in OLD:
        out["preemptions"] = (
            "not exposed by SGLang before 0.5.10: retractions were only a per-interval "
            "gauge (num_retracted_reqs), which a scrape cannot add up"
            if generation == "0.5.0"
            else "not exposed by SGLang before 0.5.10 (no retraction counter)"
        )
    if _cache(parsed).capacity_tokens is None and generation in OLD:
        out["kv_cache_capacity_tokens"] = (
            "not exposed by SGLang before 0.5.10 (max_total_num_tokens arrived then)"
        )
    return out


# --- series selection --------------------------------------------------------------------


def _rank(labels: dict[str, str]) -> tuple[int, ...]:
    return tuple(_as_int(labels.get(name)) for name in RANKS)


def _group(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The series' identity beside its TP/PP/EP rank (dp_rank stays: ranks add up)."""
    return tuple(
        sorted((k, v) for k, v in labels.items() if k not in RANKS and k not in ("pid", "le"))
    )


def _scheduler(series: Series) -> Series:
    """One scheduler's series per data-parallel rank: priority totals only, and of TP/PP/EP
    ranks writing the same gauges, the lowest. Series without rank labels (the tokenizer's,
    or a scheduler's before 0.5.0) pass unchanged: their priority label is the request's."""
    totals = [
        (lbl, v) for lbl, v in series if "tp_rank" not in lbl or lbl.get("priority", "") == ""
    ]
    lowest: dict[tuple[tuple[str, str], ...], tuple[int, ...]] = {}
    for labels, _ in totals:
        key, rank = _group(labels), _rank(labels)
        if key not in lowest or rank < lowest[key]:
            lowest[key] = rank
    return [(lbl, v) for lbl, v in totals if _rank(lbl) == lowest[_group(lbl)]]


def _per_dp(parsed: ParsedScrape, name: str) -> dict[str, float]:
    values: dict[str, float] = defaultdict(float)
    for labels, value in _scheduler(parsed.series(name)):
        values[labels.get("dp_rank", "")] += value
    return dict(values)


def _scheduler_sum(parsed: ParsedScrape, name: str) -> float | None:
    chosen = _scheduler(parsed.series(name))
    return _sum(chosen) if chosen else None


def _scheduler_mean(parsed: ParsedScrape, name: str) -> float | None:
    chosen = _scheduler(parsed.series(name))
    return _sum(chosen) / len(chosen) if chosen else None


def _sum(series: Series) -> float:
    return float(total(series))


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


def _cache(parsed: ParsedScrape) -> CacheConfig:
    """KV capacity in tokens: max_total_num_tokens (0.5.10+; also PR #1853's format), else
    num_pages × page_size (0.5.16+, or cache_config_info's labels in 0.5.10). One pool per
    data-parallel rank: capacities add up."""
    capacity = _per_dp(parsed, MAX_TOTAL_TOKENS)
    pages, page_size = _per_dp(parsed, NUM_PAGES), _per_dp(parsed, PAGE_SIZE)
    info = parsed.series(CACHE_CONFIG)
    size = next(iter(page_size.values()), None)
    if size is None and info:
        size = _as_int(info[0][0].get("page_size")) or None
    total_pages = sum(pages.values()) if pages else None
    if total_pages is None and info:
        total_pages = sum(_as_int(lbl.get("num_pages")) for lbl, _ in info) or None
    tokens = sum(capacity.values()) if capacity else None
    if tokens is None and size is not None and total_pages is not None:
        tokens = size * total_pages
    return CacheConfig(
        block_size=None if size is None else as_int(size, PAGE_SIZE),
        num_gpu_blocks=None if total_pages is None else as_int(total_pages, NUM_PAGES),
        capacity_tokens=None if tokens is None else as_int(tokens, "the KV capacity in tokens"),
    )


def _as_int(text: str | None) -> int:
    """A rank or cache label as an integer; 0 where it is none ("", "abc", "nan", "1e999")."""
    try:
        number = float(text) if text not in (None, "") else 0.0
    except ValueError:
        return 0
    return int(number) if abs(number) <= MAX_INT else 0  # NaN fails the comparison


ENGINE = Engine(
    kind="sglang",
    name="SGLang",
    order=20,
    # SGLang's model gateway turns `:` into `_`.
    prefixes=("sglang:", "sglang_"),
    parse=parse_sglang,
    unavailable=UNAVAILABLE,
)
