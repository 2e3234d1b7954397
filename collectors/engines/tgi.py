"""Normalize a Hugging Face TGI (text-generation-inference) /metrics scrape into the canonical
ReplicaSample that vLLM's normalizer produces.

TGI's router renders its metrics with the Rust `metrics-exporter-prometheus` crate (0.12 up
to TGI 2.1, 0.15 since), which shapes what a scrape looks like:

* counters keep their registered name, without `_total` (`tgi_request_count`);
* every `*duration` distribution, the input/generated/max-new token lengths and the next
  batch size are histograms with TGI's own buckets; `tgi_request_skipped_tokens` is a
  summary since 2.3.0 (its buckets were commented out; a histogram with buckets 0..speculate
  before), whose quantiles cover only the last minute but whose `_sum`/`_count` are
  cumulative;
* a series exists only once it has been recorded (metrics-rs registers on first use, and a
  description alone renders nothing), so an absent queue, batch or token-length series,
  which every TGI since 0.9 records, means nothing was recorded yet: read as 0 here. A TGI
  before 2.3.1 that has not served a request has an empty /metrics.

TGI has no token counters: prompt and generated tokens are derived from the per-request
length histograms' sums. It has no KV-cache occupancy, prefix-cache, preemption or
time-to-first-token metric, and counts no speculative drafts: those quantities are
`unavailable` with the reason. Generations: "tgi-3" (2.3.1 and later, the v3 backend, which
reports its KV capacity as `tgi_batch_max_total_tokens`) and "tgi-2" (0.9 to 2.3.0).
"""

from __future__ import annotations

from collectors.engines.common import (
    Engine,
    blank_numbers,
    histogram_names,
    parse_prefixed,
    read_histograms,
    total,
)
from collectors.parse import MAX_SERIES, ParsedScrape, ScrapeFormatError, Series, as_int, checked
from kneepoint.samples import CacheConfig, ReplicaSample

PREFIX = "tgi_"

# Capacity of the KV pool in tokens, found at warmup (backends/v3/src/lib.rs); TGI 2.3.1+.
MAX_TOTAL_TOKENS = "tgi_batch_max_total_tokens"

GAUGES: dict[str, str] = {
    "requests_running": "tgi_batch_current_size",
    "requests_waiting": "tgi_queue_size",
}

# Canonical counter -> the TGI sample it is read from. Token counters are the sums of the
# per-request length histograms (recorded at validation for prompts, at success for outputs).
COUNTERS: dict[str, str] = {
    "prompt_tokens": "tgi_request_input_length_sum",
    "generation_tokens": "tgi_request_generated_tokens_sum",
    "request_prompt_tokens_sum": "tgi_request_input_length_sum",
    "request_prompt_tokens_count": "tgi_request_input_length_count",
    "request_generation_tokens_sum": "tgi_request_generated_tokens_sum",
    "request_generation_tokens_count": "tgi_request_generated_tokens_count",
}
# Each generation step records tokens produced - 1: the speculated tokens it accepted. Since
# 1.3 only, so absent here is None, not 0.
SKIPPED_TOKENS = "tgi_request_skipped_tokens_sum"

HISTOGRAMS: dict[str, tuple[str, ...]] = {
    # A per-request mean time per output token (TPOT), the closest TGI has to an ITL.
    "itl": ("tgi_request_mean_time_per_token_duration",),
    "e2e": ("tgi_request_duration",),
    "queue": ("tgi_request_queue_duration",),
}

UNAVAILABLE: dict[str, str] = {
    "admission_rejections": "not exposed by TGI: it counts no requests refused at admission",
    "kv_cache_occupancy": (
        "not exposed by TGI: it reports only the token budget its running batch reserves "
        "(tgi_batch_current_max_tokens), not KV-cache occupancy"
    ),
    "requests_waiting_capacity": (
        "not exposed by TGI: its queue (tgi_queue_size) is not split by reason"
    ),
    "preemptions": "not exposed by TGI: it does not preempt requests and has no such metric",
    "prefix_cache_hit_rate": "not exposed by TGI: it reports no prefix-cache queries or hits",
    "prompt_tokens_by_tier": "not exposed by TGI: it reports no cached prompt tokens",
    "ttft": (
        "not exposed by TGI: it has no time-to-first-token metric (its queue and prefill "
        "durations only approximate one)"
    ),
    "spec_decode_acceptance": (
        "not exposed by TGI: it counts the speculated tokens it accepted "
        "(tgi_request_skipped_tokens) but not the drafts, so no acceptance rate"
    ),
}
NO_CAPACITY = (
    "not exposed by TGI before 2.3.1 (tgi_batch_max_total_tokens came with the v3 backend)"
)


def _wanted_names() -> frozenset[str]:
    names = {MAX_TOTAL_TOKENS, SKIPPED_TOKENS, *GAUGES.values(), *COUNTERS.values()}
    names.update(histogram_names(base for bases in HISTOGRAMS.values() for base in bases))
    return frozenset(names)


WANTED = _wanted_names()


def parse_tgi(text: str, max_series: int = MAX_SERIES) -> ReplicaSample:
    """Parse and normalize one TGI /metrics body; raise ScrapeFormatError if it is not one."""
    if not text.strip():
        raise ScrapeFormatError(
            "the response body is empty (a TGI before 2.3.1 shows no series until it has "
            "served a request: it registers each one on first use)"
        )
    missing = "no TGI metric (tgi_*) found; is this a TGI /metrics endpoint?"
    return normalize_tgi(parse_prefixed(text, PREFIX, WANTED, missing, max_series))


def normalize_tgi(parsed: ParsedScrape) -> ReplicaSample:
    generation = detect_generation(parsed)
    # Every canonical key, None where TGI has no such number.
    gauges, counters = blank_numbers()
    # Absent means never recorded (metrics-rs registers a series on first use): zero so far.
    for field, name in GAUGES.items():
        gauges[field] = total(parsed.series(name))
    for field, name in COUNTERS.items():
        counters[field] = total(parsed.series(name))
    skipped = parsed.series(SKIPPED_TOKENS)
    counters["spec_decode_accepted_tokens"] = total(skipped) if skipped else None
    unavailable = dict(UNAVAILABLE)
    capacity = _capacity(parsed.series(MAX_TOTAL_TOKENS))
    if generation == "tgi-2":
        unavailable["kv_cache_capacity_tokens"] = NO_CAPACITY
    return checked(
        ReplicaSample(
            engine=ENGINE.kind,
            generation=generation,
            engines=1,
            model_names=[],  # TGI's metrics carry no model label
            gauges=gauges,
            counters=counters,
            histograms=read_histograms(parsed, HISTOGRAMS, require_inf=True),
            cache=CacheConfig(capacity_tokens=capacity),
            unavailable=unavailable,
        )
    )


def detect_generation(parsed: ParsedScrape) -> str:
    """ "tgi-3" where the v3 backend reports its KV capacity (2.3.1+), else "tgi-2"."""
    return "tgi-3" if parsed.has(MAX_TOTAL_TOKENS) else "tgi-2"


def _capacity(series: Series) -> int | None:
    if not series:
        return None
    return as_int(max(value for _, value in series), MAX_TOTAL_TOKENS)


ENGINE = Engine(
    kind="tgi",
    name="TGI",
    order=40,
    prefixes=(PREFIX,),  # underscores by origin: TGI writes no `tgi:` names
    parse=parse_tgi,
    unavailable=UNAVAILABLE,
)
