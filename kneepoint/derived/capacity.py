"""The KV-cache capacity planner: how many agents fit, and what each knob buys.

bytes per token = 2 (K and V) × layers × KV heads × head dim × dtype bytes; a sequence of
C tokens needs C × that; the cache holds (GPUs × memory × gpu_memory_utilization − weights)
÷ bytes per token tokens, so C-token sequences fit that many ÷ C times
(docs/explanation/domain.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

GIB = 1024**3
DTYPE_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "auto": 2.0, "fp8": 1.0}


@dataclass(frozen=True)
class Plan:
    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype: str = "fp16"
    context_tokens: int = 131072
    kv_memory_gib: float | None = None  # the cache itself, if known
    gpu_memory_gib: float | None = None  # else: per GPU …
    weights_gib: float = 0.0  # … minus the weights (all GPUs together) …
    gpu_memory_utilization: float = 0.9  # … of the share vLLM may take
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        if self.kv_dtype not in DTYPE_BYTES:
            raise ValueError(f"kv dtype {self.kv_dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
        if (
            min(
                self.layers, self.kv_heads, self.head_dim, self.context_tokens, self.tensor_parallel
            )
            < 1
        ):
            raise ValueError("layers, KV heads, head dim, context and GPUs must be positive")
        if self.kv_memory_gib is None and self.gpu_memory_gib is None:
            raise ValueError("give the KV memory, or the GPU memory and the weights")

    @property
    def bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[self.kv_dtype]

    @property
    def cache_gib(self) -> float:
        if self.kv_memory_gib is not None:
            return self.kv_memory_gib
        total = (self.gpu_memory_gib or 0.0) * self.tensor_parallel * self.gpu_memory_utilization
        return max(0.0, total - self.weights_gib)

    def result(self) -> dict[str, Any]:
        kv_tokens = self.cache_gib * GIB / self.bytes_per_token
        return {
            "bytes_per_token": self.bytes_per_token,
            "sequence_gib": self.context_tokens * self.bytes_per_token / GIB,
            "kv_cache_gib": self.cache_gib,
            "kv_tokens": int(kv_tokens),
            "max_sequences": kv_tokens / self.context_tokens,
            "context_tokens": self.context_tokens,
            "kv_dtype": self.kv_dtype,
            "tensor_parallel": self.tensor_parallel,
        }


def what_ifs(plan: Plan) -> dict[str, dict[str, Any]]:
    """The same plan with one knob turned at a time (the tuning playbook of
    docs/explanation/domain.md)."""
    variants = {
        "as planned": plan,
        "fp8 KV cache": replace(plan, kv_dtype="fp8"),
        "half the context": replace(plan, context_tokens=max(1, plan.context_tokens // 2)),
        "a quarter of the context": replace(plan, context_tokens=max(1, plan.context_tokens // 4)),
    }
    if plan.gpu_memory_gib is not None and plan.kv_memory_gib is None:
        variants["twice the GPUs"] = replace(plan, tensor_parallel=plan.tensor_parallel * 2)
    return {name: variant.result() for name, variant in variants.items()}


def shape_from_config(path: str | Path) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) from a Hugging Face config.json."""
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
        text = config.get("text_config", config)  # multimodal models nest the LM's config
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from error
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path} lacks a usable {error} for the KV shape") from None
    return layers, kv_heads, head_dim
