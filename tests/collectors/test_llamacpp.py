"""llama.cpp's server /metrics normalized into the canonical sample, per generation: captures
from the real server built here (b11434; tests/fixtures/capture_llamacpp.py), and older
generations' real captures quoted in issues and READMEs (each fixture's first line says where
it came from). Every expected number is read from the fixture's own text here, by a reader
independent of the collector's parser."""

from __future__ import annotations

import pytest

from collectors.engines import detect_engine, parse_replica
from collectors.engines.llamacpp import (
    NO_CACHED_COUNTER,
    NO_HIT_COUNTER,
    NO_KV,
    NO_SPEC,
    UNAVAILABLE,
    parse_llamacpp,
)
from collectors.parse import ScrapeFormatError
from kneepoint.samples import QUANTITIES, unavailable_reason
from tests.conftest import OWN_FIXTURES, VLLM_032, read

BUSY = OWN_FIXTURES / "llamacpp-b11434-busy.prom"
SPEC = OWN_FIXTURES / "llamacpp-b11434-spec.prom"
NO_KV_2025 = OWN_FIXTURES / "llamacpp-2025-06-pr-13196.prom"
KV_GAUGES = OWN_FIXTURES / "llamacpp-7841fc7-busy.prom"
IK_LLAMA = OWN_FIXTURES / "llamacpp-ik_llama-kv-gauges-capture.prom"
ALL = (BUSY, SPEC, NO_KV_2025, KV_GAUGES, IK_LLAMA)


def samples(text: str, name: str) -> list[tuple[str, float]]:
    """(label text, value) of every sample line named exactly `name`."""
    found = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, labels = head.partition("{")
        if metric == name:
            found.append((labels.rstrip("}"), float(value)))
    return found


def value(text: str, name: str) -> float:
    (only,) = samples(text, name)
    return only[1]


def test_it_reads_the_newest_build_under_load() -> None:
    """The real b11434 server, busy."""
    text = read(BUSY)
    sample = parse_llamacpp(text)
    assert (sample.engine, sample.generation) == ("llamacpp", "cached-tokens")
    assert (sample.engines, sample.model_names) == (1, [])
    assert sample.gauges["requests_running"] == value(text, "llamacpp:requests_processing") > 0
    assert sample.gauges["requests_waiting"] == value(text, "llamacpp:requests_deferred") > 0
    assert sample.counters["generation_tokens"] == value(text, "llamacpp:tokens_predicted_total")
    computed = value(text, "llamacpp:prompt_tokens_total")
    cached = value(text, "llamacpp:prompt_tokens_cached_total")
    assert computed > 0 and cached > 0
    # prompt_tokens_total excludes the cached tokens: all prompt tokens are the sum.
    assert sample.counters["prompt_tokens"] == computed + cached
    assert sample.counters["prompt_tokens_local_compute"] == computed
    assert sample.counters["prompt_tokens_local_cache_hit"] == cached
    assert sample.counters["prefix_cache_queries"] == computed + cached
    assert sample.counters["prefix_cache_hits"] == cached
    # No KV gauge, no histogram, no preemption: null with the reason, never a zero.
    assert sample.gauges["kv_cache_usage"] is None and sample.gauges["kv_cache_usage_mean"] is None
    assert sample.unavailable["kv_cache_occupancy"] == NO_KV
    assert sample.cache.capacity_tokens is None
    assert sample.histograms == {}
    assert sample.counters["preemptions"] is None
    for quantity in ("ttft", "itl", "e2e", "preemptions", "kv_cache_capacity_tokens"):
        assert sample.unavailable[quantity] == UNAVAILABLE[quantity]
    assert "prompt_tokens" not in sample.unavailable
    assert "prefix_cache_hit_rate" not in sample.unavailable
    # The server has the speculative counters (at 0 without a draft model): they are counts.
    assert sample.counters["spec_decode_drafts"] == value(
        text, "llamacpp:spec_decode_num_drafts_total"
    )
    assert "spec_decode_acceptance" not in sample.unavailable
    assert sample.accepted_per_position is None


def test_the_kv_reason_is_the_one_the_pages_and_alerts_show() -> None:
    sample = parse_llamacpp(read(BUSY))
    reason = "not exposed by llama.cpp since its KV gauges were removed"
    assert sample.unavailable["kv_cache_occupancy"].startswith(reason)
    for number in QUANTITIES["kv_cache_occupancy"]:
        assert (
            unavailable_reason(sample.unavailable, number)
            == sample.unavailable["kv_cache_occupancy"]
        )


def test_speculative_counters_and_per_position_acceptance() -> None:
    text = read(SPEC)
    sample = parse_llamacpp(text)
    drafts = value(text, "llamacpp:spec_decode_num_drafts_total")
    draft_tokens = value(text, "llamacpp:spec_decode_num_draft_tokens_total")
    accepted = value(text, "llamacpp:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and draft_tokens >= drafts
    assert sample.counters["spec_decode_drafts"] == drafts
    assert sample.counters["spec_decode_draft_tokens"] == draft_tokens
    assert sample.counters["spec_decode_accepted_tokens"] == accepted
    per_position = samples(text, "llamacpp:spec_decode_num_accepted_tokens_per_pos_total")
    assert per_position, "the labelled counter appears after the first speculative request"
    by_position = {int(labels.split('"')[1]): v for labels, v in per_position}
    assert sample.accepted_per_position == [by_position[i] for i in range(len(by_position))]
    assert sum(sample.accepted_per_position) == accepted


def test_a_2025_build_has_no_kv_gauge_and_no_cached_counter() -> None:
    text = read(NO_KV_2025)
    sample = parse_llamacpp(text)
    assert sample.generation == "no-kv-gauges"
    # Its prompt_tokens_total excludes cached tokens and nothing counts those: all prompt
    # tokens are unknown, not the computed ones passed off as all.
    assert sample.counters["prompt_tokens"] is None
    assert sample.unavailable["prompt_tokens"] == NO_CACHED_COUNTER
    assert "excludes" in NO_CACHED_COUNTER
    assert sample.counters["prompt_tokens_local_compute"] == value(
        text, "llamacpp:prompt_tokens_total"
    )
    assert sample.counters["generation_tokens"] == value(text, "llamacpp:tokens_predicted_total")
    assert sample.counters["prefix_cache_queries"] is None
    assert sample.counters["prefix_cache_hits"] is None
    assert sample.unavailable["prefix_cache_hit_rate"] == NO_HIT_COUNTER
    assert sample.unavailable["kv_cache_occupancy"] == NO_KV
    assert sample.unavailable["spec_decode_acceptance"] == NO_SPEC
    assert sample.counters["spec_decode_drafts"] is None


@pytest.mark.parametrize("path", [KV_GAUGES, IK_LLAMA], ids=lambda p: p.name)
def test_a_build_with_the_kv_gauges_reads_them(path) -> None:  # type: ignore[no-untyped-def]
    text = read(path)
    sample = parse_llamacpp(text)
    assert sample.generation == "kv-gauges"
    ratio = value(text, "llamacpp:kv_cache_usage_ratio")
    assert 0 < ratio < 1
    assert sample.gauges["kv_cache_usage"] == sample.gauges["kv_cache_usage_mean"] == ratio
    assert "kv_cache_occupancy" not in sample.unavailable
    assert sample.gauges["requests_running"] == value(text, "llamacpp:requests_processing")
    assert sample.gauges["requests_waiting"] == value(text, "llamacpp:requests_deferred")
    # prompt_tokens_total excluded cached tokens then too, and nothing counted those.
    assert sample.counters["prompt_tokens"] is None
    assert sample.unavailable["prompt_tokens"] == NO_CACHED_COUNTER
    assert sample.counters["prompt_tokens_local_compute"] == value(
        text, "llamacpp:prompt_tokens_total"
    )
    assert sample.counters["generation_tokens"] == value(text, "llamacpp:tokens_predicted_total")
    # The KV gauges never gave the capacity (the context size is not in /metrics).
    assert sample.cache.capacity_tokens is None
    assert "kv_cache_capacity_tokens" in sample.unavailable
    assert sample.unavailable["spec_decode_acceptance"] == NO_SPEC


def test_the_2025_server_under_load() -> None:
    """The real pre-May-2025 server, busy: its slots' requests running, the rest deferred,
    KV occupancy its own gauge, and n_busy_slots_per_decode still typed a counter."""
    text = read(KV_GAUGES)
    sample = parse_llamacpp(text)
    assert sample.gauges["requests_running"] == 2
    assert sample.gauges["requests_waiting"] == value(text, "llamacpp:requests_deferred") > 0
    assert sample.gauges["kv_cache_usage"] == value(text, "llamacpp:kv_cache_usage_ratio") > 0
    assert "# TYPE llamacpp:n_busy_slots_per_decode counter" in text


def test_the_throughput_gauges_are_never_read() -> None:
    """They reset on every read of /metrics: a rate from them depends on who else scraped.
    Changing them changes nothing kneepoint reports."""
    text = read(BUSY)
    first = parse_llamacpp(text)
    for name in ("llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds"):
        (line,) = [x for x in text.splitlines() if x.startswith(name + " ")]
        text = text.replace(line, f"{name} 123456.5")
    second = parse_llamacpp(text)
    assert (second.gauges, second.counters) == (first.gauges, first.counters)
    assert 123456.5 not in [*second.gauges.values(), *second.counters.values()]


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_auto_detects_llamacpp(path) -> None:  # type: ignore[no-untyped-def]
    text = read(path)
    assert detect_engine(text) == "llamacpp"
    detected = parse_replica("auto", text)
    assert detected.engine == "llamacpp"
    assert detected == parse_replica("llamacpp", text) == parse_llamacpp(text)


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_every_reason_is_a_canonical_quantity_and_every_missing_one_is_null(path) -> None:  # type: ignore[no-untyped-def]
    sample = parse_llamacpp(read(path))
    assert set(sample.unavailable) <= set(QUANTITIES)
    for reason in sample.unavailable.values():
        assert reason.startswith("not exposed by llama.cpp")
    fields = {
        "kv_cache_occupancy": sample.gauges["kv_cache_usage"],
        "prompt_tokens": sample.counters["prompt_tokens"],
        "prefix_cache_hit_rate": sample.counters["prefix_cache_hits"],
        "preemptions": sample.counters["preemptions"],
        "spec_decode_acceptance": sample.counters["spec_decode_accepted_tokens"],
        "kv_cache_capacity_tokens": sample.cache.capacity_tokens,
    }
    for quantity, field in fields.items():
        if quantity in sample.unavailable:
            assert field is None, quantity


def test_what_is_not_llamacpp_is_refused() -> None:
    with pytest.raises(ScrapeFormatError, match="empty"):
        parse_llamacpp("")
    with pytest.raises(ScrapeFormatError, match=r"no llama\.cpp metric"):
        parse_llamacpp(read(VLLM_032))
    with pytest.raises(ScrapeFormatError):
        parse_llamacpp("<html><body>llama.cpp</body></html>\n")
    with pytest.raises(ScrapeFormatError, match="one"):
        parse_llamacpp('llamacpp:requests_processing{a="1"} 1\nllamacpp:requests_processing 2\n')
