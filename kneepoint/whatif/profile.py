"""A calibrated profile: a replica's engine configuration (what its scrapes and flags say)
and the step-time model fitted to it, with how well the fit reproduces what it was fitted to.

`EngineShape` is model-agnostic: the KV cache's blocks and block size, the scheduler's limits
and, only where known, the GPU and model profiles (kneepoint/twin/profiles.py). A tiny CPU
model that has no profile is calibrated and predicted from its measured sweep alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from kneepoint.twin.profiles import GPUS, MODELS, Gpu, Model
from kneepoint.twin.simulated_engine import EngineConfig, StepCost

# A fit whose root-mean-square relative error over the points it was fitted to exceeds this
# is not trusted: the aim for predictions is 20 % on throughput and TTFT, and a model
# that cannot reproduce its own calibration data within that cannot predict other data
# within it either.
TRUST_RMS = 0.20
# …nor is one fitted to fewer points than this (or to a single concurrency): a line through
# two points always fits.
MIN_POINTS = 4


class WhatIfError(ValueError):
    """Bad input to a what-if: one sentence saying what and why (the CLI exits 2 on it)."""


class UntrustedProfile(WhatIfError):
    """The profile's fit is too poor to predict anything."""


@dataclass(frozen=True)
class EngineShape:
    """What the twin needs of a replica's engine, whatever its model.

    `num_gpu_blocks` and `block_size` are vLLM's cache_config_info; `max_num_seqs`,
    `max_model_len` and `max_num_batched_tokens` its scheduler flags. `gpu` and `model` are
    keys of kneepoint/twin/profiles.py where the replica runs a profiled pair (needed only
    for the changes that depend on them: another GPU, gpu_memory_utilization);
    `kv_bytes_per_token` and `gpu_memory_gib` stand in for them otherwise."""

    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_model_len: int = 32768
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"  # "auto" (the model's dtype, 16 bits) or "fp8"
    gpu_memory_utilization: float = 0.9
    num_speculative_tokens: int = 0
    spec_acceptance_rate: float = 0.0
    gpu: str | None = None
    model: str | None = None
    kv_bytes_per_token: float | None = None  # at kv_cache_dtype; from the model if known
    gpu_memory_gib: float | None = None  # from the GPU if known

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 2:
            raise WhatIfError(f"num_gpu_blocks must be at least 2, not {self.num_gpu_blocks}")
        for name in ("block_size", "max_num_seqs", "max_model_len", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise WhatIfError(f"{name} must be positive")
        if self.kv_cache_dtype not in ("auto", "fp8"):
            raise WhatIfError(f"kv_cache_dtype must be auto or fp8, not {self.kv_cache_dtype!r}")
        if self.gpu is not None and self.gpu not in GPUS:
            raise WhatIfError(f"unknown GPU {self.gpu!r}; known: {', '.join(GPUS)}")
        if self.model is not None and self.model not in MODELS:
            raise WhatIfError(f"unknown model {self.model!r}; known: {', '.join(MODELS)}")

    @property
    def capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def bytes_per_token(self) -> float | None:
        """KV bytes per token at this shape's dtype, where known."""
        if self.kv_bytes_per_token is not None:
            return self.kv_bytes_per_token
        if self.model is None:
            return None
        return MODELS[self.model].kv_bytes_per_token(1 if self.kv_cache_dtype == "fp8" else 2)

    def memory_gib(self) -> float | None:
        if self.gpu_memory_gib is not None:
            return self.gpu_memory_gib
        return GPUS[self.gpu].memory_gib if self.gpu is not None else None

    def engine_config(self, cost: StepCost | None) -> EngineConfig:
        """The twin's configuration: the measured block count, the given step cost."""
        gpu = GPUS[self.gpu] if self.gpu else _UNKNOWN_GPU
        model = MODELS[self.model] if self.model else _UNKNOWN_MODEL
        return EngineConfig(
            gpu=gpu,
            model=model,
            fp8_kv_cache=self.kv_cache_dtype == "fp8",
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            enable_prefix_caching=self.enable_prefix_caching,
            num_speculative_tokens=self.num_speculative_tokens,
            spec_acceptance_rate=self.spec_acceptance_rate,
            step_cost=cost,
            num_gpu_blocks_override=self.num_gpu_blocks,
        )

    @classmethod
    def of(
        cls, config: EngineConfig, gpu: str | None = None, model: str | None = None
    ) -> EngineShape:
        """The shape of a twin configuration (its blocks as the profiles give them)."""
        return cls(
            num_gpu_blocks=config.num_gpu_blocks,
            block_size=config.block_size,
            max_num_seqs=config.max_num_seqs,
            max_model_len=config.max_model_len,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enable_prefix_caching=config.enable_prefix_caching,
            kv_cache_dtype="fp8" if config.fp8_kv_cache else "auto",
            gpu_memory_utilization=config.gpu_memory_utilization,
            num_speculative_tokens=config.num_speculative_tokens,
            spec_acceptance_rate=config.spec_acceptance_rate,
            gpu=gpu if gpu is not None else _key(GPUS, config.gpu),
            model=model if model is not None else _key(MODELS, config.model),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineShape:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# Stand-ins for a replica whose GPU or model has no profile: with the block count and the
# step cost given, the twin reads nothing else of them.
_UNKNOWN_GPU = Gpu("unknown", "unknown", 80, 1000, 100, 200, 300, 50)
_UNKNOWN_MODEL = Model("unknown", "unknown", 1e9, 1, 1, 64)


def _key(table: dict[str, Any], value: object) -> str | None:
    return next((key for key, item in table.items() if item == value), None)


@dataclass(frozen=True)
class FitPoint:
    """One measured number the fit was asked to reproduce, and what it gives."""

    source: str  # "sweep" (a knee run's step) or "history" (a production load level)
    load: float  # the concurrency, or the mean requests running at that level
    metric: str  # "throughput", "ttft_mean", "itl_mean"
    measured: float
    fitted: float

    @property
    def relative_error(self) -> float:
        return (self.fitted - self.measured) / self.measured if self.measured else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "relative_error": self.relative_error}


@dataclass(frozen=True)
class FitQuality:
    points: tuple[FitPoint, ...]
    trusted: bool
    reason: str  # why (not) trusted, in a sentence

    @property
    def rms(self) -> float:
        if not self.points:
            return float("inf")
        return float(sum(p.relative_error**2 for p in self.points) / len(self.points)) ** 0.5

    def rms_of(self, metric: str) -> float | None:
        """The RMS relative error of one metric's points (None if none was fitted)."""
        errors = [p.relative_error for p in self.points if p.metric == metric]
        if not errors:
            return None
        return float(sum(e * e for e in errors) / len(errors)) ** 0.5

    def as_dict(self) -> dict[str, Any]:
        return {
            "trusted": self.trusted,
            "reason": self.reason,
            "rms_relative_error": self.rms,
            "threshold": TRUST_RMS,
            "points": [p.as_dict() for p in self.points],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FitQuality:
        points = tuple(
            FitPoint(p["source"], p["load"], p["metric"], p["measured"], p["fitted"])
            for p in data.get("points", [])
        )
        return cls(points, bool(data["trusted"]), str(data.get("reason", "")))


@dataclass(frozen=True)
class Profile:
    """A replica's calibrated twin: its engine shape, fitted step cost and fit quality."""

    replica: str
    shape: EngineShape
    cost: StepCost
    fit: FitQuality
    run_label: str | None = None
    fitted_at: float | None = None
    input_tokens: int | None = None  # the sweep's request shape
    output_tokens: int | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def trusted(self) -> bool:
        return self.fit.trusted

    def require_trusted(self) -> None:
        """Raise UntrustedProfile when the fit is too poor to predict anything."""
        if not self.fit.trusted:
            raise UntrustedProfile(
                f"the calibration of {self.replica} is not trusted ({self.fit.reason}): "
                "it predicts nothing; calibrate again from a cleaner sweep"
            )

    def engine_config(self) -> EngineConfig:
        return self.shape.engine_config(self.cost)

    def as_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "run_label": self.run_label,
            "fitted_at": self.fitted_at,
            "shape": self.shape.as_dict(),
            "cost": cost_dict(self.cost),
            "fit": self.fit.as_dict(),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        return cls(
            replica=data["replica"],
            shape=EngineShape.from_dict(data["shape"]),
            cost=cost_from_dict(data["cost"]),
            fit=FitQuality.from_dict(data["fit"]),
            run_label=data.get("run_label"),
            fitted_at=data.get("fitted_at"),
            input_tokens=data.get("input_tokens"),
            output_tokens=data.get("output_tokens"),
            notes=data.get("notes") or {},
        )


def cost_dict(cost: StepCost) -> dict[str, float]:
    return {f.name: float(getattr(cost, f.name)) for f in fields(StepCost)}


def cost_from_dict(data: dict[str, Any]) -> StepCost:
    known = {f.name for f in fields(StepCost)}
    return StepCost(**{k: float(v) for k, v in data.items() if k in known})
