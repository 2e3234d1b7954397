"""SGLang normalization, per generation, on expositions made by SGLang's own metrics code
(tests/fixtures/sglang-generate.py; expected numbers from what was fed to it, the .json
beside each) and on verbatim captures from SGLang's docs, issues and PRs (expected numbers
read from the capture with prometheus_client's parser, independently of the normalizer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.engines import detect_engine, parse_replica
from collectors.engines.sglang import parse_sglang
from collectors.parse import ScrapeFormatError
from tests.conftest import OWN_FIXTURES, read

GENERATED = {
    "0.4.0": "sglang-0.4.0",
    "0.4.6": "sglang-0.4.6",
    "0.5.4": "sglang-0.5.4-dp2",
    "0.5.10": "sglang-0.5.10-tp2-all-schedulers",
    "0.5.16": "sglang-0.5.16-spec",
    "0.5.23": "sglang-0.5.23-priority",
}
# The generation each release's names and labels are read as.
GENERATION = {
    "0.4.0": "0.4.0",
    "0.4.6": "0.4.6",
    "0.5.4": "0.5.0",
    "0.5.10": "0.5.10",
    "0.5.16": "0.5.16",
    "0.5.23": "0.5.23",
}


def fed(stem: str) -> dict[str, Any]:
    return json.loads(read(OWN_FIXTURES / f"{stem}.json"))


def total(value: Any) -> float:
    """A scheduler stat as fed: a number, or a QueueCount's {"total", "by_priority"}."""
    return float(value["total"] if isinstance(value, dict) else value)


def distinct_schedulers(inputs: dict[str, Any]) -> list[dict[str, Any]]:
    """One scheduler per data-parallel rank: TP ranks writing the same stats are one."""
    by_dp: dict[Any, dict[str, Any]] = {}
    for scheduler in inputs["schedulers"]:
        by_dp.setdefault(scheduler["labels"].get("dp_rank"), scheduler)
    return list(by_dp.values())


def first_line(path: Path) -> str:
    return read(path).splitlines()[0]


@pytest.mark.parametrize("release", GENERATED)
def test_each_fixture_says_where_it_came_from(release: str) -> None:
    header = first_line(OWN_FIXTURES / f"{GENERATED[release]}.prom")
    assert header.startswith("# Produced by SGLang") and f"sglang=={release}" in header


@pytest.mark.parametrize("release", GENERATED)
def test_sglang_s_own_exposition_normalizes_to_what_its_code_was_fed(release: str) -> None:
    stem = GENERATED[release]
    inputs = fed(stem)
    sample = parse_sglang(read(OWN_FIXTURES / f"{stem}.prom"))
    schedulers = distinct_schedulers(inputs)
    requests = inputs["tokenizer"]["requests"]

    assert sample.engine == "sglang"
    assert sample.generation == GENERATION[release]
    assert sample.model_names == [inputs["model"]]
    assert sample.engines == len(schedulers)
    stats = [s["stats"] for s in schedulers]
    # Queues add up over data-parallel ranks; occupancy is the fullest rank's and the mean.
    assert sample.gauges["requests_running"] == sum(total(s["num_running_reqs"]) for s in stats)
    assert sample.gauges["requests_waiting"] == sum(total(s["num_queue_reqs"]) for s in stats)
    assert sample.gauges["kv_cache_usage"] == max(s["token_usage"] for s in stats)
    assert sample.gauges["kv_cache_usage_mean"] == pytest.approx(
        sum(s["token_usage"] for s in stats) / len(stats)
    )
    # Tokenizer counters add up over every request label (priority, is_streaming…).
    assert sample.counters["prompt_tokens"] == sum(r["prompt_tokens"] for r in requests)
    assert sample.counters["generation_tokens"] == sum(r["generation_tokens"] for r in requests)
    for name in ("ttft", "e2e"):
        assert sample.histograms[name].count == len(requests)
        assert sample.histograms[name].bounds[-1] == float("inf")
    assert sample.histograms["ttft"].total == pytest.approx(sum(r["ttft"] for r in requests))
    assert sample.histograms["e2e"].total == pytest.approx(sum(r["e2e"] for r in requests))
    # One ITL observation per generated token interval fed (≤0.4.3: time_per_output_token).
    assert sample.histograms["itl"].count == sum(len(r["itl"]) for r in requests)
    assert sample.histograms["itl"].total == pytest.approx(sum(sum(r["itl"]) for r in requests))
    assert sample.unavailable["requests_waiting_capacity"].startswith("not exposed by SGLang")
    assert sample.gauges["requests_waiting_capacity"] is None


@pytest.mark.parametrize("release", ["0.4.6", "0.5.4", "0.5.10", "0.5.16", "0.5.23"])
def test_prefix_cache_lookups_are_prompt_tokens_and_hits_the_cached_tokens(release: str) -> None:
    stem = GENERATED[release]
    requests = fed(stem)["tokenizer"]["requests"]
    sample = parse_sglang(read(OWN_FIXTURES / f"{stem}.prom"))
    # SGLang's prompt tokens include the cached ones; cached_tokens_total (every cache_source)
    # are the hits.
    assert sample.counters["prefix_cache_queries"] == sum(r["prompt_tokens"] for r in requests)
    assert sample.counters["prefix_cache_hits"] == sum(r["cached_tokens"] for r in requests)
    assert 0 < sample.counters["prefix_cache_hits"] < sample.counters["prefix_cache_queries"]


def test_0_4_0_has_only_the_engine_s_own_hit_rate_gauge() -> None:
    stem = GENERATED["0.4.0"]
    stats = fed(stem)["schedulers"][0]["stats"]
    sample = parse_sglang(read(OWN_FIXTURES / f"{stem}.prom"))
    assert sample.counters.get("prefix_cache_hits") is None
    assert sample.gauges["prefix_cache_hit_rate_gauge"] == stats["cache_hit_rate"]


@pytest.mark.parametrize("release", ["0.4.0", "0.4.6", "0.5.4"])
def test_before_0_5_10_capacity_and_retractions_are_unavailable_with_why(release: str) -> None:
    sample = parse_sglang(read(OWN_FIXTURES / f"{GENERATED[release]}.prom"))
    assert sample.counters["preemptions"] is None
    assert sample.cache.capacity_tokens is None
    assert "before 0.5.10" in sample.unavailable["preemptions"]
    assert "max_total_num_tokens" in sample.unavailable["kv_cache_capacity_tokens"]


def test_0_5_4_s_retraction_gauge_is_not_taken_for_a_counter() -> None:
    text = read(OWN_FIXTURES / f"{GENERATED['0.5.4']}.prom")
    assert "sglang:num_retracted_reqs{" in text  # there, per interval, with a pid label
    sample = parse_sglang(text)
    assert sample.counters["preemptions"] is None
    assert "per-interval gauge" in sample.unavailable["preemptions"]


@pytest.mark.parametrize("release", ["0.5.10", "0.5.16", "0.5.23"])
def test_from_0_5_10_retractions_and_capacity_are_read(release: str) -> None:
    stem = GENERATED[release]
    inputs = fed(stem)
    sample = parse_sglang(read(OWN_FIXTURES / f"{stem}.prom"))
    schedulers = distinct_schedulers(inputs)
    assert sample.counters["preemptions"] == sum(
        s["retracted"]["num_retracted_reqs"] for s in schedulers
    )
    capacity = [
        s["stats"].get("max_total_num_tokens") or s["constants"]["max_total_num_tokens"]
        for s in schedulers
    ]
    assert sample.cache.capacity_tokens == sum(capacity)
    assert "preemptions" not in sample.unavailable
    assert "kv_cache_capacity_tokens" not in sample.unavailable


def test_0_5_16_pages_and_speculative_decoding() -> None:
    stem = GENERATED["0.5.16"]
    scheduler = fed(stem)["schedulers"][0]
    sample = parse_sglang(read(OWN_FIXTURES / f"{stem}.prom"))
    assert sample.cache.block_size == scheduler["constants"]["page_size"]
    assert sample.cache.num_gpu_blocks == scheduler["constants"]["num_pages"]
    assert (
        sample.gauges["spec_decode_acceptance_length_gauge"]
        == scheduler["stats"]["spec_accept_length"]
    )
    assert (
        sample.gauges["spec_decode_acceptance_rate_gauge"] == scheduler["stats"]["spec_accept_rate"]
    )
    # SGLang has no drafted/accepted token counters: these stay absent, not zero.
    assert sample.counters.get("spec_decode_draft_tokens") is None


def test_without_speculative_decoding_the_zero_gauges_are_absent_not_zero() -> None:
    stem = GENERATED["0.5.23"]
    text = read(OWN_FIXTURES / f"{stem}.prom")
    assert "sglang:spec_accept_length{" in text  # SGLang writes 0 when nothing was drafted
    sample = parse_sglang(text)
    assert sample.gauges["spec_decode_acceptance_length_gauge"] is None
    assert sample.gauges["spec_decode_acceptance_rate_gauge"] is None


def test_dp_ranks_add_up_and_tp_ranks_writing_the_same_gauges_count_once() -> None:
    dp = fed(GENERATED["0.5.4"])
    dp_sample = parse_sglang(read(OWN_FIXTURES / f"{GENERATED['0.5.4']}.prom"))
    assert len({s["labels"]["dp_rank"] for s in dp["schedulers"]}) == dp_sample.engines == 2
    assert dp_sample.histograms["queue"].count == sum(
        len(s["queue_times"]) for s in dp["schedulers"]
    )
    tp = fed(GENERATED["0.5.10"])
    tp_text = read(OWN_FIXTURES / f"{GENERATED['0.5.10']}.prom")
    assert 'tp_rank="1"' in tp_text  # both TP ranks wrote the scheduler's gauges
    tp_sample = parse_sglang(tp_text)
    assert tp_sample.engines == 1
    assert tp_sample.gauges["requests_running"] == tp["schedulers"][0]["stats"]["num_running_reqs"]
    assert tp_sample.histograms["queue"].count == len(tp["schedulers"][0]["queue_times"])


def test_priority_totals_are_read_and_their_breakdown_not_added_again() -> None:
    stem = GENERATED["0.5.23"]
    stats = fed(stem)["schedulers"][0]["stats"]
    text = read(OWN_FIXTURES / f"{stem}.prom")
    assert 'priority="1"' in text
    sample = parse_sglang(text)
    assert sample.gauges["requests_running"] == stats["num_running_reqs"]["total"]
    assert sample.gauges["requests_waiting"] == stats["num_queue_reqs"]["total"]


# --- verbatim captures -------------------------------------------------------------------

CAPTURES = {
    "sglang-0.4-docs-capture.prom": "0.4.0",
    "sglang-0.4.4-pr-4444.prom": "0.4.6",
    "sglang-0.5.1-issue-13485.prom": "0.5.0",
    "sglang-pre-0.4-pr-1853.prom": "pre-0.4",
    "sglang-0.5-gateway-smg-813.prom": "0.5.10",
}


def values(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by name, straight from prometheus_client's parser (`sglang_` as `sglang:`)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = "sglang:" + s.name[7:] if s.name.startswith("sglang_") else s.name
            out.setdefault(name, []).append((s.labels, float(s.value)))
    return out


def only(found: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    (series,) = found[name]
    return series[1]


@pytest.mark.parametrize("capture", CAPTURES)
def test_each_verbatim_capture_says_where_it_came_from(capture: str) -> None:
    assert first_line(OWN_FIXTURES / capture).startswith("# Verbatim from ")


@pytest.mark.parametrize(("capture", "generation"), CAPTURES.items())
def test_verbatim_captures_are_detected_and_read(capture: str, generation: str) -> None:
    text = read(OWN_FIXTURES / capture)
    found = values(text)
    sample = parse_sglang(text)
    assert detect_engine(text) == "sglang"
    assert sample.engine == "sglang" and sample.generation == generation
    labels = [lbl for series in found.values() for lbl, _ in series]
    assert sample.model_names == sorted(
        {lbl.get("model_name", lbl.get("name", "")) for lbl in labels} - {""}
    )
    for key, name in (
        ("kv_cache_usage", "sglang:token_usage"),
        ("requests_running", "sglang:num_running_reqs"),
        ("requests_waiting", "sglang:num_queue_reqs"),
        ("prefix_cache_hit_rate_gauge", "sglang:cache_hit_rate"),
    ):
        assert sample.gauges[key] == (only(found, name) if name in found else None), key
    assert sample.counters["prompt_tokens"] == (
        only(found, "sglang:prompt_tokens_total") if "sglang:prompt_tokens_total" in found else None
    )


def test_the_docs_capture_keeps_its_ttft_buckets() -> None:
    text = read(OWN_FIXTURES / "sglang-0.4-docs-capture.prom")
    found = values(text)
    ttft = parse_sglang(text).histograms["ttft"]
    buckets = sorted(
        (float(lbl["le"]), v) for lbl, v in found["sglang:time_to_first_token_seconds_bucket"]
    )
    assert ttft.bounds == tuple(b for b, _ in buckets)
    assert ttft.counts == tuple(c for _, c in buckets)
    assert ttft.total == only(found, "sglang:time_to_first_token_seconds_sum")


def test_the_first_format_s_name_label_and_capacity() -> None:
    text = read(OWN_FIXTURES / "sglang-pre-0.4-pr-1853.prom")
    sample = parse_sglang(text)
    assert sample.cache.capacity_tokens == only(values(text), "sglang:max_total_num_tokens")
    assert "kv_cache_capacity_tokens" not in sample.unavailable


# --- dispatch and refusals -----------------------------------------------------------------


def test_auto_reads_an_sglang_scrape_as_sglang() -> None:
    text = read(OWN_FIXTURES / f"{GENERATED['0.5.23']}.prom")
    assert parse_replica("auto", text) == parse_replica("sglang", text) == parse_sglang(text)


def test_a_vllm_scrape_is_not_an_sglang_one() -> None:
    with pytest.raises(ScrapeFormatError, match="no SGLang metric"):
        parse_sglang(read(OWN_FIXTURES / "vllm-0.8.5-v1.prom"))


def test_the_series_cap_applies() -> None:
    text = read(OWN_FIXTURES / f"{GENERATED['0.5.23']}.prom")
    with pytest.raises(ScrapeFormatError, match="max_series"):
        parse_sglang(text, max_series=10)
