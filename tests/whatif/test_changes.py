"""The changes: parsing (bad input named) and what each does to a profile."""

from __future__ import annotations

import pytest

from kneepoint.twin.profiles import GPUS, gpu, model
from kneepoint.twin.simulated_engine import EngineConfig, StepCost
from kneepoint.whatif import Change, EngineShape, FitQuality, Profile, WhatIfError, parse_changes
from kneepoint.whatif.changes import apply


def profile(shape: EngineShape, cost: StepCost) -> Profile:
    return Profile("r", shape, cost, FitQuality((), True, "test"))


def l4() -> Profile:
    config = EngineConfig(gpu("l4"), model("qwen3-4b"), gpu_memory_utilization=0.6)
    return profile(EngineShape.of(config), StepCost.of(config))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["colour=blue"], "unknown change 'colour'"),
        (["max_num_seqs=many"], "expected an integer"),
        (["max_num_seqs=0"], "at least 1"),
        (["kv_cache_dtype=int3"], "auto or fp8"),
        (["gpu=tpu"], "unknown gpu"),
        (["growth=-1"], "positive"),
        (["routing=random"], "round-robin or sticky"),
        (["enable_prefix_caching=maybe"], "true or false"),
        (["replicas"], "KEY=VALUE"),
        (["replicas=2", "replicas=3"], "set twice"),
    ],
)
def test_bad_changes_are_refused_with_their_name(settings: list[str], message: str) -> None:
    with pytest.raises(WhatIfError, match=message):
        parse_changes(settings)


def test_changes_parse_to_typed_values() -> None:
    change = parse_changes(
        ["kv_cache_dtype=fp8", "replicas=3", "growth=x1.5", "enable_prefix_caching=off"]
    )
    assert change == Change(
        kv_cache_dtype="fp8", replicas=3, growth=1.5, enable_prefix_caching=False
    )
    assert change.as_dict() == {
        "kv_cache_dtype": "fp8",
        "enable_prefix_caching": False,
        "replicas": 3,
        "growth": 1.5,
    }


def test_fp8_kv_doubles_the_blocks_and_halves_the_bytes_read_per_context_token() -> None:
    base = l4()
    shape, cost = apply(base, Change(kv_cache_dtype="fp8"))
    assert shape.num_gpu_blocks == 2 * base.shape.num_gpu_blocks
    assert cost.context_token_seconds == pytest.approx(base.cost.context_token_seconds / 2)
    assert cost.token_seconds == base.cost.token_seconds


def test_another_gpu_scales_by_bandwidth_and_compute_and_gains_its_memory() -> None:
    base = l4()
    shape, cost = apply(base, Change(gpu="h100-80gb"))
    old, new = GPUS["l4"], GPUS["h100-80gb"]
    assert cost.weight_read_seconds == pytest.approx(
        base.cost.weight_read_seconds * old.bandwidth_gbs / new.bandwidth_gbs
    )
    assert cost.token_seconds == pytest.approx(
        base.cost.token_seconds * old.bf16_tflops / new.bf16_tflops
    )
    assert cost.overhead_seconds == base.cost.overhead_seconds
    # The KV cache the twin gives the model on that GPU at the same memory share.
    there = EngineConfig(gpu("h100-80gb"), model("qwen3-4b"), gpu_memory_utilization=0.6)
    assert abs(shape.num_gpu_blocks - there.num_gpu_blocks) <= 1
    assert shape.gpu == "h100-80gb"


def test_more_memory_share_means_more_blocks_and_an_unknown_model_cannot_say() -> None:
    base = l4()
    shape, _ = apply(base, Change(gpu_memory_utilization=0.9))
    assert shape.num_gpu_blocks > base.shape.num_gpu_blocks
    agnostic = profile(EngineShape(num_gpu_blocks=100), StepCost())
    with pytest.raises(WhatIfError, match="GPU memory"):
        apply(agnostic, Change(gpu_memory_utilization=0.9))
    with pytest.raises(WhatIfError, match="own GPU profile"):
        apply(agnostic, Change(gpu="l4"))


def test_a_drafter_where_there_was_none_needs_its_acceptance() -> None:
    base = l4()
    with pytest.raises(WhatIfError, match="spec_acceptance_rate"):
        apply(base, Change(num_speculative_tokens=3))
    shape, cost = apply(base, Change(num_speculative_tokens=3, spec_acceptance_rate=0.7))
    assert shape.num_speculative_tokens == 3
    assert cost.draft_token_seconds > 0
