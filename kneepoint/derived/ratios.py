"""Prefix-cache hit rate, preemption recompute and speculative decoding, from counter
increases over a window (docs/reference/metrics.md: prefix cache, preemption, speculative
decoding)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Share of a preempted request's generated tokens assumed already made when it was
# preempted (docs/reference/metrics.md: f ≈ 0.5, f = 1 the upper bound).
RECOMPUTE_GENERATED_SHARE = 0.5
RECOMPUTE_FORMULA = (
    "Δpreemptions × (mean prompt tokens + 0.5 × mean generated tokens) × (1 − prefix hit rate); "
    "means from the request_prompt_tokens and request_generation_tokens histograms. V1 exports "
    "no counter of re-prefilled tokens, so this is an estimate."
)


def ratio(part: float | None, whole: float | None) -> float | None:
    """part ÷ whole, or None when there is nothing to divide (never 0 for 'no data')."""
    if part is None or whole is None or whole <= 0:
        return None
    return part / whole


def refused_share(refused: float | None, finished: float | None) -> float | None:
    """Load shedding's share of the requests offered: Δrefused ÷ (Δfinished + Δrefused),
    where refused are the requests turned away at admission (HTTP 503, a queue limit
    reached) and finished every request finished for any reason. None where the engine
    does not count refusals, or nothing was offered."""
    if refused is None:
        return None
    return ratio(refused, (finished or 0.0) + refused)


def hit_rate(hits: float | None, queries: float | None) -> float | None:
    """Token-weighted prefix-cache hit rate: Δhits ÷ Δqueries (null with no queries)."""
    return ratio(hits, queries)


@dataclass(frozen=True)
class Recompute:
    tokens: float | None
    is_estimate: bool | None
    share_of_prefill: float | None


def recompute(
    generation: str | None,
    preemptions: float | None,
    prompt_tokens: float | None,
    request_prompt_sum: float | None,
    request_prompt_count: float | None,
    request_generation_sum: float | None,
    request_generation_count: float | None,
    prefix_hit_rate: float | None,
) -> Recompute:
    """Prefill tokens spent again on preempted requests over a window.

    v0 counts every scheduled prefill in prompt_tokens, so the excess over the requests'
    own prompts is exact. V1 counts each prompt once and exports no recompute counter:
    estimate it from the preemptions and the mean request shape."""
    if preemptions is None:
        return Recompute(None, None, None)
    if generation == "v0":
        if prompt_tokens is None or request_prompt_sum is None:
            return Recompute(None, False, None)
        tokens = max(0.0, prompt_tokens - request_prompt_sum)
        return Recompute(tokens, False, ratio(tokens, prompt_tokens))
    mean_prompt = ratio(request_prompt_sum, request_prompt_count)
    mean_generated = ratio(request_generation_sum, request_generation_count)
    if preemptions == 0:
        tokens = 0.0
    elif mean_prompt is None:
        return Recompute(None, True, None)
    else:
        per_preemption = mean_prompt + RECOMPUTE_GENERATED_SHARE * (mean_generated or 0.0)
        tokens = preemptions * per_preemption * (1 - (prefix_hit_rate or 0.0))
    computed_prefill = (prompt_tokens or 0.0) * (1 - (prefix_hit_rate or 0.0))
    return Recompute(tokens, True, ratio(tokens, computed_prefill + tokens))


@dataclass(frozen=True)
class SpecDecode:
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    per_position: list[float] | None
    expected_speedup: float | None
    verdict: str | None


# A drafter whose expected speedup is below 1 is slowing the engine down; up to this it is
# marginal (the extra memory and complexity may not be worth it).
MARGINAL_SPEEDUP = 1.1


def spec_decode(
    drafts: float | None,
    draft_tokens: float | None,
    accepted: float | None,
    accepted_per_position: Sequence[float] | None,
    draft_cost: float = 0.1,
) -> SpecDecode:
    """Acceptance α = Δaccepted ÷ Δdraft tokens; mean length 1 + Δaccepted ÷ Δdrafts;
    expected speedup (1 − α^(γ+1)) ÷ ((1 − α)(1 + cγ)) with γ the positions seen."""
    alpha = ratio(accepted, draft_tokens)
    length = None if ratio(accepted, drafts) is None else 1 + (ratio(accepted, drafts) or 0)
    per_position = (
        [value / drafts for value in accepted_per_position]
        if accepted_per_position and drafts
        else None
    )
    gamma = (
        len(accepted_per_position)
        if accepted_per_position
        else (round(draft_tokens / drafts) if drafts and draft_tokens else None)
    )
    speedup = expected_speedup(alpha, gamma, draft_cost)
    return SpecDecode(alpha, length, per_position, speedup, verdict(speedup))


def expected_speedup(alpha: float | None, gamma: int | None, draft_cost: float) -> float | None:
    if alpha is None or not gamma:
        return None
    tokens = gamma + 1.0 if alpha >= 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (1 + draft_cost * gamma)


def verdict(speedup: float | None) -> str | None:
    if speedup is None:
        return None
    if speedup < 1.0:
        return "slowing down"
    return "marginal" if speedup < MARGINAL_SPEEDUP else "paying off"
