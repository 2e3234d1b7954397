"""Normalize a llama.cpp server (`llama-server --metrics`) /metrics scrape into the canonical
ReplicaSample.

llama.cpp writes its exposition by hand (tools/server/server-task.cpp `to_metrics()`): names
under the `llamacpp:` prefix, no labels (one series per family, bar the per-position
speculative counter), no histograms. One server is one replica (`engines` 1, no model name).

What each family means, and how it is read (docs/reference/engines.md, llama.cpp server):

* `prompt_tokens_total` counts the prompt tokens the server *computed*: it EXCLUDES the tokens
  reused from its prompt cache (`cache_prompt`, on by default). It is stored as
  `prompt_tokens_local_compute`, never as all prompt tokens. Late-2026 builds (after July
  2026; b11434 has it) add `prompt_tokens_cached_total` (the reused tokens): there, all
  prompt tokens are the sum of the two (derived), the prefix-cache lookups are that sum and
  the hits the cached count. Before that counter, all prompt tokens and the hit rate are
  unavailable with the reason.
* `tokens_predicted_total` (generated tokens) is added when a request finishes, not per token.
* `requests_processing` (busy slots) and `requests_deferred` (tasks waiting for a slot) are
  running and waiting.
* `prompt_tokens_seconds` and `predicted_tokens_seconds` are throughputs over the time since
  the previous read of /metrics: every scrape, by anyone, resets them. They are never read
  here; rates come from the counters' increase.
* `kv_cache_usage_ratio` (used KV cells / context size) and `kv_cache_tokens` exist only in
  builds before PR #13660 (May 2025); later builds have no KV gauge at all, and the context
  size (the KV capacity) is only in /props and /slots, never in /metrics.
* There is no preemption (a request waits for a free slot), no request counter, and no TTFT,
  inter-token or end-to-end histogram (only cumulative prompt and generation seconds).
* Late-2026 builds (PR #26389) add `spec_decode_num_drafts_total`, `…_num_draft_tokens_total`,
  `…_num_accepted_tokens_total` and `…_num_accepted_tokens_per_pos_total{position}` (this one
  only after the first speculative request).
* `n_decode_total` and `n_busy_slots_per_decode` (typed counter in older builds, gauge in
  newer) describe batching and map onto no canonical quantity.

Generations, told by the families present: `kv-gauges` (builds before May 2025, with the KV
gauges), `no-kv-gauges` (May 2025 to mid 2026: no KV gauge, no cached-token counter) and
`cached-tokens` (late-2026 builds with `prompt_tokens_cached_total`).
"""

from __future__ import annotations

from collectors.engines.common import Engine, blank_numbers, by_position, parse_prefixed
from collectors.parse import MAX_SERIES, ParsedScrape, ScrapeFormatError, checked
from kneepoint.samples import CacheConfig, ReplicaSample

P = "llamacpp:"
GENERATIONS = ("kv-gauges", "no-kv-gauges", "cached-tokens")

PROMPT_COMPUTED = P + "prompt_tokens_total"  # excludes cached tokens
PROMPT_CACHED = P + "prompt_tokens_cached_total"  # late-2026 builds
GENERATED = P + "tokens_predicted_total"
RUNNING = P + "requests_processing"
WAITING = P + "requests_deferred"
KV_USAGE = P + "kv_cache_usage_ratio"  # builds before May 2025 (PR #13660)
KV_TOKENS = P + "kv_cache_tokens"  # likewise
SPEC: dict[str, str] = {
    "spec_decode_drafts": P + "spec_decode_num_drafts_total",
    "spec_decode_draft_tokens": P + "spec_decode_num_draft_tokens_total",
    "spec_decode_accepted_tokens": P + "spec_decode_num_accepted_tokens_total",
}
SPEC_PER_POSITION = P + "spec_decode_num_accepted_tokens_per_pos_total"
WANTED = frozenset(
    {
        PROMPT_COMPUTED,
        PROMPT_CACHED,
        GENERATED,
        RUNNING,
        WAITING,
        KV_USAGE,
        KV_TOKENS,
        SPEC_PER_POSITION,
        *SPEC.values(),
    }
)

# Quantities no llama.cpp build exposes.
UNAVAILABLE: dict[str, str] = {
    "admission_rejections": (
        "not exposed by llama.cpp: it counts no requests refused at admission"
    ),
    "kv_cache_capacity_tokens": (
        "not exposed by llama.cpp: its context size (the KV capacity) is only in /props and "
        "/slots, not in /metrics"
    ),
    "requests_waiting_capacity": (
        "not exposed by llama.cpp: its deferred requests (requests_deferred) are not split by "
        "reason"
    ),
    "preemptions": (
        "not exposed by llama.cpp: it does not preempt requests (a request waits for a free "
        "slot) and has no such metric"
    ),
    "ttft": "not exposed by llama.cpp: its /metrics has no time-to-first-token histogram",
    "itl": "not exposed by llama.cpp: its /metrics has no inter-token latency histogram",
    "e2e": "not exposed by llama.cpp: its /metrics has no request latency histogram",
    "prompt_tokens_by_tier": (
        "not exposed by llama.cpp: it has one prompt cache per slot, no tiers, and its "
        "cached-token counter is not split by where the tokens came from"
    ),
}
NO_KV = "not exposed by llama.cpp since its KV gauges were removed (PR #13660, May 2025)"
NO_CACHED_COUNTER = (
    "not exposed by llama.cpp before its late-2026 builds: prompt_tokens_total excludes the "
    "tokens "
    "reused from the prompt cache and no counter of those (prompt_tokens_cached_total) existed; "
    "the computed prompt tokens are kept as prompt_tokens_local_compute"
)
NO_HIT_COUNTER = (
    "not exposed by llama.cpp before its late-2026 builds: no counter of prompt tokens reused "
    "from the cache (prompt_tokens_cached_total)"
)
NO_SPEC = "not exposed by llama.cpp before its late-2026 builds (spec_decode_* counters, PR #26389)"


def parse_llamacpp(text: str, max_series: int = MAX_SERIES) -> ReplicaSample:
    """Parse and normalize one llama.cpp server /metrics body; raise ScrapeFormatError if it
    is not one."""
    if not text.strip():
        raise ScrapeFormatError("the response body is empty")
    missing = (
        "no llama.cpp metric (llamacpp:prompt_tokens_total, llamacpp:requests_processing, "
        "...) found; is this a llama.cpp server's /metrics, started with --metrics?"
    )
    return normalize_llamacpp(parse_prefixed(text, P, WANTED, missing, max_series))


def normalize_llamacpp(parsed: ParsedScrape) -> ReplicaSample:
    generation = detect_generation(parsed)
    # Every canonical key, None where llama.cpp has no such number.
    gauges, counters = blank_numbers()
    gauges["requests_running"] = _value(parsed, RUNNING)
    gauges["requests_waiting"] = _value(parsed, WAITING)
    kv = _value(parsed, KV_USAGE)
    gauges["kv_cache_usage"] = gauges["kv_cache_usage_mean"] = kv

    computed = _value(parsed, PROMPT_COMPUTED)
    cached = _value(parsed, PROMPT_CACHED)
    counters["prompt_tokens_local_compute"] = computed
    counters["prompt_tokens_local_cache_hit"] = cached
    if computed is not None and cached is not None:
        counters["prompt_tokens"] = computed + cached
        counters["prefix_cache_queries"] = computed + cached
        counters["prefix_cache_hits"] = cached
    counters["generation_tokens"] = _value(parsed, GENERATED)
    for field, name in SPEC.items():
        counters[field] = _value(parsed, name)

    unavailable = dict(UNAVAILABLE)
    if kv is None:
        unavailable["kv_cache_occupancy"] = NO_KV
    if cached is None:
        unavailable["prompt_tokens"] = NO_CACHED_COUNTER
        unavailable["prefix_cache_hit_rate"] = NO_HIT_COUNTER
    if not any(parsed.has(name) for name in SPEC.values()):
        unavailable["spec_decode_acceptance"] = NO_SPEC
    return checked(
        ReplicaSample(
            engine=ENGINE.kind,
            generation=generation,
            engines=1,
            model_names=[],  # llama.cpp's metrics carry no labels
            gauges=gauges,
            counters=counters,
            histograms={},
            # Accepted draft tokens by position (absent until the first speculative
            # request); a position of parse.MAX_POSITIONS or more is refused.
            accepted_per_position=by_position(parsed, SPEC_PER_POSITION, "position"),
            cache=CacheConfig(),
            unavailable=unavailable,
        )
    )


def detect_generation(parsed: ParsedScrape) -> str:
    """`kv-gauges` where the KV gauges are present (builds before May 2025),
    `cached-tokens` where the cached-prompt counter is (late-2026 builds), else `no-kv-gauges`."""
    if parsed.has(KV_USAGE) or parsed.has(KV_TOKENS):
        return "kv-gauges"
    if parsed.has(PROMPT_CACHED):
        return "cached-tokens"
    return "no-kv-gauges"


def _value(parsed: ParsedScrape, name: str) -> float | None:
    series = parsed.series(name)
    if not series:
        return None
    if len(series) > 1:
        raise ScrapeFormatError(f"{name} has {len(series)} series; llama.cpp writes one")
    return series[0][1]


ENGINE = Engine(
    kind="llamacpp",
    name="llama.cpp",
    order=30,
    prefixes=("llamacpp:", "llamacpp_"),
    parse=parse_llamacpp,
    unavailable=UNAVAILABLE,
)
