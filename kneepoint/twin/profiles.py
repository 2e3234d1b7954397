"""GPU and model profiles from published specifications and model configs."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str  # as DCGM's modelName label says it
    memory_gib: float
    bandwidth_gbs: float  # HBM/GDDR bandwidth, GB/s
    bf16_tflops: float  # dense tensor throughput
    fp8_tflops: float
    tdp_watts: float
    idle_watts: float


@dataclass(frozen=True)
class Model:
    key: str
    name: str  # the served model name
    parameters: float
    layers: int
    kv_heads: int
    head_dim: int
    attention_heads: int = 0  # query heads: the attention term of the FLOPs (0: left out)

    def kv_bytes_per_token(self, kv_dtype_bytes: float) -> float:
        """2 (K and V) × layers × KV heads × head dim × bytes per element."""
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_dtype_bytes


GPUS = {
    gpu.key: gpu
    for gpu in (
        Gpu("rtx4000ada", "NVIDIA RTX 4000 Ada Generation", 20, 360, 53.4, 106.9, 130, 12),
        Gpu("l4", "NVIDIA L4", 24, 300, 121, 242, 72, 16),
        Gpu("a100-80gb", "NVIDIA A100-SXM4-80GB", 80, 2039, 312, 312, 400, 55),
        Gpu("h100-80gb", "NVIDIA H100 80GB HBM3", 80, 3350, 989, 1979, 700, 70),
        Gpu("h200", "NVIDIA H200", 141, 4800, 989, 1979, 700, 75),
    )
}

# From the models' published config.json: num_hidden_layers, num_key_value_heads, head_dim,
# num_attention_heads.
MODELS = {
    model.key: model
    for model in (
        Model("qwen3-4b", "Qwen/Qwen3-4B", 4.02e9, 36, 8, 128, 32),
        Model("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 32, 8, 128, 32),
        Model("qwen3-32b", "Qwen/Qwen3-32B", 32.8e9, 64, 8, 128, 64),
    )
}


def gpu(key: str) -> Gpu:
    try:
        return GPUS[key]
    except KeyError:
        raise ValueError(f"unknown GPU {key!r}; known: {', '.join(GPUS)}") from None


def model(key: str) -> Model:
    try:
        return MODELS[key]
    except KeyError:
        raise ValueError(f"unknown model {key!r}; known: {', '.join(MODELS)}") from None
