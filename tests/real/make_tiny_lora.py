"""Build a tiny LoRA adapter (PEFT layout) for a model make_tiny_model.py built.

Run with the vLLM environment's Python (it has torch and safetensors):
    python make_tiny_lora.py MODEL_DIR OUTPUT_DIR [RANK]
The adapter's weights are seeded random numbers on every layer's q_proj and v_proj, shaped
from MODEL_DIR's config.json; nothing is downloaded or trained.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(model: Path, output: Path, rank: int = 8) -> None:
    import torch
    from safetensors.torch import save_file

    config = json.loads((model / "config.json").read_text())
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    outputs = {
        "q_proj": config["num_attention_heads"] * head_dim,
        "v_proj": config["num_key_value_heads"] * head_dim,
    }
    torch.manual_seed(1)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, width in outputs.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(width, rank) * 0.01
    output.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(output / "adapter_model.safetensors"))
    adapter = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model),
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted(outputs),
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (output / "adapter_config.json").write_text(json.dumps(adapter, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), *(int(arg) for arg in sys.argv[3:]))
