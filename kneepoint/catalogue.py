"""The catalogue of numbers: every number kneepoint derives, declared once.

Each `Number` says what it is called, its unit, which way is worse, what it means in one
line, the canonical engine quantity it comes from (and so how each engine gives it), the page
that explains it, the built-in rule (and runbook section) that watches it, its Prometheus
expression, and its place in the weekly review. The tables the rest of kneepoint reads are
projections of `NUMBERS`, never written out a second time:

* `kneepoint.samples.QUANTITIES` = `quantities()`: which numbers a quantity an engine lacks
  makes unavailable;
* `alerts.rules.METRICS` = `rule_metrics()`: what a rule can watch, with its description;
* `alerts.export.EXPRESSIONS` = `expressions()`: the PromQL of `kneepoint alerts export`;
* `alerts.outbox.PAGES` = `pages()`: the page an alert message links to;
* `review.weekly.ROWS`, `REPLICA_KEYS`, `VIEW_KEYS` = `weekly_rows()`, `weekly_keys(...)`;
* `review.effects.METRICS` = `effect_metrics()`: how a what-if prediction is read;
* the rule and runbook section (`kneepoint.runbooks.RUNBOOKS`) of a number: `rules()`;
* an alert's unit on the pages (`app.format.metric_unit`): `rule_unit()`, and tooltips
  (`help_text()`).

tests/test_catalogue.py holds every projection equal to the table it replaced and shows that
a number added here appears in each of them.

Adding a derived number
-----------------------
1. One `Number(...)` in `NUMBERS` below: its name, unit, direction, description, and what
   applies of quantity, page, rule, promql, weekly / weekly_source, effect. Rules can watch
   it (`alertable=True`), exports, alert links, `kneepoint status`'s unavailable handling
   and the weekly review pick it up from here.
2. One pure function that computes it (kneepoint/derived/, from the stored window), called
   where the record it belongs to is built (`weekly_source` says which: the status's
   replica, or the page view's rows), plus `alerts/values.py` when a rule can watch it.
3. Its tests: the function's, against hand-computed values.

A number read from a quantity the engines do not give yet needs a `Quantity` too, with how
each engine gives it (`Source`), and the normalizers' `unavailable` where one cannot.

No other module keeps a table of numbers with what they mean; the records that carry the
values (the status, the page view, alerts/values.py) use these names as their keys.

Units: "%" for a share 0..1 (shown as a percentage), "points" for a difference of two
shares, "s", "/s" for events per second, "tok/s", "×", "$" (USD), "J", "h", "kWh",
"tokens", "B/s" (bytes per second), and "" for a count or a verdict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

How = Literal["exact", "derived", "estimated", "engine's own", "unavailable"]
Direction = Literal["higher is worse", "higher is better", "neither"]
Record = Literal["status", "view"]  # what the weekly review copies a number from


@dataclass(frozen=True)
class Source:
    """How one engine gives a quantity (docs/reference/engines.md, the normalizers in collectors/).

    `how` is its newest generation's, `note` what differs in older ones; `varies` says some
    generation or configuration cannot give it. An engine's normalizer marks the quantity
    unavailable (with its reason, in words) in every scrape where `how` is "unavailable" and
    not `varies`, in none where `how` is another and not `varies`, and in some where it
    `varies` (tests/test_catalogue.py holds this against every capture in tests/fixtures)."""

    how: How
    note: str = ""
    varies: bool = False


@dataclass(frozen=True)
class Quantity:
    """A canonical quantity of a replica sample (the keys of ReplicaSample.unavailable)."""

    name: str
    sources: Mapping[str, Source] = field(hash=False)


@dataclass(frozen=True)
class WeeklyRow:
    """A number's row in the weekly review: its place from the top, label, what it means."""

    place: int
    label: str
    meaning: str


@dataclass(frozen=True)
class Effect:
    """A number a what-if prediction is read by (review/effects.py): its place, its label."""

    place: int
    label: str


@dataclass(frozen=True)
class Number:
    """One number of kneepoint, everything the rest of the code says about it."""

    name: str
    unit: str
    direction: Direction
    description: str  # one line: the rules table's text, and the number's help
    help: str | None = None  # the pages' tooltip where it says more than `description`
    quantity: str | None = None  # the canonical quantity it is computed from (engines)
    alertable: bool = False  # a rule can watch it (alerts/values.py computes it)
    page: str | None = None  # the page that explains it (an alert message's link)
    rule: str | None = None  # the built-in rule on it, also its runbook section
    promql: str | None = None  # over the engines' own series; None: no faithful form
    weekly: WeeklyRow | None = None  # its row in the weekly review
    weekly_source: Record | None = None  # the record the review reads it from
    effect: Effect | None = None  # a what-if prediction is read by it
    # How each engine gives it where that differs from its quantity's (an estimate on top).
    sources: Mapping[str, Source] | None = field(default=None, hash=False)


# --- how each engine gives each quantity (docs/reference/engines.md, collectors/) ----

EXACT = Source("exact")
UNAVAILABLE = Source("unavailable")
TRTLLM_ITERATION_STATS = Source(
    "exact",
    "unavailable without enable_iter_perf_stats: true, and before PR #12545 (2026-03)",
    varies=True,
)
TRTLLM_TOKEN_COUNTERS = Source(
    "exact", "unavailable before PR #12545 (2026-03), which added the token counters", True
)

QUANTITIES: tuple[Quantity, ...] = (
    Quantity(
        "kv_cache_occupancy",
        {
            "vllm": Source("exact", "kv_cache_usage_perc (gpu_cache_usage_perc before 0.10)"),
            "sglang": Source("exact", "token_usage"),
            "llamacpp": Source(
                "unavailable",
                "exact kv_cache_usage_ratio in builds before PR #13660 (May 2025) and forks "
                "that kept it",
                varies=True,
            ),
            "tgi": Source("unavailable", "only the token budget its running batch reserves"),
            "trtllm": Source(
                "exact",
                "trtllm_kv_cache_utilization; unavailable without enable_iter_perf_stats: "
                "true, and before PR #11243 (~1.3)",
                varies=True,
            ),
        },
    ),
    Quantity(
        "kv_cache_capacity_tokens",
        {
            "vllm": Source("exact", "kv_cache_size_tokens, else blocks × block size (derived)"),
            "sglang": Source("exact", "max_total_num_tokens; unavailable before 0.5.10", True),
            "llamacpp": Source("unavailable", "the context size is not in /metrics"),
            "tgi": Source("exact", "tgi_batch_max_total_tokens; unavailable before 2.3.1", True),
            "trtllm": Source(
                "derived",
                "kv_cache_max_blocks × kv_cache_tokens_per_block; unavailable without "
                "enable_iter_perf_stats: true, and before PR #12545 (2026-03)",
                varies=True,
            ),
        },
    ),
    Quantity(
        "requests_running",
        {
            "vllm": EXACT,
            "sglang": EXACT,
            "llamacpp": Source("exact", "requests_processing (busy slots)"),
            "tgi": EXACT,
            "trtllm": TRTLLM_ITERATION_STATS,
        },
    ),
    Quantity(
        "requests_waiting",
        {
            "vllm": EXACT,
            "sglang": EXACT,
            "llamacpp": Source("exact", "requests_deferred (tasks waiting for a slot)"),
            "tgi": EXACT,
            "trtllm": TRTLLM_ITERATION_STATS,
        },
    ),
    Quantity(
        "requests_waiting_capacity",
        {
            "vllm": Source(
                "exact", "num_requests_waiting_by_reason; unavailable before 0.10", True
            ),
            "sglang": Source("unavailable", "the waiting queue is not split by reason"),
            "llamacpp": Source("unavailable", "deferred requests are not split by reason"),
            "tgi": Source("unavailable", "the queue is not split by reason"),
            "trtllm": Source("unavailable", "the waiting queue is not split by reason"),
        },
    ),
    Quantity(
        "preemptions",
        {
            "vllm": EXACT,
            "sglang": Source(
                "exact", "num_retracted_requests_total; unavailable before 0.5.10", True
            ),
            "llamacpp": Source("unavailable", "llama.cpp does not preempt"),
            "tgi": Source("unavailable", "TGI does not preempt"),
            "trtllm": Source("unavailable", "no preemption counter"),
        },
    ),
    Quantity(
        "prefix_cache_hit_rate",
        {
            "vllm": Source("exact", "hits ÷ queries; the engine's own gauge on v0"),
            "sglang": Source(
                "derived", "cached ÷ prompt tokens; the engine's own cache_hit_rate on 0.4.0"
            ),
            "llamacpp": Source(
                "derived",
                "cached ÷ (computed + cached) prompt tokens; unavailable before the cached "
                "counter (late 2026)",
                varies=True,
            ),
            "tgi": Source("unavailable", "no prefix-cache metric"),
            "trtllm": Source(
                "derived",
                "cached ÷ prompt tokens; the engine's own block hit rate before PR #12545, "
                "unavailable without it",
                varies=True,
            ),
        },
    ),
    Quantity(
        "prompt_tokens",
        {
            "vllm": EXACT,
            "sglang": EXACT,
            "llamacpp": Source(
                "derived",
                "computed + cached prompt tokens; unavailable before the cached counter "
                "(late 2026)",
                varies=True,
            ),
            "tgi": Source("derived", "tgi_request_input_length_sum"),
            "trtllm": TRTLLM_TOKEN_COUNTERS,
        },
    ),
    Quantity(
        "generation_tokens",
        {
            "vllm": EXACT,
            "sglang": EXACT,
            "llamacpp": Source("exact", "tokens_predicted_total"),
            "tgi": Source("derived", "tgi_request_generated_tokens_sum"),
            "trtllm": TRTLLM_TOKEN_COUNTERS,
        },
    ),
    Quantity(
        "ttft",
        {
            "vllm": EXACT,
            "sglang": EXACT,
            "llamacpp": Source("unavailable", "no histograms"),
            "tgi": Source("unavailable", "queue and prefill durations only approximate it"),
            "trtllm": EXACT,
        },
    ),
    Quantity(
        "itl",
        {
            "vllm": Source(
                "exact", "inter_token_latency_seconds; time_per_output_token_seconds before 0.10"
            ),
            "sglang": Source("exact", "derived from time_per_output_token_seconds on 0.4.0"),
            "llamacpp": Source("unavailable", "no histograms"),
            "tgi": Source("derived", "a per-request mean time per token (TPOT)"),
            "trtllm": Source("derived", "a per-request time per output token (TPOT)"),
        },
    ),
    Quantity(
        "e2e",
        {
            "vllm": EXACT,
            "sglang": EXACT,
            "llamacpp": Source("unavailable", "no histograms"),
            "tgi": EXACT,
            "trtllm": EXACT,
        },
    ),
    Quantity(
        "admission_rejections",
        {
            "vllm": Source(
                "exact",
                "admission_rejections_total (all reasons), vLLM 0.32 and later; unavailable before",
                varies=True,
            ),
            "sglang": UNAVAILABLE,
            "llamacpp": UNAVAILABLE,
            "tgi": UNAVAILABLE,
            "trtllm": UNAVAILABLE,
        },
    ),
    Quantity(
        "spec_decode_acceptance",
        {
            "vllm": EXACT,
            "sglang": Source("engine's own", "spec_accept_length / spec_accept_rate gauges"),
            "llamacpp": Source(
                "exact", "spec_decode_* counters; unavailable before PR #26389", True
            ),
            "tgi": Source("unavailable", "accepted tokens are counted, drafts are not"),
            "trtllm": Source(
                "exact", "unavailable before PR #12545 (2026-03), which added the counters", True
            ),
        },
    ),
    # Prefix-cache hits by tier (issue 27): cached prompt tokens by the tier that supplied them.
    Quantity(
        "prompt_tokens_by_tier",
        {
            "vllm": Source(
                "exact",
                "prompt_tokens_cached_by_source{device,host,p2p,disk,external_unspecified}; "
                "unavailable before 0.32",
                varies=True,
            ),
            "sglang": Source(
                "exact",
                "cached_tokens_total{cache_source=device,host,storage} (storage as external); "
                "unavailable before 0.5.10 and until a request is served from a named tier",
                varies=True,
            ),
            "llamacpp": Source("unavailable", "one prompt cache per slot, no tiers"),
            "tgi": Source("unavailable", "no cached-token metric"),
            "trtllm": Source(
                "exact",
                "prompt_cache_hit_tokens_total{cache_tier=gpu,host,disk}; unavailable before "
                "PR #12545 (2026-03)",
                varies=True,
            ),
        },
    ),
)

QUANTITY = {quantity.name: quantity for quantity in QUANTITIES}


def estimated(sources: Mapping[str, Source], note: str) -> dict[str, Source]:
    """The sources of a number estimated from a quantity: estimated wherever it is given."""
    return {
        engine: source if source.how == "unavailable" else Source("estimated", note, True)
        for engine, source in sources.items()
    }


# Preempted work recomputed: exact on vLLM v0 (its prompt counter counts re-prefills), an
# estimate everywhere else from the preemptions and the mean request (docs/reference/metrics.md).
RECOMPUTE = estimated(
    QUANTITY["preemptions"].sources,
    "Δpreemptions × (mean prompt + ½ mean generated tokens); exact on vLLM v0",
)


# --- Prometheus expressions (alerts/export.py) -------------------------------------------


def _rate(counter: str, window: str = "5m") -> str:
    return f"sum by (instance) (rate({counter}[{window}]))"


def _ratio(part: str, whole: str, window: str = "5m") -> str:
    return f"{_rate(part, window)} / {_rate(whole, window)}"


def _p99(*histograms: str) -> str:
    rates = " or ".join(f"rate({h}_bucket[5m])" for h in histograms)
    return f"histogram_quantile(0.99, sum by (instance, le) ({rates}))"


HITS, QUERIES_TOTAL = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


# --- the numbers ---------------------------------------------------------------------------

WORSE: Direction = "higher is worse"
BETTER: Direction = "higher is better"
NEITHER: Direction = "neither"

NUMBERS: tuple[Number, ...] = (
    Number(
        "kv_cache_occupancy",
        "%",
        WORSE,
        "KV-cache occupancy, latest scrape, max over engines (0..1)",
        quantity="kv_cache_occupancy",
        alertable=True,
        page="capacity",
        rule="kv-cache-saturated",
        promql="max by (instance) (vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc)",
    ),
    Number(
        "kv_cache_occupancy_mean",
        "%",
        WORSE,
        "KV-cache occupancy, latest scrape, mean over engines (0..1)",
        quantity="kv_cache_occupancy",
    ),
    Number(
        "kv_cache_capacity_tokens",
        "tokens",
        BETTER,
        "tokens the KV cache holds, summed over engines",
        quantity="kv_cache_capacity_tokens",
    ),
    Number(
        "requests_running",
        "",
        NEITHER,
        "sequences running, latest scrape",
        quantity="requests_running",
    ),
    Number(
        "requests_waiting",
        "",
        WORSE,
        "sequences waiting, latest scrape",
        quantity="requests_waiting",
        alertable=True,
        page="capacity",
        promql="sum by (instance) (vllm:num_requests_waiting)",
    ),
    Number(
        "requests_waiting_capacity",
        "",
        WORSE,
        "sequences waiting for KV capacity, latest scrape",
        quantity="requests_waiting_capacity",
        alertable=True,
        page="capacity",
        rule="waiting-for-kv-capacity",
        promql='sum by (instance) (vllm:num_requests_waiting_by_reason{reason="capacity"})',
    ),
    Number(
        "preemptions",
        "",
        WORSE,
        "sequences evicted and recomputed over the window",
        quantity="preemptions",
        weekly=WeeklyRow(5, "Preemptions", "sequences evicted and recomputed"),
        weekly_source="status",
        effect=Effect(1, "preemptions"),
    ),
    Number(
        "preemptions_per_second",
        "/s",
        WORSE,
        "preemptions per second over the window",
        quantity="preemptions",
        alertable=True,
        page="capacity",
        rule="preemptions-sustained",
        promql=_rate("vllm:num_preemptions_total"),
    ),
    # --- load shedding (helper G, issue 27) ---
    Number(
        "requests_refused_per_second",
        "/s",
        WORSE,
        "requests refused at admission (HTTP 503, a queue limit reached) per second over "
        "the window",
        quantity="admission_rejections",
        alertable=True,
        page="overview",
        rule="requests-refused",
        promql=_rate("vllm:admission_rejections_total"),
    ),
    Number(
        "requests_refused_share",
        "%",
        WORSE,
        "refused ÷ (finished + refused) requests over the window: load shedding's share",
        help="Requests refused at admission (HTTP 503: max_num_queued_reqs or "
        "max_num_queued_tokens reached) over every request offered: finished for any "
        "reason plus refused. The availability SLO counts them as failed.",
        quantity="admission_rejections",
        page="overview",
    ),
    # --- end load shedding ---
    Number(
        "preemption_recompute_tokens",
        "tokens",
        WORSE,
        "prefill tokens spent again on preempted sequences over the window",
        quantity="preemptions",
        sources=RECOMPUTE,
    ),
    Number(
        "recompute_share_of_prefill",
        "%",
        WORSE,
        "recomputed prefill tokens ÷ all prefill work (0..1)",
        quantity="preemptions",
        alertable=True,
        page="capacity",
        rule="recompute-share-high",
        weekly=WeeklyRow(6, "Recompute share", "prefill work redone after eviction"),
        weekly_source="view",
        sources=RECOMPUTE,
    ),
    Number(
        "prefix_cache_hit_rate",
        "%",
        BETTER,
        "prefix-cache hits ÷ queries over the window (0..1)",
        help="Δprefix_cache_hits ÷ Δprefix_cache_queries over the window.",
        quantity="prefix_cache_hit_rate",
        alertable=True,
        page="prefix-cache",
        rule="prefix-hit-rate-low",
        promql=_ratio(HITS, QUERIES_TOTAL),
        weekly=WeeklyRow(7, "Prefix hit rate", "prompt tokens served from cache"),
        weekly_source="status",
    ),
    Number(
        "prefix_cache_hit_rate_drop",
        "points",
        WORSE,
        "the last hour's hit rate minus the window's (points, 0..1)",
        quantity="prefix_cache_hit_rate",
        alertable=True,
        page="prefix-cache",
        rule="prefix-hit-rate-dropped",
        promql=f"({_ratio(HITS, QUERIES_TOTAL, '1h')}) - ({_ratio(HITS, QUERIES_TOTAL)})",
    ),
    # --- prefix cache by tier, KV offload, prefill computed, multimodal cache, corrupted
    # requests, LoRA (issue 27; kneepoint/derived/tiers.py) ---
    Number(
        "prefix_cache_tier_shares",
        "%",
        BETTER,
        "share of prompt tokens served from each cache tier over the window: device, host, "
        "p2p, disk, external (0..1 each)",
        help="Δcached prompt tokens of the tier ÷ Δprompt tokens over the window: device = the "
        "GPU's prefix cache, host = the CPU offload tier, p2p = another instance, disk, "
        "external = a KV connector's store (LMCache, SGLang's HiCache storage).",
        quantity="prompt_tokens_by_tier",
    ),
    Number(
        "external_prefix_cache_hit_rate",
        "%",
        BETTER,
        "a KV connector's own hit rate: external hits ÷ queries over the window (0..1)",
        help="Δexternal_prefix_cache_hits ÷ Δexternal_prefix_cache_queries (tokens); no data "
        "without a KV connector (no queries).",
    ),
    Number(
        "kv_offload_usage",
        "%",
        WORSE,
        "the CPU offload tier's occupancy, latest scrape, max over engines (0..1)",
    ),
    Number(
        "kv_offload_load_bytes_per_second",
        "B/s",
        NEITHER,
        "KV bytes loaded from the offload tier into the GPU per second over the window",
    ),
    Number(
        "kv_offload_store_bytes_per_second",
        "B/s",
        NEITHER,
        "KV bytes stored from the GPU into the offload tier per second over the window",
    ),
    Number(
        "prefill_computed_tokens_per_request",
        "tokens",
        NEITHER,
        "mean prompt tokens a request computed at its first prefill (its prompt less the "
        "cached part) over the window",
    ),
    Number(
        "mean_prompt_tokens",
        "tokens",
        NEITHER,
        "mean prompt length of the requests finished in the window",
    ),
    Number(
        "mm_cache_hit_rate",
        "%",
        BETTER,
        "multimodal input cache hits ÷ queries over the window (0..1)",
    ),
    Number(
        "corrupted_requests",
        "",
        WORSE,
        "requests whose output was corrupted (NaN logits) over the window",
    ),
    Number(
        "lora_adapters",
        "",
        NEITHER,
        "LoRA adapters running and waiting, latest scrape, and the engine's max_lora",
    ),
    Number(
        "prompt_tokens_per_second",
        "tok/s",
        NEITHER,
        "prompt tokens per second over the window",
        quantity="prompt_tokens",
    ),
    Number(
        "generation_tokens_per_second",
        "tok/s",
        NEITHER,
        "generated tokens per second over the window",
        quantity="generation_tokens",
        weekly=WeeklyRow(8, "Throughput", "generated tokens per second"),
        weekly_source="status",
        effect=Effect(2, "throughput"),
    ),
    Number(
        "spec_expected_speedup",
        "×",
        BETTER,
        "expected speculative-decoding speedup (×)",
        quantity="spec_decode_acceptance",
        help="(1 − α^(γ+1)) ÷ ((1 − α)(1 + cγ)), γ = positions seen, c = 0.1 draft cost. "
        "Below 1 the drafter slows the engine down.",
        alertable=True,
        page="spec-decode",
        rule="spec-decode-slowing",
        weekly_source="view",
    ),
    Number(
        "spec_decode_acceptance_rate",
        "%",
        BETTER,
        "accepted ÷ drafted tokens (0..1)",
        help="Δaccepted tokens ÷ Δdrafted tokens over the window.",
        quantity="spec_decode_acceptance",
        alertable=True,
        page="spec-decode",
        rule="spec-decode-acceptance-low",
        promql=_ratio(
            "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:spec_decode_num_draft_tokens_total",
        ),
    ),
    Number(
        "spec_decode_mean_acceptance_length",
        "tokens",
        BETTER,
        "1 + Δaccepted ÷ Δdrafts: tokens emitted per verification step.",
        quantity="spec_decode_acceptance",
    ),
    Number(
        "spec_decode_per_position_acceptance",
        "%",
        BETTER,
        "accepted ÷ drafts at each draft position (0..1 each)",
        quantity="spec_decode_acceptance",
    ),
    Number(
        "gpu_utilization",
        "%",
        BETTER,
        "GPU graphics-engine activity, mean over the replica's GPUs (0..1)",
        alertable=True,
        page="gpus",
        rule="gpu-idle",
        promql="avg by (Hostname) (DCGM_FI_PROF_GR_ENGINE_ACTIVE or DCGM_FI_DEV_GPU_UTIL / 100)",
    ),
    # Model FLOPs and memory-bandwidth utilization (kneepoint/derived/flops.py).
    Number(
        "mfu",
        "%",
        BETTER,
        "model FLOPs utilization: the FLOPs vLLM estimates its GPUs did ÷ their dense peak "
        "at the compute dtype, over the window (0..1)",
        help="Δestimated_flops ÷ (Δt × engines × the GPU's dense peak FLOP/s at compute_dtype). "
        "vLLM's estimate from the tokens it scheduled (recompute after preemption included); "
        "needs --enable-mfu-metrics (vLLM 0.32+) and a GPU peak (gpu_peaks).",
    ),
    Number(
        "mbu",
        "%",
        BETTER,
        "memory-bandwidth utilization: the bytes vLLM estimates its GPUs read and wrote ÷ "
        "their peak memory bandwidth, over the window (0..1)",
        help="Δ(estimated_read_bytes + estimated_write_bytes) ÷ (Δt × engines × the GPU's "
        "peak bandwidth). vLLM's estimate from the tokens it scheduled; needs "
        "--enable-mfu-metrics (vLLM 0.32+) and a GPU peak (gpu_peaks).",
    ),
    Number(
        "cost_per_million_tokens",
        "$",
        WORSE,
        "true cost per 1M served tokens (USD)",
        alertable=True,
        page="cost",
        rule="cost-over-budget",
        weekly=WeeklyRow(15, "True $/1M tokens", "GPU cost ÷ tokens served"),
        weekly_source="status",
        effect=Effect(5, "$/1M tokens"),
    ),
    Number(
        "cost_per_million_generated_tokens",
        "$",
        WORSE,
        "GPU cost over the window ÷ generated tokens, per million (USD)",
        weekly_source="status",
    ),
    Number(
        "ttft_seconds",
        "s",
        WORSE,
        "time to first token over the window: p50, p90 and p99 (s)",
        quantity="ttft",
    ),
    Number(
        "ttft_p99_seconds",
        "s",
        WORSE,
        "p99 time to first token over the window (s)",
        quantity="ttft",
        alertable=True,
        page="knee",  # latency against concurrency, and where the knee is
        promql=_p99("vllm:time_to_first_token_seconds"),
        effect=Effect(3, "TTFT p99"),
    ),
    Number(
        "itl_seconds",
        "s",
        WORSE,
        "inter-token latency over the window: p50, p90 and p99 (s)",
        quantity="itl",
    ),
    Number(
        "itl_p99_seconds",
        "s",
        WORSE,
        "p99 inter-token latency over the window (s)",
        quantity="itl",
        alertable=True,
        page="knee",
        promql=_p99("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    ),
    Number(
        "e2e_seconds",
        "s",
        WORSE,
        "request latency, end to end, over the window: p50, p90 and p99 (s)",
        quantity="e2e",
    ),
    Number(
        "up",
        "",
        BETTER,
        "1 if the last scrape succeeded, 0 if it failed (no data once the target is stale)",
        alertable=True,
        page="health",  # the collector's own state: jobs, scrape errors
        rule="target-down",
        promql='up{job=~".*vllm.*"}',
    ),
    Number(
        "engine_stalled",
        "",
        WORSE,
        "1 while requests run or wait and no prompt or generation token and "
        "no engine step is counted between scrapes (kneepoint.derived.stall), 0 otherwise",
        alertable=True,
        page="overview",  # the replica's tile says stalled, its charts show the work
        rule="engine-stalled",
    ),
    # --- saturation from every side (kneepoint/derived/saturation.py) ---
    Number(
        "replica_saturated",
        "",
        WORSE,
        "1 when the replica's saturation verdict over the window says saturated (KV full, "
        "queue growing, token budget full, TTFT rising with load, or load shed), 0 when not",
        help="Saturated for any of five reasons, each with its evidence: KV occupancy above "
        "90 % for a quarter of the window, a standing or growing queue, most engine steps at "
        "the per-step token budget, TTFT rising with load, requests refused at admission "
        "(docs/explanation/saturation.md)",
        alertable=True,
        page="overview",  # the replica table's Saturated column names the reasons
        rule="replica-saturated",
        weekly=WeeklyRow(19, "Saturated", "the week's saturation verdict and its reasons"),
    ),
    Number(
        "saturated_replicas",
        "",
        WORSE,
        "replicas whose saturation verdict over the window says saturated",
    ),
    Number(
        "xid_errors",
        "",
        WORSE,
        "GPUs of the replica reporting an XID error",
        alertable=True,
        page="gpus",
        rule="gpu-xid-error",
        promql="count by (Hostname) (DCGM_FI_DEV_XID_ERRORS > 0)",
    ),
    Number(
        "stale_targets",
        "",
        WORSE,
        "targets (fleet) not scraped for over 2 scrape intervals plus a grace",
        alertable=True,
        page="health",  # the collector's own state: jobs, scrape errors
        rule="collector-stale",
    ),
    Number(
        "alert_pipeline_problems",
        "",
        WORSE,
        "fleet: alerts or deliver job failing or overdue, plus one if "
        "a notification was refused for good in the last hour",
        alertable=True,
        page="alerts",  # channel health and the delivery log
        rule="alert-pipeline-failing",
    ),
    # The page view's numbers (kneepoint/views.py) the weekly review reads.
    Number(
        "peak_kv_occupancy",
        "%",
        WORSE,
        "highest KV-cache occupancy in the window (0..1)",
        weekly=WeeklyRow(1, "Peak KV occupancy", "highest KV-cache use seen"),
        weekly_source="view",
    ),
    Number(
        "p95_kv_occupancy",
        "%",
        WORSE,
        "95th percentile of the window's KV-occupancy chart points (0..1)",
        weekly=WeeklyRow(2, "p95 KV occupancy", "95th percentile of the chart's points"),
    ),
    Number(
        "kv_cache_occupancy_p95",
        "%",
        WORSE,
        "time-weighted 95th percentile of KV-cache occupancy over the what-if's week "
        "(measured, baseline, predicted; 0..1)",
        effect=Effect(4, "p95 KV occupancy"),
    ),
    Number(
        "time_saturated",
        "%",
        WORSE,
        "share of the window with KV occupancy above the saturation line (0..1)",
        weekly=WeeklyRow(3, "Time KV full", "share of time with KV above 90 %"),
        weekly_source="view",
    ),
    Number(
        "queue_p99_seconds",
        "s",
        WORSE,
        "p99 time waiting before first scheduled over the window (s)",
        weekly=WeeklyRow(4, "Waiting time p99", "queue time before a slot, p99"),
    ),
    Number(
        "peak_running",
        "",
        NEITHER,
        "most sequences running at once in the window",
        weekly=WeeklyRow(9, "Peak concurrency", "most sequences running at once"),
        weekly_source="view",
    ),
    Number(
        "peak_waiting",
        "",
        WORSE,
        "most sequences waiting at once in the window",
        weekly_source="view",
    ),
    Number(
        "knee_concurrency",
        "",
        BETTER,
        "the replica's knee: concurrency where more load stops paying",
        weekly=WeeklyRow(10, "Knee", "concurrency where more load stops paying"),
    ),
    Number(
        "headroom",
        "",
        BETTER,
        "the knee's concurrency minus the window's peak concurrency",
        weekly=WeeklyRow(11, "Headroom to knee", "knee − peak concurrency"),
    ),
    Number(
        "spec_verdict",
        "",
        NEITHER,
        "speculative decoding: paying off, marginal or slowing down",
        weekly=WeeklyRow(12, "Speculative decoding", "paying off, marginal or slowing down"),
        weekly_source="view",
    ),
    Number(
        "utilization",
        "%",
        NEITHER,
        "generated tokens/s ÷ the knee's (load against the knee, not GPU busy)",
        weekly=WeeklyRow(13, "Load vs knee", "generated tokens/s ÷ the knee's; not GPU busy"),
        weekly_source="view",
    ),
    Number(
        "idle_gpu_hours",
        "h",
        WORSE,
        "GPU time not busy in the window (DCGM graphics activity)",
        weekly=WeeklyRow(14, "Idle GPU-hours", "GPU time not busy (DCGM graphics activity)"),
        weekly_source="view",
    ),
    Number(
        "nominal_cost_per_million_generated_tokens",
        "$",
        WORSE,
        "GPU cost per 1M generated tokens at the knee's throughput (USD)",
        weekly=WeeklyRow(16, "Nominal $/1M generated", "at the knee"),
        weekly_source="view",
    ),
    Number(
        "break_even_utilization",
        "%",
        WORSE,
        "load against the knee below which a hosted API is cheaper (above 1: always)",
        weekly=WeeklyRow(17, "Break-even vs API", "load vs knee below which API is cheaper"),
        weekly_source="view",
    ),
    Number(
        "joules_per_million_tokens",
        "J",
        WORSE,
        "GPU energy ÷ tokens served, per million",
        weekly=WeeklyRow(18, "Energy / 1M tokens", "GPU energy ÷ tokens served"),
        weekly_source="view",
    ),
    Number(
        "energy_kwh",
        "kWh",
        WORSE,
        "GPU energy used in the window",
        weekly_source="view",
    ),
)

NUMBER = {number.name: number for number in NUMBERS}
NUMBER_NAMES = frozenset(NUMBER)


# --- the tables the rest of kneepoint reads: projections of NUMBERS ------------------------


def sources(number: Number) -> Mapping[str, Source]:
    """How each engine gives `number` (empty: it is not read from an engine's series)."""
    if number.sources is not None:
        return number.sources
    return QUANTITY[number.quantity].sources if number.quantity else {}


def quantities(
    numbers: Iterable[Number] = NUMBERS, declared: Iterable[Quantity] = QUANTITIES
) -> dict[str, tuple[str, ...]]:
    """Each canonical quantity and the numbers it makes unavailable when an engine lacks it."""
    numbers = tuple(numbers)
    return {
        quantity.name: tuple(n.name for n in numbers if n.quantity == quantity.name)
        for quantity in declared
    }


def rule_metrics(numbers: Iterable[Number] = NUMBERS) -> dict[str, str]:
    """Every metric a rule can watch, with its description."""
    return {n.name: n.description for n in numbers if n.alertable}


def expressions(numbers: Iterable[Number] = NUMBERS) -> dict[str, str]:
    """A rule metric's PromQL over the raw series, per replica, where it has a faithful one."""
    return {n.name: n.promql for n in numbers if n.alertable and n.promql is not None}


def pages(numbers: Iterable[Number] = NUMBERS) -> dict[str, str]:
    """The page that explains each rule metric."""
    return {n.name: n.page for n in numbers if n.page is not None}


def rules(numbers: Iterable[Number] = NUMBERS) -> dict[str, str]:
    """Each number watched by a built-in rule: the rule's name (its runbook's section)."""
    return {n.name: n.rule for n in numbers if n.rule is not None}


def weekly_rows(numbers: Iterable[Number] = NUMBERS) -> tuple[tuple[str, str, str, str], ...]:
    """The weekly review's rows, top to bottom: key, label, unit, what it means."""
    placed = sorted((n.weekly.place, n.name, n.weekly, n.unit) for n in numbers if n.weekly)
    return tuple((name, row.label, unit, row.meaning) for _, name, row, unit in placed)


def weekly_keys(source: Record, numbers: Iterable[Number] = NUMBERS) -> tuple[str, ...]:
    """The numbers the weekly review copies from one record (the status's replica, or the
    page view's rows)."""
    return tuple(n.name for n in numbers if n.weekly_source == source)


def effect_metrics(numbers: Iterable[Number] = NUMBERS) -> tuple[tuple[str, str, str], ...]:
    """The numbers a what-if prediction is read by, in order: key, label, unit."""
    placed = sorted((n.effect.place, n.name, n.effect, n.unit) for n in numbers if n.effect)
    return tuple((name, effect.label, unit) for _, name, effect, unit in placed)


def rule_unit(metric: str) -> str:
    """The unit a rule's metric reads in ("" for a count, and for what no rule can watch)."""
    number = NUMBER.get(metric)
    return number.unit if number is not None and number.alertable else ""


def help_text(name: str) -> str:
    """A number's tooltip on the pages: its help, else its description."""
    number = NUMBER[name]
    return number.help or number.description


# --- an SLO's burn rate: the one rule metric that is not a number of NUMBERS ---------------

# Each SLO's burn-rate rules watch `slo_burn:<slo>:<long window>` (alerts/slo.py burn_rules),
# one metric per SLO and burn window, so no fixed entry in NUMBERS can declare them.
BURN_PREFIX = "slo_burn:"


def burn_metric(slo: str, window: str) -> str:
    """The metric an SLO's burn-rate rule watches: "chat:ttft", "1h" → "slo_burn:chat:ttft:1h"."""
    return f"{BURN_PREFIX}{slo}:{window}"


def burn_slo(metric: str) -> str | None:
    """The SLO a burn-rate metric is on (burn_metric's `slo`; an SLO's name may hold ":"),
    or None for any other metric."""
    if not metric.startswith(BURN_PREFIX):
        return None
    return metric[len(BURN_PREFIX) :].rsplit(":", 1)[0]


def burn_window(metric: str) -> str | None:
    """The long window a burn-rate metric is over, as written ("1h"; burn_metric's `window`),
    or None for any other metric."""
    if not metric.startswith(BURN_PREFIX):
        return None
    return metric.rsplit(":", 1)[-1]
