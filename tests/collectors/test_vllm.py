from __future__ import annotations

import pytest

from collectors.engines.vllm import parse_vllm
from collectors.parse import ScrapeFormatError
from tests.conftest import OWN_FIXTURES, VLLM_032, read


def test_it_reads_the_real_vllm_0_32_capture() -> None:
    sample = parse_vllm(read(VLLM_032))
    assert sample.generation == "v1"
    assert sample.engines == 1
    assert sample.model_names == ["tiny"]
    assert sample.gauges["kv_cache_usage"] == 0.0
    assert sample.gauges["requests_waiting_capacity"] == 0.0
    assert sample.counters["prompt_tokens"] == 25095
    assert sample.counters["generation_tokens"] == 2428
    assert sample.counters["prefix_cache_queries"] == 25095
    assert sample.counters["prefix_cache_hits"] == 17024
    assert sample.counters["prompt_tokens_local_compute"] == 8071
    assert sample.counters["prompt_tokens_local_cache_hit"] == 17024
    assert sample.counters["requests_finished_length"] == 64
    assert sample.counters["request_prompt_tokens_count"] == 64
    # Speculative decoding was not configured: absent, not zero.
    assert sample.counters["spec_decode_drafts"] is None
    assert sample.accepted_per_position is None
    assert sample.cache.block_size == 128
    assert sample.cache.num_gpu_blocks == 16384
    assert sample.cache.capacity_tokens == 2097152
    assert sample.cache.enable_prefix_caching is True
    assert sample.cache.gpu_memory_utilization == 0.92


def _exposed_start_time(text: str) -> float:
    """The capture's own `process_start_time_seconds` line, read without the parser."""
    lines = [line for line in text.splitlines() if line.startswith("process_start_time_seconds ")]
    assert len(lines) == 1
    return float(lines[0].split()[1])


def test_it_reads_the_api_server_s_process_start_time() -> None:
    text = read(VLLM_032)
    sample = parse_vllm(text)
    assert sample.gauges["process_start_time"] == _exposed_start_time(text)
    ray = read(OWN_FIXTURES / "vllm-0.32.0-ray-prefix.prom")
    assert parse_vllm(ray).gauges["process_start_time"] == _exposed_start_time(ray)


def test_a_capture_without_the_process_start_time_gives_none() -> None:
    text = read(OWN_FIXTURES / "vllm-0.10.2-dp2.prom")
    assert "process_start_time_seconds" not in text
    assert parse_vllm(text).gauges["process_start_time"] is None


def test_it_keeps_the_capture_s_histogram_buckets() -> None:
    ttft = parse_vllm(read(VLLM_032)).histograms["ttft"]
    assert ttft.bounds[:5] == (0.001, 0.005, 0.01, 0.02, 0.04)
    assert ttft.bounds[-1] == float("inf")
    assert ttft.counts[4] == 1 and ttft.counts[-1] == 64
    assert ttft.total == pytest.approx(25.265060424804688)


def test_it_ignores_created_series() -> None:
    # Each counter has a _created twin holding a Unix timestamp (~1.8e9): summing by prefix
    # would add it. The values above are the counters alone.
    sample = parse_vllm(read(VLLM_032))
    assert all(value is None or value < 1e9 for value in sample.counters.values())


def test_it_reads_ray_s_vllm_underscore_spelling_as_the_same_metrics() -> None:
    ray = parse_vllm(read(OWN_FIXTURES / "vllm-0.32.0-ray-prefix.prom"))
    plain = parse_vllm(read(VLLM_032))
    assert ray.counters == plain.counters
    assert ray.gauges == plain.gauges
    assert ray.histograms == plain.histograms


def test_it_reads_the_v0_engine_of_0_5() -> None:
    sample = parse_vllm(read(OWN_FIXTURES / "vllm-0.5.5-v0.prom"))
    assert sample.generation == "v0"
    assert sample.engines == 1
    assert sample.gauges["kv_cache_usage"] == 0.97
    assert sample.gauges["requests_swapped"] == 2
    assert sample.gauges["prefix_cache_hit_rate_gauge"] == 0.64
    assert sample.gauges["requests_waiting_capacity"] is None
    assert sample.counters["prefix_cache_queries"] is None
    assert sample.counters["spec_decode_accepted_tokens"] == 186000
    assert sample.counters["spec_decode_draft_tokens"] == 300000
    assert sample.histograms["itl"].count == 411000  # from time_per_output_token_seconds
    assert "queue" not in sample.histograms
    assert sample.cache.capacity_tokens == 16 * 27000


def test_it_reads_the_early_v1_engine_of_0_8() -> None:
    sample = parse_vllm(read(OWN_FIXTURES / "vllm-0.8.5-v1.prom"))
    assert sample.generation == "v1-0.8"
    assert sample.gauges["kv_cache_usage"] == 0.73
    assert sample.counters["prefix_cache_queries"] == 880000  # gpu_prefix_cache_queries
    assert sample.counters["prefix_cache_hits"] == 545600
    assert sample.counters["requests_finished_abort"] == 10
    assert sample.counters["spec_decode_drafts"] == 40000
    assert sample.accepted_per_position == [28000, 14000, 7200]
    assert sample.histograms["itl"].count == 130500


def test_it_counts_deprecated_names_once_and_aggregates_engines() -> None:
    sample = parse_vllm(read(OWN_FIXTURES / "vllm-0.10.2-dp2.prom"))
    assert sample.generation == "v1-0.10"
    assert sample.engines == 2
    # Occupancy: max and mean over engines, never a sum.
    assert sample.gauges["kv_cache_usage"] == 0.9
    assert sample.gauges["kv_cache_usage_mean"] == pytest.approx(0.7)
    # Queues and counters: summed over engines, and the gpu_* twins not added again.
    assert sample.gauges["requests_running"] == 16
    assert sample.gauges["requests_waiting"] == 5
    assert sample.gauges["requests_waiting_capacity"] == 3
    assert sample.counters["prefix_cache_queries"] == 80000
    assert sample.counters["prefix_cache_hits"] == 57000
    assert sample.counters["preemptions"] == 8
    # inter_token_latency and the deprecated time_per_output_token: one histogram, both engines.
    itl = sample.histograms["itl"]
    assert itl.counts == (300.0, 2700.0, 3000.0, 3000.0)
    assert itl.total == 60.0
    # Each engine has its own KV cache.
    assert sample.cache.capacity_tokens == 2 * 16 * 8192
    assert sample.cache.cache_dtype == "fp8"


def test_it_refuses_a_body_that_is_not_vllm() -> None:
    with pytest.raises(ScrapeFormatError, match="vLLM"):
        parse_vllm("process_cpu_seconds_total 3.2\n")


def test_it_reads_a_real_server_that_is_preempting() -> None:
    sample = parse_vllm(read(OWN_FIXTURES / "vllm-0.32.0-cpu-preemption-under-load.prom"))
    assert sample.counters["preemptions"] == 24
    assert sample.gauges["requests_running"] == 3
    assert sample.gauges["requests_waiting"] == 12
    assert sample.gauges["requests_waiting_capacity"] == 12  # all waiting for KV cache
    assert sample.gauges["kv_cache_usage"] == pytest.approx(9 / 11)  # 1 - free/(blocks - 1)
    assert sample.cache.num_gpu_blocks == 12
    assert sample.cache.capacity_tokens == 1536


def test_it_reads_a_real_server_with_ngram_speculative_decoding() -> None:
    sample = parse_vllm(read(OWN_FIXTURES / "vllm-0.32.0-cpu-ngram-spec-decode.prom"))
    assert sample.counters["spec_decode_drafts"] == 109
    assert sample.counters["spec_decode_draft_tokens"] == 322
    assert sample.counters["spec_decode_accepted_tokens"] == 0  # a drafter that never hits
    assert sample.accepted_per_position == [0, 0, 0]
    assert sample.counters["generation_tokens"] == 512
