"""True cost per served token: what the GPUs cost over the window, idle time included, over
the tokens actually served in it (docs/reference/metrics.md, cost per token)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kneepoint.config import ApiReference, Pricing

MONTH_SECONDS = 30 * 86400.0


def gpu_hour_price(pricing: Pricing, replica: str, gpu_models: Sequence[str | None]) -> float:
    """USD per hour for a replica: its GPUs priced by DCGM modelName, else its own price."""
    default = pricing.gpu_hour.get("default", 0.0)
    known = [model for model in gpu_models if model]
    if known:
        return sum(pricing.gpu_hour.get(model, default) for model in known)
    return pricing.replica_gpu_hour.get(replica, default)


def hourly_cost(
    pricing: Pricing, replica: str, gpu_models: Sequence[str | None], replicas_in_fleet: int
) -> float:
    """USD per hour for a replica, its share of extra_monthly included."""
    return window_cost(pricing, replica, gpu_models, 3600.0, replicas_in_fleet)


def window_cost(
    pricing: Pricing,
    replica: str,
    gpu_models: Sequence[str | None],
    seconds: float,
    replicas_in_fleet: int,
) -> float:
    """GPU cost of `seconds` for one replica, plus its share of extra_monthly."""
    gpus = gpu_hour_price(pricing, replica, gpu_models) * seconds / 3600.0
    extra = pricing.extra_monthly * seconds / MONTH_SECONDS / max(replicas_in_fleet, 1)
    return gpus + extra


def per_million(cost: float | None, tokens: float | None) -> float | None:
    if cost is None or tokens is None or tokens <= 0:
        return None
    return cost / (tokens / 1e6)


@dataclass(frozen=True)
class Economics:
    """A replica's cost against its knee (docs/explanation/domain.md: economics are a
    utilization number).

    Nominal cost is what a generated token would cost if the replica always ran at its knee
    throughput; utilization is what it served over that; true ÷ nominal is how much idle and
    light load multiply the price. Break-even is the utilization at which the true cost equals
    what a hosted API would charge for the same traffic (its input and output prices applied
    to the window's own mix of prompt and generated tokens): below it the API is cheaper."""

    knee_run: str | None = None
    knee_output_tokens_per_second: float | None = None
    nominal_cost_per_million_generated_tokens: float | None = None
    utilization: float | None = None
    true_over_nominal: float | None = None
    api_cost_per_million_generated_tokens: float | None = None
    break_even_utilization: float | None = None


def economics(
    hourly_cost: float,
    knee_run: str | None,
    knee_output_tokens_per_second: float | None,
    generated_per_second: float | None,
    prompt_per_generated: float | None,
    true_cost_per_million_generated: float | None,
    api: ApiReference,
) -> Economics:
    api_cost = (
        None
        if prompt_per_generated is None
        else prompt_per_generated * api.input_per_mtok + api.output_per_mtok
    )
    if not knee_output_tokens_per_second or knee_output_tokens_per_second <= 0:
        return Economics(api_cost_per_million_generated_tokens=api_cost)
    nominal = hourly_cost / (knee_output_tokens_per_second * 3600.0) * 1e6
    utilization = (
        None
        if generated_per_second is None
        else generated_per_second / knee_output_tokens_per_second
    )
    return Economics(
        knee_run,
        knee_output_tokens_per_second,
        nominal,
        utilization,
        None
        if true_cost_per_million_generated is None or nominal <= 0
        else true_cost_per_million_generated / nominal,
        api_cost,
        None if not api_cost else nominal / api_cost,
    )
