"""trtllm-serve's /prometheus/metrics normalized into the canonical sample, one fixture per
stage of its names. The fixtures are rendered by prometheus_client from TensorRT-LLM's metric
definitions with simulated values (their first line, tests/fixtures/make_trtllm_fixtures.py),
not captured: every expected number is read from the fixture's own text here."""

from __future__ import annotations

import json

import pytest

from collectors.engines import detect_engine, parse_replica
from collectors.engines.trtllm import parse_trtllm
from collectors.parse import ScrapeFormatError
from kneepoint.samples import QUANTITIES
from tests.conftest import OWN_FIXTURES, VLLM_032, read

BASIC = OWN_FIXTURES / "trtllm-1.0-unprefixed.prom"
KV = OWN_FIXTURES / "trtllm-1.3-kv-gauges.prom"
FULL = OWN_FIXTURES / "trtllm-full-iteration-stats.prom"


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample line named exactly `name`, read without the parser."""
    found = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, inner = head.partition("{")
        if metric == name:
            pairs = (pair.split("=", 1) for pair in inner.rstrip("}").split('",') if pair)
            found.append(({k: v.strip('"') for k, v in pairs}, float(value)))
    return found


def total(text: str, name: str, **match: str) -> float:
    values = [
        v for labels, v in samples(text, name) if all(labels.get(k) == w for k, w in match.items())
    ]
    assert values, name
    return sum(values)


def test_it_reads_the_full_stage() -> None:
    text = read(FULL)
    sample = parse_trtllm(text)
    assert sample.engine == "trtllm"
    assert sample.generation == "trtllm-full"
    assert sample.engines == 1
    (model,) = {labels["model_name"] for labels, _ in samples(text, "trtllm_prompt_tokens_total")}
    assert sample.model_names == [model]
    assert sample.gauges["kv_cache_usage"] == total(text, "trtllm_kv_cache_utilization")
    assert sample.gauges["requests_running"] == total(text, "trtllm_num_requests_running") > 0
    assert sample.gauges["requests_waiting"] == total(text, "trtllm_num_requests_waiting") > 0
    assert sample.gauges["prefix_cache_hit_rate_gauge"] == total(text, "trtllm_kv_cache_hit_rate")
    prompt = total(text, "trtllm_prompt_tokens_total")
    assert sample.counters["prompt_tokens"] == prompt
    assert sample.counters["generation_tokens"] == total(text, "trtllm_generation_tokens_total")
    # Prefix cache in tokens: all prompt tokens queried, the cached ones hit.
    assert sample.counters["prefix_cache_queries"] == prompt
    assert sample.counters["prefix_cache_hits"] == total(text, "trtllm_prompt_cached_tokens_total")
    for reason in ("stop", "length"):
        assert sample.counters[f"requests_finished_{reason}"] == total(
            text, "trtllm_request_success_total", finished_reason=reason
        )
    blocks = total(text, "trtllm_kv_cache_max_blocks")
    per_block = total(text, "trtllm_kv_cache_tokens_per_block")
    assert sample.cache.num_gpu_blocks == blocks
    assert sample.cache.block_size == per_block
    assert sample.cache.capacity_tokens == blocks * per_block
    # Only what TensorRT-LLM never exposes is unavailable here.
    assert set(sample.unavailable) == {
        "preemptions",
        "requests_waiting_capacity",
        "admission_rejections",
    }
    assert sample.counters["preemptions"] is None


def test_gauges_carry_the_multiprocess_pid_label_and_no_created_series() -> None:
    text = read(FULL)
    (labels, _), *_ = samples(text, "trtllm_num_requests_running")
    assert "pid" in labels
    assert "_created" not in text
    # A second process's gauges add up; occupancy takes the max, never a sum.
    second = "\n".join(
        line.replace(f'pid="{labels["pid"]}"', 'pid="1"')
        for line in text.splitlines()
        if line.startswith(("trtllm_num_requests_running", "trtllm_kv_cache_utilization"))
    )
    both = parse_trtllm(text + second + "\n")
    one = parse_trtllm(text)
    assert both.gauges["requests_running"] == 2 * (one.gauges["requests_running"] or 0)
    assert both.gauges["kv_cache_usage"] == one.gauges["kv_cache_usage"]


def test_speculative_decoding_counts_and_positions() -> None:
    text = read(FULL)
    sample = parse_trtllm(text)
    drafted = [
        total(text, "trtllm_spec_decode_drafted_tokens_total", token_position=str(p))
        for p in range(3)
    ]
    accepted = [
        total(text, "trtllm_spec_decode_accepted_tokens_total", token_position=str(p))
        for p in range(3)
    ]
    assert sample.counters["spec_decode_draft_tokens"] == total(
        text, "trtllm_spec_decode_num_draft_tokens_total"
    )
    assert sample.counters["spec_decode_accepted_tokens"] == total(
        text, "trtllm_spec_decode_num_accepted_tokens_total"
    )
    # Each draft drafts position 0: the number of drafts.
    assert sample.counters["spec_decode_drafts"] == drafted[0] > 0
    assert sample.accepted_per_position == accepted
    assert accepted[0] > accepted[1] > accepted[2] > 0
    assert sample.gauges["spec_decode_acceptance_length_gauge"] == total(
        text, "trtllm_spec_decode_acceptance_length"
    )


def test_without_iteration_counters_the_per_position_ones_give_the_totals() -> None:
    text = read(FULL)
    lines = [
        line for line in text.splitlines() if not line.startswith(("trtllm_spec_decode_num_", "# "))
    ]
    sample = parse_trtllm("\n".join(lines) + "\n")
    assert sample.counters["spec_decode_draft_tokens"] == total(
        text, "trtllm_spec_decode_drafted_tokens_total"
    )
    assert sample.counters["spec_decode_accepted_tokens"] == total(
        text, "trtllm_spec_decode_accepted_tokens_total"
    )


def test_it_keeps_the_histograms_buckets() -> None:
    text = read(FULL)
    sample = parse_trtllm(text)
    for field, base in (
        ("ttft", "trtllm_time_to_first_token_seconds"),
        ("itl", "trtllm_time_per_output_token_seconds"),
        ("e2e", "trtllm_e2e_request_latency_seconds"),
        ("queue", "trtllm_request_queue_time_seconds"),
    ):
        buckets = samples(text, f"{base}_bucket")
        histogram = sample.histograms[field]
        assert histogram.bounds == tuple(float(labels["le"]) for labels, _ in buckets)
        assert histogram.counts == tuple(count for _, count in buckets)
        assert histogram.count == total(text, f"{base}_count") > 0
        assert histogram.total == pytest.approx(total(text, f"{base}_sum"))


def test_without_iteration_stats_the_full_stage_says_what_is_missing() -> None:
    text = read(FULL)
    iteration = (
        "trtllm_kv_cache_utilization",
        "trtllm_kv_cache_max_blocks",
        "trtllm_kv_cache_used_blocks",
        "trtllm_kv_cache_tokens_per_block",
        "trtllm_num_requests_",
    )
    lines = [line for line in text.splitlines() if not line.startswith(iteration)]
    sample = parse_trtllm("\n".join(lines) + "\n")
    assert sample.generation == "trtllm-full"
    for quantity in ("kv_cache_occupancy", "kv_cache_capacity_tokens", "requests_running"):
        assert "enable_iter_perf_stats" in sample.unavailable[quantity]
    assert sample.gauges["kv_cache_usage"] is None
    assert sample.gauges["requests_running"] is None
    assert sample.cache.capacity_tokens is None


def test_it_reads_the_kv_gauge_stage() -> None:
    text = read(KV)
    sample = parse_trtllm(text)
    assert sample.generation == "trtllm-kv"
    assert sample.model_names == []  # labelled "undefined" before PR #12545
    assert sample.gauges["kv_cache_usage"] == total(text, "trtllm_kv_cache_utilization")
    assert sample.gauges["prefix_cache_hit_rate_gauge"] == total(text, "trtllm_kv_cache_hit_rate")
    assert "prefix_cache_hit_rate" not in sample.unavailable
    for quantity in ("requests_running", "prompt_tokens", "spec_decode_acceptance"):
        assert sample.unavailable[quantity].startswith("not exposed by trtllm-serve before")
    assert sample.gauges["requests_running"] is None
    assert sample.counters["prompt_tokens"] is None
    assert sample.counters["spec_decode_drafts"] is None
    # Before PR #12545 a zero queue time was not recorded: fewer queue samples than requests.
    assert sample.histograms["queue"].count == total(
        text, "trtllm_request_queue_time_seconds_count"
    )
    assert sample.histograms["queue"].count < sample.histograms["e2e"].count


def test_it_reads_the_unprefixed_basic_stage() -> None:
    text = read(BASIC)
    assert samples(text, "request_success_total")
    assert not [line for line in text.splitlines() if line.startswith("trtllm")]
    sample = parse_trtllm(text)
    assert sample.generation == "trtllm-basic"
    assert sample.counters["requests_finished_stop"] == total(
        text, "request_success_total", finished_reason="stop"
    )
    assert sample.histograms["ttft"].count == total(text, "time_to_first_token_seconds_count")
    assert sample.histograms["e2e"].total == pytest.approx(
        total(text, "e2e_request_latency_seconds_sum")
    )
    for quantity in ("kv_cache_occupancy", "requests_waiting", "generation_tokens"):
        assert sample.unavailable[quantity].startswith("not exposed by"), quantity
    assert sample.gauges["kv_cache_usage"] is None
    assert sample.counters["generation_tokens"] is None


def test_dynamo_s_prefixes_and_the_pr_sample_s_label_read_the_same() -> None:
    text = read(BASIC)
    plain = parse_trtllm(text)
    for prefix in ("trtllm:", "trtllm_"):
        renamed = "\n".join(
            prefix + line if line[:1] not in ("#", "") else line for line in text.splitlines()
        )
        sample = parse_trtllm(renamed + "\n")
        assert sample.counters == plain.counters
        assert sample.histograms == plain.histograms
    # PR #5785's description shows finish_reason where the merged code says finished_reason.
    old_label = parse_trtllm(text.replace("finished_reason=", "finish_reason="))
    assert old_label.counters["requests_finished_stop"] == plain.counters["requests_finished_stop"]


def test_the_json_metrics_endpoint_is_refused_with_the_way_out() -> None:
    body = json.dumps(
        [
            {
                "iter": 12,
                "numActiveRequests": 3,
                "numQueuedRequests": 0,
                "kvCacheStats": {"maxNumBlocks": 4096, "usedNumBlocks": 120},
            }
        ]
    )
    with pytest.raises(ScrapeFormatError, match="/prometheus/metrics"):
        parse_trtllm(body)
    with pytest.raises(ScrapeFormatError, match="/prometheus/metrics"):
        parse_replica("trtllm", "\n" + body + "\n")


def test_an_empty_body_and_another_engine_are_refused() -> None:
    with pytest.raises(ScrapeFormatError, match="empty"):
        parse_trtllm("")
    with pytest.raises(ScrapeFormatError, match="TensorRT-LLM"):
        parse_trtllm(read(VLLM_032))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("<html><body>Not Found</body></html>\n", "not a metric sample"),
        ("trtllm_num_requests_running 3", "truncated"),
        ('trtllm_e2e_request_latency_seconds_bucket{le="x"} 3\n', "not a number"),
        ('trtllm_spec_decode_drafted_tokens_total{token_position="-1"} 3\n', "token_position"),
        ("trtllm_num_requests_running 3\ntrtllm_num_requests_running 4\n", "duplicate series"),
    ],
)
def test_malformed_bodies_give_clear_errors(body: str, message: str) -> None:
    with pytest.raises(ScrapeFormatError, match=message):
        parse_trtllm(body)


def test_auto_detection_and_the_engine_registry_pick_trtllm() -> None:
    for fixture in (FULL, KV, BASIC):
        text = read(fixture)
        assert detect_engine(text) == "trtllm"
        assert parse_replica("auto", text) == parse_trtllm(text)


@pytest.mark.parametrize("fixture", [FULL, KV, BASIC])
def test_every_unavailable_key_is_a_canonical_quantity(fixture) -> None:  # type: ignore[no-untyped-def]
    unavailable = parse_trtllm(read(fixture)).unavailable
    assert unavailable and set(unavailable) <= set(QUANTITIES)
