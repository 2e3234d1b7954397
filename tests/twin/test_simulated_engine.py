"""The engine's physics, in virtual time (no sleeping, no HTTP)."""

from __future__ import annotations

import random

import pytest

from kneepoint.twin.kvcache import KvCache, block_hashes
from kneepoint.twin.profiles import GIB, gpu, model
from kneepoint.twin.simulated_engine import Engine, EngineConfig


def config(**overrides: object) -> EngineConfig:
    base: dict[str, object] = {"gpu": gpu("rtx4000ada"), "model": model("qwen3-4b")}
    return EngineConfig(**(base | overrides))  # type: ignore[arg-type]


def run_until_done(engine: Engine, limit: int = 100_000) -> None:
    for _ in range(limit):
        if engine.idle:
            return
        engine.step()
    raise AssertionError("the engine never finished its work")


def random_prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(150_000) for _ in range(length)]


def test_kv_bytes_per_token_follow_the_model_config() -> None:
    # 2 × 32 layers × 8 KV heads × 128 head dim × 2 bytes = 128 KiB (docs/explanation/domain.md)
    assert model("llama-3.1-8b").kv_bytes_per_token(2) == 128 * 1024
    assert model("qwen3-4b").kv_bytes_per_token(1) == 2 * 36 * 8 * 128


def test_kv_blocks_come_from_what_memory_is_left_after_the_weights() -> None:
    plain = config()
    expected = (20 * GIB * 0.9 - 4.02e9 * 2 - GIB) // (16 * 2 * 36 * 8 * 128 * 2)
    assert plain.num_gpu_blocks == expected
    # fp8 KV cache halves bytes per token: twice the blocks.
    assert config(fp8_kv_cache=True).num_gpu_blocks == pytest.approx(2 * expected, abs=1)
    # More memory for vLLM, more blocks.
    assert config(gpu_memory_utilization=0.95).num_gpu_blocks > expected
    with pytest.raises(ValueError, match="does not fit"):
        _ = config(model=model("qwen3-32b")).num_gpu_blocks


def test_a_single_stream_decodes_at_the_memory_bandwidth_ceiling() -> None:
    engine = Engine(config())
    request = engine.add(random_prompt(random.Random(0), 256), 128)
    run_until_done(engine)
    first_token = request.first_token or 0
    per_token = (engine.now - first_token) / 127
    ceiling = 8.04e9 / 360e9  # weights ÷ bandwidth (docs/explanation/domain.md: ≈40–45 tok/s)
    assert ceiling < per_token < ceiling * 1.25
    assert 0.04 < first_token < 0.08  # TTFT of a 256-token prompt alone


def test_an_agent_that_resends_its_transcript_hits_the_prefix_cache() -> None:
    engine = Engine(config())
    transcript = random_prompt(random.Random(1), 2000)
    engine.add(transcript, 32)
    run_until_done(engine)
    cold = engine.now
    engine.add([*transcript, *random_prompt(random.Random(2), 300)], 32)
    before = engine.now
    run_until_done(engine)
    stats = engine.stats
    assert stats.prefix_cache_hits == 2000 // 16 * 16  # every full block of the old transcript
    assert stats.prefix_cache_queries == 2000 + 2300
    assert engine.now - before < cold  # the second, longer prompt prefills faster


def test_without_prefix_caching_nothing_hits() -> None:
    engine = Engine(config(enable_prefix_caching=False))
    prompt = random_prompt(random.Random(1), 500)
    for _ in range(2):
        engine.add(prompt, 8)
        run_until_done(engine)
    assert engine.stats.prefix_cache_hits == 0


def test_when_blocks_run_out_requests_are_preempted_and_recomputed() -> None:
    rng = random.Random(3)
    small = config(gpu_memory_utilization=0.45, max_num_seqs=64)
    assert small.num_gpu_blocks < 300
    engine = Engine(small)
    for _ in range(24):
        engine.add(random_prompt(rng, 300), 300)
    run_until_done(engine)
    assert engine.stats.preemptions > 0
    assert engine.stats.finished["length"] == 24
    # Recomputation costs time: the same work without preemption takes less.
    roomy = Engine(config(max_num_seqs=64))
    rng = random.Random(3)
    for _ in range(24):
        roomy.add(random_prompt(rng, 300), 300)
    run_until_done(roomy)
    assert roomy.stats.preemptions == 0
    assert engine.stats.compute_seconds > roomy.stats.compute_seconds


def test_waiting_for_capacity_is_reported_while_the_cache_is_full() -> None:
    engine = Engine(config(gpu_memory_utilization=0.45, max_num_seqs=64))
    rng = random.Random(4)
    for _ in range(40):
        engine.add(random_prompt(rng, 300), 300)
    seen, fullest = 0, 0.0
    for _ in range(2000):
        engine.step()
        seen = max(seen, engine.waiting_for_capacity)
        fullest = max(fullest, engine.kv.usage)
    assert seen > 0
    assert fullest > 0.9


def test_chunked_prefill_never_exceeds_the_token_budget() -> None:
    engine = Engine(config(max_num_batched_tokens=512))
    engine.add(random_prompt(random.Random(5), 3000), 4)
    steps = 0
    while engine.running or engine.waiting:
        engine.step()
        steps += 1
    # 3000 prompt tokens in 512-token chunks: 6 prefill steps, then 3 decode steps.
    assert steps == 9
    histogram = engine.stats.histograms["iteration_tokens_total"]
    assert histogram.total == 3000 + 3


def test_continuous_batching_stops_at_max_num_seqs() -> None:
    engine = Engine(config(max_num_seqs=8))
    rng = random.Random(6)
    for _ in range(20):
        engine.add(random_prompt(rng, 64), 50)
    peak = 0
    while not engine.idle:
        engine.step()
        peak = max(peak, len(engine.running))
    assert peak == 8


def test_a_matched_drafter_speeds_decoding_and_a_mismatched_one_slows_it() -> None:
    def tokens_per_second(**drafter: object) -> float:
        engine = Engine(config(**drafter))
        engine.add(random_prompt(random.Random(7), 256), 512)
        run_until_done(engine)
        return 512 / engine.now

    plain = tokens_per_second()
    matched = tokens_per_second(
        num_speculative_tokens=3, spec_acceptance_rate=0.8, spec_draft_cost=0.05
    )
    mismatched = tokens_per_second(
        num_speculative_tokens=4, spec_acceptance_rate=0.02, spec_draft_cost=0.15
    )
    assert matched > 1.5 * plain
    assert mismatched < plain


def test_acceptance_counters_follow_the_configured_rate() -> None:
    engine = Engine(config(num_speculative_tokens=3, spec_acceptance_rate=0.6), seed=1)
    engine.add(random_prompt(random.Random(8), 100), 3000)
    run_until_done(engine)
    stats = engine.stats
    drafts = stats.spec_drafts
    expected = [0.6, 0.36, 0.216]
    for position, share in enumerate(expected):
        assert stats.spec_accepted_per_position[position] / drafts == pytest.approx(share, abs=0.05)
    assert stats.spec_draft_tokens == 3 * drafts


def test_block_hashes_take_the_known_hashes_of_a_prefix_sent_before() -> None:
    rng = random.Random(3)
    head, tail = random_prompt(rng, 40), random_prompt(rng, 37)
    whole = block_hashes(head + tail, 16)
    assert len(whole) == 4  # 77 tokens: 4 full blocks
    assert block_hashes(head + tail, 16, block_hashes(head, 16)) == whole
    assert block_hashes(head + tail, 16, whole[:1]) == whole
    # Known hashes are taken as they are: the caller vouches for them.
    assert block_hashes(head + tail, 16, [7, 8])[:2] == [7, 8]


def test_the_cache_evicts_least_recently_used_blocks_nobody_holds() -> None:
    cache = KvCache(num_blocks=5, block_size=2)
    first, second = block_hashes([1, 2, 3, 4], 2), block_hashes([9, 9, 8, 8], 2)
    cache.acquire(first, 0)
    cache.release(first, 0)
    assert cache.free == 4 and cache.cached_prefix(first) == 2  # cached, but free
    cache.acquire(second, 0)
    cache.acquire([], 2)  # needs the space the first prompt's blocks held
    assert cache.cached_prefix(first) == 0
    assert cache.free == 0
    with pytest.raises(MemoryError):
        cache.acquire([], 1)
