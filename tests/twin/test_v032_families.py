"""The twin speaks vLLM 0.32's new families from what its engine does: load shedding past
the queue limits, a sleeping engine, the MFU estimates from the tokens computed, and a CPU
KV offload tier. Each is read back from the twin's /metrics text, and through kneepoint's own
vLLM normalizer under the canonical names (kneepoint/samples.py)."""

from __future__ import annotations

import random
from dataclasses import replace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import parse_vllm
from kneepoint.samples import ReplicaSample
from kneepoint.twin.dcgm import GpuNode, GpuState
from kneepoint.twin.exposition import Snapshot, render
from kneepoint.twin.profiles import GIB, gpu, model
from kneepoint.twin.replica import Replica
from kneepoint.twin.server import TwinServer
from kneepoint.twin.simulated_engine import Engine, EngineConfig, Rejected
from kneepoint.twin.traffic import Group, Traffic


def config(**overrides: object) -> EngineConfig:
    return EngineConfig(gpu("l4"), model("qwen3-4b"), max_model_len=4096, **overrides)  # type: ignore[arg-type]


def scrape(engine: Engine) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the 0.32 exposition, by name and its labels (model and engine left
    out)."""
    text = render(Snapshot(engine, "Qwen/Qwen3-4B", 1.7e9, 0.9)).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(
                sorted(
                    (k, v) for k, v in sample.labels.items() if k not in ("model_name", "engine")
                )
            )
            out[(sample.name, labels)] = sample.value
    return out


def normalized(engine: Engine) -> ReplicaSample:
    return parse_vllm(render(Snapshot(engine, "Qwen/Qwen3-4B", 1.7e9, 0.9)).decode())


def prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(50_000) for _ in range(length)]


# Load shedding


def test_requests_are_refused_only_past_the_queue_limit() -> None:
    engine = Engine(config(max_num_queued_reqs=4))
    rng = random.Random(0)
    for _ in range(4):  # up to the limit: all admitted
        engine.add(prompt(rng, 100), 20)
    assert (
        scrape(engine)[("vllm:admission_rejections_total", (("reason", "max_num_queued_reqs"),))]
        == 0
    )
    for _ in range(3):
        with pytest.raises(Rejected) as refused:
            engine.add(prompt(rng, 100), 20)
        assert refused.value.reason == "max_num_queued_reqs"
    metrics = scrape(engine)
    assert metrics[("vllm:admission_rejections_total", (("reason", "max_num_queued_reqs"),))] == 3
    assert metrics[("vllm:admission_rejections_total", (("reason", "max_num_queued_tokens"),))] == 0
    assert metrics[("vllm:num_requests_waiting", ())] == 4  # the refused never queued
    assert normalized(engine).counters["admission_rejections"] == 3
    while not engine.idle:  # once they are done there is room again
        engine.step()
    engine.add(prompt(rng, 100), 20)
    assert (
        scrape(engine)[("vllm:admission_rejections_total", (("reason", "max_num_queued_reqs"),))]
        == 3
    )


def test_the_token_limit_counts_the_prompts_still_in_prefill() -> None:
    engine = Engine(config(max_num_queued_tokens=250))
    rng = random.Random(1)
    for _ in range(3):  # 0, 100 and 200 queued tokens: under 250, admitted
        engine.add(prompt(rng, 100), 20)
    with pytest.raises(Rejected) as refused:  # 300 queued: at or past the limit
        engine.add(prompt(rng, 100), 20)
    assert refused.value.reason == "max_num_queued_tokens"
    while any(r.first_token is None for r in [*engine.running, *engine.waiting]):
        engine.step()
    engine.add(prompt(rng, 100), 20)  # all decoding now: nothing queued for prefill
    key = ("vllm:admission_rejections_total", (("reason", "max_num_queued_tokens"),))
    assert scrape(engine)[key] == 1


def test_a_refused_request_gets_http_503_as_from_vllm() -> None:
    replica = Replica("shed", "Qwen/Qwen3-4B", config(max_num_queued_reqs=1))
    server = TwinServer(replica, "127.0.0.1", 0).start()
    try:
        replica.engine.add([1, 2, 3], 5)  # the one slot taken (the engine is not stepping)
        body = {"model": "Qwen/Qwen3-4B", "prompt": "hello there", "max_tokens": 5}
        for stream in (False, True):
            answer = httpx.post(f"{server.url}/v1/completions", json=body | {"stream": stream})
            assert answer.status_code == 503
            assert answer.json()["error"]["code"] == 503
        assert "admission_rejections_total{" in httpx.get(f"{server.url}/metrics").text
        assert replica.engine.stats.admission_rejections["max_num_queued_reqs"] == 2
    finally:
        server.stop()


# Sleep mode


def test_a_sleeping_engine_says_so_and_its_counters_stay_frozen() -> None:
    engine = Engine(config())
    rng = random.Random(2)
    shared = prompt(rng, 300)
    for _ in range(4):
        engine.add([*shared, *prompt(rng, 50)], 50)
    for _ in range(10):
        engine.step()
    assert engine.running
    engine.sleep(1)
    asleep = scrape(engine)
    states = {
        labels[0][1]: value
        for (name, labels), value in asleep.items()
        if name == "vllm:engine_sleep_state"
    }
    assert states == {"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0}
    assert normalized(engine).gauges["sleep_level"] == 1
    # Requests in flight were aborted (vLLM's default mode) and the KV cache discarded.
    assert asleep[("vllm:request_success_total", (("finished_reason", "abort"),))] == 4
    assert asleep[("vllm:kv_cache_usage_perc", ())] == 0
    engine.add([*shared, *prompt(rng, 50)], 50)  # accepted but not processed
    for _ in range(5):
        assert engine.step() == 0.0
    later = scrape(engine)
    counters = [key for key in asleep if key[0].endswith("_total")]
    assert all(later[key] == asleep[key] for key in counters)
    engine.wake_up()
    while not engine.idle:
        engine.step()
    woken = scrape(engine)
    assert woken[("vllm:engine_sleep_state", (("sleep_state", "awake"),))] == 1
    assert woken[("vllm:generation_tokens_total", ())] > later[("vllm:generation_tokens_total", ())]
    # The prefix cache was discarded: the shared prefix missed once more.
    assert (
        woken[("vllm:prefix_cache_hits_total", ())] == later[("vllm:prefix_cache_hits_total", ())]
    )
    assert normalized(engine).gauges["sleep_level"] == 0
    engine.sleep(2)
    assert scrape(engine)[("vllm:engine_sleep_state", (("sleep_state", "discard_all"),))] == 1
    assert normalized(engine).gauges["sleep_level"] == 2


def test_a_sleeping_replica_s_gpu_is_idle_and_traffic_passes_it_by() -> None:
    replica = Replica("sleepy", "Qwen/Qwen3-4B", config(), speed=50.0).start()
    state = GpuState(
        0,
        gpu("l4"),
        stats=lambda: replica.engine.stats,
        sleep_level=lambda: replica.engine.sleep_level,
        memory_fraction=0.9,
    )
    node = GpuNode("node", [state])
    server = TwinServer(replica, "127.0.0.1", 0).start()
    try:
        assert httpx.get(f"{server.url}/is_sleeping").json() == {"is_sleeping": False}
        assert httpx.post(f"{server.url}/sleep?level=1").json()["level"] == 1
        assert httpx.get(f"{server.url}/is_sleeping").json() == {"is_sleeping": True}
        node.sample(1.0)
        [reading] = parse_dcgm(node.render().decode(), default_host="x")
        assert reading.power_watts == gpu("l4").idle_watts and reading.gr_engine_active == 0
        assert reading.fb_used_mib is not None and reading.fb_used_mib < 0.05 * 24 * 1024
        traffic = Traffic([Group("Qwen/Qwen3-4B", [server.url, "http://awake"], 1.0)])
        traffic.sleeping = {server.url}
        assert traffic.route(traffic.groups[0], 0) == "http://awake"
        traffic.sleeping = {server.url, "http://awake"}
        assert traffic.route(traffic.groups[0], 0) is None
        httpx.post(f"{server.url}/wake_up")
        assert httpx.get(f"{server.url}/is_sleeping").json() == {"is_sleeping": False}
        node.sample(1.0)
        [awake] = parse_dcgm(node.render().decode(), default_host="x")
        assert awake.fb_used_mib == round(24 * 1024 * 0.9)
    finally:
        server.stop()
        replica.stop()


# The MFU estimates


def test_flops_and_bytes_follow_vllm_s_formula_for_the_tokens_computed() -> None:
    qwen = model("qwen3-4b")
    cfg = config(enable_prefix_caching=False)
    engine = Engine(cfg)
    length, outputs = 700, 3
    engine.add(prompt(random.Random(3), length), outputs)
    while not engine.idle:
        engine.step()
    # One prefill step of `length` tokens, then decodes at context length+1, length+2.
    tokens = length + outputs - 1
    token_context = length * length + (length + 1) + (length + 2)
    context = length + (length + 1) + (length + 2)
    attention = 4 * qwen.layers * qwen.attention_heads * qwen.head_dim * token_context
    kv_per_token = 2 * qwen.layers * qwen.kv_heads * qwen.head_dim * 2  # bf16 K and V
    metrics = scrape(engine)
    flops = metrics[("vllm:estimated_flops_per_gpu_total", ())]
    assert flops == pytest.approx(2 * qwen.parameters * tokens + attention)
    read = metrics[("vllm:estimated_read_bytes_per_gpu_total", ())]
    assert read == pytest.approx(outputs * qwen.parameters * 2 + context * kv_per_token)
    written = metrics[("vllm:estimated_write_bytes_per_gpu_total", ())]
    assert written == pytest.approx(tokens * kv_per_token)
    counters = normalized(engine).counters
    assert counters["estimated_flops"] == pytest.approx(flops)
    assert counters["estimated_read_bytes"] == pytest.approx(read)
    assert counters["estimated_write_bytes"] == pytest.approx(written)
    # Per GPU: two tensor-parallel GPUs each do half.
    split = Engine(replace(cfg, tensor_parallel_size=2))
    split.add(prompt(random.Random(3), length), outputs)
    while not split.idle:
        split.step()
    assert split.stats.estimated_flops == pytest.approx(flops / 2)


def test_recomputed_tokens_count_and_the_mfu_is_plausible() -> None:
    # Without the attention term the FLOPs are 2 × parameters × every token a step computed,
    # preempted and recomputed ones included (iteration_tokens_total's sum).
    linear = replace(model("qwen3-4b"), attention_heads=0)
    engine = Engine(replace(config(gpu_memory_utilization=0.45), model=linear))
    rng = random.Random(4)
    for _ in range(40):
        engine.add(prompt(rng, 1500), 300)
    while not engine.idle:
        engine.step()
    stats = engine.stats
    assert stats.preemptions > 0
    computed = stats.histograms["iteration_tokens_total"].total
    assert computed > stats.prompt_tokens + stats.generation_tokens  # the recompute
    assert stats.estimated_flops == pytest.approx(2 * linear.parameters * computed)
    mfu = stats.estimated_flops / engine.now / (gpu("l4").bf16_tflops * 1e12)
    mbu = stats.estimated_read_bytes / engine.now / (gpu("l4").bandwidth_gbs * 1e9)
    assert 0.02 < mfu < 0.6 and 0.1 < mbu < 1.0


# The CPU offload tier


def offload_run(gib: float) -> Engine:
    """Agents with long shared contexts on a cache too small to keep them all."""
    engine = Engine(config(num_gpu_blocks_override=400, kv_offload_gib=gib))
    rng = random.Random(5)
    contexts = [prompt(rng, 1200) for _ in range(8)]
    for turn in range(4):
        for context in contexts:
            engine.add([*context, *prompt(rng, 10 * (turn + 1))], 8)
            while not engine.idle:
                engine.step()
    return engine


def test_host_tier_hits_appear_only_with_offload_on() -> None:
    plain, offload = offload_run(0.0), offload_run(2.0)
    without, with_tier = scrape(plain), scrape(offload)
    host = ("vllm:prompt_tokens_cached_by_source_total", (("source", "host"),))
    device = ("vllm:prompt_tokens_cached_by_source_total", (("source", "device"),))
    assert without[host] == 0 and not any("kv_offload" in name for name, _ in without)
    assert with_tier[host] > 0
    assert with_tier[host] == with_tier[("vllm:external_prefix_cache_hits_total", ())]
    assert with_tier[device] == with_tier[("vllm:prefix_cache_hits_total", ())]
    assert with_tier[("vllm:prompt_tokens_cached_total", ())] == with_tier[host] + with_tier[device]
    # Hits from either tier are tokens not computed again.
    assert (
        with_tier[("vllm:prompt_tokens_by_source_total", (("source", "local_compute"),))]
        < without[("vllm:prompt_tokens_by_source_total", (("source", "local_compute"),))]
    )
    block = 16 * model("qwen3-4b").kv_bytes_per_token(2)
    assert with_tier[("vllm:kv_offload_load_bytes_total", ())] >= with_tier[host] / 16 * block
    assert with_tier[("vllm:kv_offload_store_bytes_total", ())] > 0
    usage = with_tier[("vllm:kv_offload_cpu_cache_usage_perc", ())]
    stored_blocks = with_tier[("vllm:kv_offload_store_bytes_total", ())] / block
    assert usage == pytest.approx(stored_blocks / (2.0 * GIB // block))
    read_plain, read_tier = normalized(plain), normalized(offload)
    assert read_plain.counters["prompt_tokens_cached_host"] == 0
    assert read_plain.counters["kv_offload_load_bytes"] is None  # no tier: not exposed
    assert read_plain.gauges["kv_offload_usage"] is None
    assert read_tier.counters["prompt_tokens_cached_host"] == with_tier[host] > 0
    assert read_tier.counters["external_prefix_cache_hits"] == with_tier[host]
    assert read_tier.gauges["kv_offload_usage"] == pytest.approx(usage)
