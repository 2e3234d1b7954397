"""vLLM 0.32's newer families on real captures: the shared 0.32 capture and the ones
tests/fixtures/capture_vllm_032.py made from the real CPU build with the features on (queue
limits, MFU counters, LoRA, the NaN check). Each canonical value must equal what the capture's
own lines say, read here by a filter that shares nothing with the normalizer; a family the
capture lacks gives None, never 0."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from collectors.engines.vllm import parse_vllm
from tests.conftest import OWN_FIXTURES, VLLM_032, read

SHEDDING = OWN_FIXTURES / "vllm-0.32.0-cpu-mfu-shedding.prom"
LORA = OWN_FIXTURES / "vllm-0.32.0-cpu-lora.prom"
PREFILL_HEAVY = OWN_FIXTURES / "vllm-0.32.0-cpu-prefill-heavy.prom"
OLD = OWN_FIXTURES / "vllm-0.10.2-dp2.prom"  # before every family below
CAPTURES = [VLLM_032, SHEDDING, LORA, PREFILL_HEAVY, OLD]

# Canonical counter: (series name as exposed, the one label it must carry or None).
COUNTERS: dict[str, tuple[str, str | None]] = {
    "admission_rejections": ("vllm:admission_rejections_total", None),
    "estimated_flops": ("vllm:estimated_flops_per_gpu_total", None),
    "estimated_read_bytes": ("vllm:estimated_read_bytes_per_gpu_total", None),
    "estimated_write_bytes": ("vllm:estimated_write_bytes_per_gpu_total", None),
    "prompt_tokens_cached_device": ("vllm:prompt_tokens_cached_by_source_total", 'source="device"'),
    "prompt_tokens_cached_host": ("vllm:prompt_tokens_cached_by_source_total", 'source="host"'),
    "prompt_tokens_cached_p2p": ("vllm:prompt_tokens_cached_by_source_total", 'source="p2p"'),
    "prompt_tokens_cached_disk": ("vllm:prompt_tokens_cached_by_source_total", 'source="disk"'),
    "prompt_tokens_cached_external": (
        "vllm:prompt_tokens_cached_by_source_total",
        'source="external_unspecified"',
    ),
    "external_prefix_cache_queries": ("vllm:external_prefix_cache_queries_total", None),
    "external_prefix_cache_hits": ("vllm:external_prefix_cache_hits_total", None),
    "prefill_kv_computed_tokens_sum": ("vllm:request_prefill_kv_computed_tokens_sum", None),
    "prefill_kv_computed_tokens_count": ("vllm:request_prefill_kv_computed_tokens_count", None),
    "mm_cache_queries": ("vllm:mm_cache_queries_total", None),
    "mm_cache_hits": ("vllm:mm_cache_hits_total", None),
    "corrupted_requests": ("vllm:corrupted_requests_total", None),
    "kv_offload_load_bytes": ("vllm:kv_offload_load_bytes_total", None),
    "kv_offload_store_bytes": ("vllm:kv_offload_store_bytes_total", None),
}
SLEEP_LEVELS = {"awake": 0, "weights_offloaded": 1, "discard_all": 2}


def lines(text: str, name: str, label: str | None = None) -> list[tuple[str, float]]:
    """(labels, value) of every sample line of series `name` (with `label`, if given)."""
    found = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, labels = series.partition("{")
        if metric == name and (label is None or label in labels):
            found.append((labels, float(value)))
    return found


def raw_sum(text: str, name: str, label: str | None = None) -> float | None:
    found = lines(text, name, label)
    return sum(value for _, value in found) if found else None


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda path: Path(path).stem)
@pytest.mark.parametrize("canonical", sorted(COUNTERS))
def test_each_counter_is_the_sum_of_its_lines_or_none(capture: Path, canonical: str) -> None:
    text = read(capture)
    name, label = COUNTERS[canonical]
    assert parse_vllm(text).counters[canonical] == raw_sum(text, name, label)


@pytest.mark.parametrize("capture", CAPTURES[:-1], ids=lambda path: Path(path).stem)
def test_the_sleep_level_is_the_highest_state_an_engine_is_in(capture: Path) -> None:
    text = read(capture)
    levels = [
        level
        for state, level in SLEEP_LEVELS.items()
        for _, value in lines(text, "vllm:engine_sleep_state", f'sleep_state="{state}"')
        if value == 1
    ]
    assert levels  # every 0.32 capture has the gauge
    assert parse_vllm(text).gauges["sleep_level"] == max(levels)


def _latest_lora_info(text: str) -> dict[str, str]:
    """The labels of vllm:lora_requests_info's newest line: vLLM sets each label set's value
    to the time it was last current and never removes the old ones."""
    found = lines(text, "vllm:lora_requests_info")
    labels, _ = max(found, key=lambda line: line[1])
    return dict(re.findall(r'(\w+)="([^"]*)"', labels))


def _named(adapters: str) -> list[str]:
    return [name for name in adapters.split(",") if name]


@pytest.mark.parametrize("capture", [SHEDDING, LORA, PREFILL_HEAVY], ids=lambda p: p.stem)
def test_lora_adapters_running_and_waiting_are_the_newest_line_s(capture: Path) -> None:
    text = read(capture)
    info = _latest_lora_info(text)
    sample = parse_vllm(text)
    assert sample.gauges["lora_adapters_running"] == len(_named(info["running_lora_adapters"]))
    assert sample.gauges["lora_adapters_waiting"] == len(_named(info["waiting_lora_adapters"]))


def test_the_lora_capture_has_its_adapter_running_and_waiting() -> None:
    sample = parse_vllm(read(LORA))
    assert sample.gauges["lora_adapters_running"] == 1
    assert sample.gauges["lora_adapters_waiting"] == 1
    assert sample.lora == {"running": ["tiny-lora"], "waiting": ["tiny-lora"], "max_lora": 1}


def test_the_shedding_capture_counted_refusals_and_flops() -> None:
    text = read(SHEDDING)
    sample = parse_vllm(text)
    refused = int(text.splitlines()[0].split(" answered HTTP 503")[0].rsplit(" ", 1)[1])
    assert refused > 0
    assert sample.counters["admission_rejections"] == refused  # the header's client count
    flops = sample.counters["estimated_flops"]
    assert flops is not None and flops > 0


@pytest.mark.parametrize("capture", CAPTURES[:-1], ids=lambda path: Path(path).stem)
def test_the_iteration_tokens_histogram_is_the_capture_s(capture: Path) -> None:
    text = read(capture)
    buckets = lines(text, "vllm:iteration_tokens_total_bucket")
    bounds = [float(labels.split('le="')[1].split('"')[0]) for labels, _ in buckets]
    histogram = parse_vllm(text).histograms["iteration_tokens"]
    assert list(histogram.bounds) == bounds and bounds[-1] == math.inf
    assert list(histogram.counts) == [value for _, value in buckets]
    assert histogram.total == raw_sum(text, "vllm:iteration_tokens_total_sum")


def test_absent_families_are_none_not_zero() -> None:
    shared = parse_vllm(read(VLLM_032))  # no LoRA, no NaN check, no offload there
    assert shared.counters["corrupted_requests"] is None
    assert shared.counters["kv_offload_load_bytes"] is None
    assert shared.gauges["lora_adapters_running"] is None
    assert shared.gauges["lora_adapters_waiting"] is None
    assert shared.gauges["kv_offload_usage"] is None
    old_text = read(OLD)
    assert "vllm:engine_sleep_state" not in old_text and "admission" not in old_text
    old = parse_vllm(old_text)
    for canonical in COUNTERS:
        assert old.counters[canonical] is None, canonical
    assert old.gauges["sleep_level"] is None
    assert old.gauges["lora_adapters_running"] is None


def test_the_capture_headers_say_how_they_were_made() -> None:
    for capture in (SHEDDING, LORA, PREFILL_HEAVY):
        first = read(capture).splitlines()[0]
        assert first.startswith("# Captured from a real vLLM 0.32.0 CPU build"), capture
        assert "--enable-mfu-metrics" in first and "--max-num-queued-reqs 4" in first
