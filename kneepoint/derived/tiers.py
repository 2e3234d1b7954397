"""Prefix-cache hits by tier, the KV connector's own hit rate, prefill actually computed, the
multimodal cache and the KV offload tier, from counter increases over a window
(docs/reference/metrics.md: prefix cache by tier)."""

from __future__ import annotations

from collections.abc import Mapping

from kneepoint.derived.ratios import ratio

# The tiers a cached prompt token can come from, in the order the pages show them: the GPU's
# own prefix cache, the CPU offload tier, another instance (P2P), local disk, and an external
# KV store behind a connector (LMCache, Mooncake, SGLang's HiCache storage backend).
TIERS = ("device", "host", "p2p", "disk", "external")
TIER_COUNTERS = {tier: f"prompt_tokens_cached_{tier}" for tier in TIERS}

Deltas = Mapping[str, float | None]


def tier_shares(deltas: Deltas) -> dict[str, float | None] | None:
    """The share of the window's prompt tokens served from each tier's cache:
    Δprompt_tokens_cached_<tier> ÷ Δprompt_tokens (0..1 each; their sum is the share of
    prompt tokens not computed).

    The denominator is every prompt token (vLLM's prompt_tokens counts cached ones too, as
    SGLang's and TensorRT-LLM's do), not the prefix cache's queries: a share of prompt
    tokens adds up across tiers and reads the same on every engine. None when the engine
    gives no tier counter or no prompt token was counted; a tier the engine does not name
    (SGLang has no p2p or disk) is None beside the others."""
    prompt = deltas.get("prompt_tokens")
    found = {tier: deltas.get(counter) for tier, counter in TIER_COUNTERS.items()}
    if all(value is None for value in found.values()) or prompt is None or prompt <= 0:
        return None
    return {tier: ratio(value, prompt) for tier, value in found.items()}


def external_hit_rate(deltas: Deltas) -> float | None:
    """A KV connector's own hit rate: Δexternal_prefix_cache_hits ÷ Δqueries (tokens); None
    without a connector (no queries in the window)."""
    return ratio(
        deltas.get("external_prefix_cache_hits"), deltas.get("external_prefix_cache_queries")
    )


def prefill_computed_per_request(deltas: Deltas) -> float | None:
    """Mean prompt tokens a request actually computed at its first prefill
    (request_prefill_kv_computed_tokens' Δsum ÷ Δcount): its prompt less the cached part."""
    return ratio(
        deltas.get("prefill_kv_computed_tokens_sum"), deltas.get("prefill_kv_computed_tokens_count")
    )


def mean_prompt_tokens(deltas: Deltas) -> float | None:
    """Mean prompt length of the requests finished in the window (request_prompt_tokens)."""
    return ratio(deltas.get("request_prompt_tokens_sum"), deltas.get("request_prompt_tokens_count"))


def mm_cache_hit_rate(deltas: Deltas) -> float | None:
    """The multimodal (encoder input) cache's hit rate: Δmm_cache_hits ÷ Δmm_cache_queries
    (items); None where no multimodal input was looked up."""
    return ratio(deltas.get("mm_cache_hits"), deltas.get("mm_cache_queries"))
