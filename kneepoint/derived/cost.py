"""True cost per served token: what the GPUs cost over the window, idle time included, over
the tokens actually served in it (metrics.md §3, item 5)."""

from __future__ import annotations

from collections.abc import Sequence

from kneepoint.config import Pricing

MONTH_SECONDS = 30 * 86400.0


def gpu_hour_price(pricing: Pricing, replica: str, gpu_models: Sequence[str | None]) -> float:
    """USD per hour for a replica: its GPUs priced by DCGM modelName, else its own price."""
    default = pricing.gpu_hour.get("default", 0.0)
    known = [model for model in gpu_models if model]
    if known:
        return sum(pricing.gpu_hour.get(model, default) for model in known)
    return pricing.replica_gpu_hour.get(replica, default)


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
