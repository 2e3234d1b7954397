"""The changes a what-if considers, and what each does to a calibrated profile.

Each change becomes a new engine shape and step cost (`apply`) and, for the fleet-level ones
(replicas, routing, traffic growth), a different load (replay.py). Every approximation is
listed in docs/explanation/whatif.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from kneepoint.twin.profiles import GIB, GPUS
from kneepoint.twin.simulated_engine import StepCost
from kneepoint.whatif.profile import EngineShape, Profile, WhatIfError

Routing = Literal["round-robin", "sticky"]
# A drafter added where the replica had none costs this share of a step's fixed part per
# drafted token (the twin's default spec_draft_cost: a small draft model's step).
DRAFT_COST_SHARE = 0.1


@dataclass(frozen=True)
class Change:
    """What to change; None (or the default) leaves it as it is."""

    kv_cache_dtype: Literal["auto", "fp8"] | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    num_gpu_blocks: int | None = None  # vLLM's --num-gpu-blocks-override
    num_speculative_tokens: int | None = None  # 0: no drafter
    spec_acceptance_rate: float | None = None  # with a drafter the replica did not have
    enable_prefix_caching: bool | None = None
    gpu: str | None = None  # another GPU profile (kneepoint/twin/profiles.py)
    replicas: int = 1  # replicas behind the same traffic
    routing: Routing = "sticky"
    growth: float = 1.0  # traffic × growth

    def __post_init__(self) -> None:
        _check(self)

    def as_dict(self) -> dict[str, Any]:
        """Only what changes (the JSON's `change`)."""
        default = Change()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }

    @property
    def empty(self) -> bool:
        return not self.as_dict()


KEYS = tuple(f.name for f in fields(Change))


def _check(change: Change) -> None:
    positive = ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "replicas")
    for name in positive:
        value = getattr(change, name)
        if value is not None and value < 1:
            raise WhatIfError(f"{name} must be at least 1, not {value}")
    if change.num_gpu_blocks is not None and change.num_gpu_blocks < 2:
        raise WhatIfError(f"num_gpu_blocks must be at least 2, not {change.num_gpu_blocks}")
    utilization = change.gpu_memory_utilization
    if utilization is not None and not 0.1 < utilization <= 0.99:
        raise WhatIfError(f"gpu_memory_utilization must be in (0.1, 0.99], not {utilization}")
    spec = change.num_speculative_tokens
    if spec is not None and not 0 <= spec <= 8:
        raise WhatIfError(f"num_speculative_tokens must be 0 to 8, not {spec}")
    rate = change.spec_acceptance_rate
    if rate is not None and not 0.0 <= rate <= 1.0:
        raise WhatIfError(f"spec_acceptance_rate must be in [0, 1], not {rate}")
    if change.gpu is not None and change.gpu not in GPUS:
        raise WhatIfError(f"unknown gpu {change.gpu!r}; known: {', '.join(GPUS)}")
    if change.kv_cache_dtype not in (None, "auto", "fp8"):
        raise WhatIfError(f"kv_cache_dtype must be auto or fp8, not {change.kv_cache_dtype!r}")
    if change.routing not in ("round-robin", "sticky"):
        raise WhatIfError(f"routing must be round-robin or sticky, not {change.routing!r}")
    if not change.growth > 0:
        raise WhatIfError(f"growth must be positive, not {change.growth}")


def parse_changes(settings: Iterable[str] | Mapping[str, object]) -> Change:
    """`["kv_cache_dtype=fp8", "replicas=2"]` (the CLI's --set) or a mapping as a Change.
    Unknown keys and bad values raise WhatIfError naming them."""
    pairs: list[tuple[str, object]] = []
    if isinstance(settings, Mapping):
        pairs = list(settings.items())
    else:
        for text in settings:
            left, sep, right = text.partition("=")
            if not sep or not left.strip():
                raise WhatIfError(f"--set {text!r}: expected KEY=VALUE")
            pairs.append((left.strip(), right.strip()))
    values: dict[str, Any] = {}
    for key, value in pairs:
        name = str(key).replace("-", "_")
        if name not in KEYS:
            raise WhatIfError(f"unknown change {key!r}; known: {', '.join(KEYS)}")
        if name in values:
            raise WhatIfError(f"{key} is set twice")
        values[name] = _value(name, value)
    return Change(**values)


_INTS = {
    "max_num_seqs",
    "max_model_len",
    "max_num_batched_tokens",
    "num_gpu_blocks",
    "num_speculative_tokens",
    "replicas",
}
_FLOATS = {"gpu_memory_utilization", "spec_acceptance_rate", "growth"}


def _value(name: str, value: object) -> Any:
    if not isinstance(value, str):
        return value
    try:
        if name in _INTS:
            return int(value)
        if name in _FLOATS:
            return float(value.removeprefix("x").removeprefix("×"))
    except ValueError:
        kind = "an integer" if name in _INTS else "a number"
        raise WhatIfError(f"{name}={value!r}: expected {kind}") from None
    if name == "enable_prefix_caching":
        lowered = value.lower()
        if lowered in ("true", "on", "1", "yes"):
            return True
        if lowered in ("false", "off", "0", "no"):
            return False
        raise WhatIfError(f"enable_prefix_caching={value!r}: expected true or false")
    if name == "kv_cache_dtype" and value.lower() in ("fp16", "bf16"):
        return "auto"
    return value


def apply(profile: Profile, change: Change) -> tuple[EngineShape, StepCost]:
    """The engine shape and step cost of one replica after `change` (fleet-level changes,
    replicas and growth, leave them as they are)."""
    shape, cost = profile.shape, profile.cost
    blocks = float(shape.num_gpu_blocks)
    # Memory first: another GPU or memory share moves the bytes left for the KV cache.
    if change.gpu is not None and change.gpu != shape.gpu:
        blocks, cost = _other_gpu(shape, cost, change.gpu, blocks)
    if change.gpu_memory_utilization is not None:
        blocks += _blocks_for_bytes(
            shape,
            (change.gpu_memory_utilization - shape.gpu_memory_utilization)
            * _memory_gib(shape, change.gpu)
            * GIB,
            "gpu_memory_utilization",
        )
    dtype = change.kv_cache_dtype or shape.kv_cache_dtype
    if dtype != shape.kv_cache_dtype:
        # The same bytes hold twice (fp8) or half (back to 16 bits) the tokens, and each
        # context token read moves half (or twice) the bytes.
        ratio = 2.0 if dtype == "fp8" else 0.5
        blocks *= ratio
        cost = replace(cost, context_token_seconds=cost.context_token_seconds / ratio)
    if change.num_gpu_blocks is not None:
        blocks = change.num_gpu_blocks
    spec = shape.num_speculative_tokens
    acceptance = change.spec_acceptance_rate or shape.spec_acceptance_rate
    if change.num_speculative_tokens is not None:
        spec = change.num_speculative_tokens
        if spec and not shape.num_speculative_tokens:
            if change.spec_acceptance_rate is None:
                raise WhatIfError(
                    "num_speculative_tokens on a replica without a drafter needs "
                    "spec_acceptance_rate (the drafter's, measured offline)"
                )
            fixed = cost.overhead_seconds + cost.weight_read_seconds
            cost = replace(cost, draft_token_seconds=DRAFT_COST_SHARE * fixed)
    kv_bytes = shape.kv_bytes_per_token  # given (no model profile): follows the dtype
    if kv_bytes is not None and dtype != shape.kv_cache_dtype:
        kv_bytes = kv_bytes / 2 if dtype == "fp8" else kv_bytes * 2
    new_shape = replace(
        shape,
        num_gpu_blocks=max(2, int(blocks)),
        kv_cache_dtype=dtype,
        max_num_seqs=change.max_num_seqs or shape.max_num_seqs,
        max_model_len=change.max_model_len or shape.max_model_len,
        max_num_batched_tokens=change.max_num_batched_tokens or shape.max_num_batched_tokens,
        gpu_memory_utilization=change.gpu_memory_utilization or shape.gpu_memory_utilization,
        num_speculative_tokens=spec,
        spec_acceptance_rate=acceptance if spec else 0.0,
        enable_prefix_caching=(
            shape.enable_prefix_caching
            if change.enable_prefix_caching is None
            else change.enable_prefix_caching
        ),
        gpu=change.gpu or shape.gpu,
        kv_bytes_per_token=kv_bytes,
        gpu_memory_gib=None if change.gpu else shape.gpu_memory_gib,
    )
    return new_shape, cost


def _memory_gib(shape: EngineShape, gpu: str | None) -> float:
    if gpu is not None:
        return GPUS[gpu].memory_gib
    memory = shape.memory_gib()
    if memory is None:
        raise WhatIfError(
            "gpu_memory_utilization needs the replica's GPU memory: its GPU has no profile "
            "(give gpu_memory_gib in the engine shape)"
        )
    return memory


def _blocks_for_bytes(shape: EngineShape, size: float, what: str) -> float:
    per_token = shape.bytes_per_token()
    if per_token is None:
        raise WhatIfError(
            f"{what} needs the KV bytes per token: the replica's model has no profile "
            "(give kv_bytes_per_token in the engine shape)"
        )
    return size / (per_token * shape.block_size)


def _other_gpu(
    shape: EngineShape, cost: StepCost, target: str, blocks: float
) -> tuple[float, StepCost]:
    """Another GPU: terms bound by bandwidth scale by the bandwidth ratio, those bound by
    compute by the FLOPs ratio; the KV cache gains (or loses) the memory difference."""
    if shape.gpu is None:
        raise WhatIfError("gpu needs the replica's own GPU profile to scale from; it has none")
    old, new = GPUS[shape.gpu], GPUS[target]
    # Weights in 16 bits (the profiles' BF16 throughput); the datasheet efficiencies are
    # the same on both GPUs, so they cancel in the ratios.
    compute = old.bf16_tflops / new.bf16_tflops
    memory = old.bandwidth_gbs / new.bandwidth_gbs
    extra = (new.memory_gib - old.memory_gib) * shape.gpu_memory_utilization * GIB
    blocks += _blocks_for_bytes(shape, extra, "gpu")
    if blocks < 2:
        raise WhatIfError(f"the model does not fit on {new.name} with its KV cache")
    return blocks, cost.scaled(memory=memory, compute=compute)
