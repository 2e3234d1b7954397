"""The capacity planner against the worked example of docs/explanation/domain.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kneepoint.derived.capacity import Plan, shape_from_config, what_ifs

EIGHT_B = {"layers": 32, "kv_heads": 8, "head_dim": 128}


def test_the_worked_example_of_domain_md() -> None:
    # 2 × 32 × 8 × 128 × 2 bytes = 128 KiB per token; 131072 tokens × 128 KiB = 16 GiB;
    # 60 GiB of cache ÷ 16 GiB = 3.75 sequences ("about 3.7").
    result = Plan(**EIGHT_B, kv_memory_gib=60).result()
    assert result["bytes_per_token"] == 128 * 1024
    assert result["sequence_gib"] == 16.0
    assert result["kv_tokens"] == 60 * 1024**3 // (128 * 1024)
    assert result["max_sequences"] == 3.75


def test_fp8_doubles_and_a_quarter_of_the_context_fits_four_times_as_many() -> None:
    scenarios = what_ifs(Plan(**EIGHT_B, kv_memory_gib=60))
    base = scenarios["as planned"]["max_sequences"]
    assert scenarios["fp8 KV cache"]["max_sequences"] == 2 * base
    assert scenarios["a quarter of the context"]["max_sequences"] == 4 * base  # 128k → 32k
    assert scenarios["half the context"]["max_sequences"] == 2 * base


def test_the_cache_is_what_vllm_may_take_minus_the_weights() -> None:
    plan = Plan(**EIGHT_B, gpu_memory_gib=80, weights_gib=16, gpu_memory_utilization=0.95)
    assert plan.result()["kv_cache_gib"] == pytest.approx(80 * 0.95 - 16)  # 60 GiB
    two = what_ifs(plan)["twice the GPUs"]
    assert two["kv_cache_gib"] == pytest.approx(2 * 80 * 0.95 - 16)  # weights split, not doubled


def test_the_shape_comes_from_a_config_json(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    # Llama-3.1-8B's published config: no head_dim key, so hidden_size ÷ attention heads.
    config.write_text(
        json.dumps(
            {
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "hidden_size": 4096,
            }
        )
    )
    assert shape_from_config(config) == (32, 8, 128)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"num_hidden_layers": 32}))
    with pytest.raises(ValueError, match=r"broken\.json lacks"):
        shape_from_config(broken)


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="kv dtype"):
        Plan(**EIGHT_B, kv_dtype="int3", kv_memory_gib=1)
    with pytest.raises(ValueError, match="GPU memory"):
        Plan(**EIGHT_B)


def test_the_command_prints_json(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kneepoint.cli",
            "capacity",
            "--profile",
            "llama-3.1-8b",
            "--kv-memory-gib",
            "60",
            "--context",
            "32768",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["max_sequences"] == 15.0
    assert report["what_ifs"]["fp8 KV cache"]["max_sequences"] == 30.0
    bad = subprocess.run(
        [sys.executable, "-m", "kneepoint.cli", "capacity", "--layers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stdout == ""
