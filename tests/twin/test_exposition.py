"""The twin's /metrics: every generation parses and normalizes, and 0.32 matches a real
vLLM 0.32 family for family, label for label."""

from __future__ import annotations

import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import parse_vllm
from kneepoint.twin.dcgm import GpuNode, GpuState
from kneepoint.twin.exposition import Snapshot, render
from kneepoint.twin.profiles import gpu, model
from kneepoint.twin.simulated_engine import Engine, EngineConfig
from tests.conftest import OWN_FIXTURES, VLLM_032, read

GENERATIONS = {"0.32": "v1", "0.10": "v1-0.10", "0.8": "v1-0.8", "0.5": "v0"}


def busy_engine(**overrides: object) -> Engine:
    config = EngineConfig(gpu("rtx4000ada"), model("qwen3-4b"), max_model_len=1024, **overrides)  # type: ignore[arg-type]
    engine = Engine(config)
    rng = random.Random(0)
    shared = [rng.randrange(1000) for _ in range(200)]
    for _ in range(6):
        engine.add([*shared, *(rng.randrange(1000) for _ in range(60))], 40)
    for _ in range(30):
        engine.step()
    return engine


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("vllm:"):
            labels = frozenset().union(*(set(s.labels) - {"le"} for s in family.samples))
            found[family.name] = (family.type, labels)
    return found


@pytest.mark.parametrize(("version", "generation"), GENERATIONS.items())
def test_every_generation_passes_kneepoint_s_own_normalization(
    version: str, generation: str
) -> None:
    engine = busy_engine(num_speculative_tokens=3, spec_acceptance_rate=0.6)
    sample = parse_vllm(render(Snapshot(engine, "Qwen/Qwen3-4B", 1.7e9, 0.9), version).decode())
    stats = engine.stats
    assert sample.generation == generation
    assert sample.model_names == ["Qwen/Qwen3-4B"]
    assert sample.counters["generation_tokens"] == stats.generation_tokens
    assert sample.counters["prompt_tokens"] == stats.prompt_tokens
    assert sample.gauges["requests_running"] == len(engine.running)
    assert sample.gauges["kv_cache_usage"] == pytest.approx(engine.kv.usage)
    assert sample.cache.capacity_tokens == engine.capacity_tokens
    assert sample.histograms["ttft"].count == sum(
        stats.histograms["time_to_first_token_seconds"].counts
    )
    if version != "0.5":
        assert sample.counters["prefix_cache_hits"] == stats.prefix_cache_hits > 0
        assert sample.counters["spec_decode_drafts"] == stats.spec_drafts
        assert sample.accepted_per_position == stats.spec_accepted_per_position


def test_0_32_has_the_families_and_labels_of_a_real_server() -> None:
    plain = render(Snapshot(busy_engine(), "tiny", 1.7e9, 0.9)).decode()
    assert families(plain) == families(read(VLLM_032))


def test_with_a_drafter_it_has_the_spec_decode_families_of_a_real_server() -> None:
    engine = busy_engine(num_speculative_tokens=3, spec_acceptance_rate=0.0)
    twin = render(Snapshot(engine, "tiny", 1.7e9, 0.9)).decode()
    real = read(OWN_FIXTURES / "vllm-0.32.0-cpu-ngram-spec-decode.prom")
    assert families(twin) == families(real)


def test_histogram_buckets_are_vllm_s() -> None:
    text = render(Snapshot(busy_engine(), "tiny", 1.7e9, 0.9)).decode()

    def bounds(source: str, name: str) -> list[str]:
        return [
            s.labels["le"]
            for f in text_string_to_metric_families(source)
            for s in f.samples
            if s.name == f"{name}_bucket"
        ]

    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_prompt_tokens",
        "vllm:iteration_tokens_total",
        "vllm:request_num_preemptions",
    ):
        assert bounds(text, name) == bounds(read(VLLM_032), name), name


def test_the_dcgm_twin_follows_the_work_on_its_gpu() -> None:
    engine = Engine(EngineConfig(gpu("h100-80gb"), model("llama-3.1-8b")))
    state = GpuState(
        0, gpu("h100-80gb"), stats=lambda: engine.stats, memory_fraction=0.9, pod="vllm-0"
    )
    node = GpuNode("node-1", [state])
    node.sample(1.0)
    [idle] = parse_dcgm(node.render().decode(), default_host="x")
    rng = random.Random(0)
    for _ in range(4):  # prefill-heavy: long prompts
        engine.add([rng.randrange(1000) for _ in range(8000)], 1)
    while engine.now < 1.0 and not engine.idle:
        engine.step()
    node.sample(engine.now)
    [prefill] = parse_dcgm(node.render().decode(), default_host="x")
    started = engine.now
    for _ in range(64):  # decode-heavy: short prompts, long answers
        engine.add([rng.randrange(1000) for _ in range(50)], 400)
    while engine.now < started + 2.0:
        engine.step()
    node.sample(engine.now - started)
    [decode] = parse_dcgm(node.render().decode(), default_host="x")
    assert idle.gr_engine_active == 0 and idle.power_watts == gpu("h100-80gb").idle_watts
    assert prefill.tensor_active and decode.tensor_active
    assert prefill.dram_active is not None and decode.dram_active is not None
    assert prefill.tensor_active > decode.tensor_active  # prefill is compute-bound
    assert decode.dram_active > prefill.dram_active  # decode is memory-bound
    assert (decode.energy_mj or 0) > (prefill.energy_mj or 0) > (idle.energy_mj or 0)
    assert decode.model == "NVIDIA H100 80GB HBM3" and decode.pod == "vllm-0"
    assert decode.host == "node-1" and decode.fb_used_mib == round(80 * 1024 * 0.9)
