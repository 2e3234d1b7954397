"""TGI's /metrics normalized into the canonical sample. The fixtures are reconstructions (no
real TGI capture is public; see their first line and tests/fixtures/make_tgi_fixtures.py):
every expected number is read from the fixture's own text here, by a reader independent of
the collector's parser."""

from __future__ import annotations

import pytest

from collectors.engines import detect_engine, parse_replica
from collectors.engines.tgi import parse_tgi
from collectors.parse import ScrapeFormatError
from kneepoint.samples import QUANTITIES
from tests.conftest import OWN_FIXTURES, VLLM_032, read

TGI_3 = OWN_FIXTURES / "tgi-3.3.7-speculate2.prom"
TGI_2 = OWN_FIXTURES / "tgi-2.2.0-idle.prom"

# Quantities TGI has in no release: each must be None (never 0) with a reason.
NEVER = {
    "kv_cache_occupancy": ("gauges", "kv_cache_usage"),
    "preemptions": ("counters", "preemptions"),
    "prefix_cache_hit_rate": ("counters", "prefix_cache_hits"),
    "requests_waiting_capacity": ("gauges", "requests_waiting_capacity"),
}


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


def test_it_reads_tgi_3() -> None:
    text = read(TGI_3)
    sample = parse_tgi(text)
    assert sample.engine == "tgi"
    assert sample.generation == "tgi-3"
    assert sample.engines == 1
    assert sample.model_names == []
    assert sample.gauges["requests_running"] == value(text, "tgi_batch_current_size") > 0
    assert sample.gauges["requests_waiting"] == value(text, "tgi_queue_size") > 0
    prompt = value(text, "tgi_request_input_length_sum")
    generated = value(text, "tgi_request_generated_tokens_sum")
    # No token counters in TGI: the per-request length histograms' sums.
    assert sample.counters["prompt_tokens"] == prompt > 0
    assert sample.counters["generation_tokens"] == generated > 0
    assert sample.counters["request_prompt_tokens_sum"] == prompt
    assert sample.counters["request_prompt_tokens_count"] == value(
        text, "tgi_request_input_length_count"
    )
    assert sample.counters["request_generation_tokens_count"] == value(
        text, "tgi_request_generated_tokens_count"
    )
    assert sample.cache.capacity_tokens == value(text, "tgi_batch_max_total_tokens") > 0
    assert "kv_cache_capacity_tokens" not in sample.unavailable


def test_tgi_counters_have_no_total_suffix() -> None:
    text = read(TGI_3)
    counters = [line.split()[2] for line in text.splitlines() if line.endswith(" counter")]
    assert "tgi_request_count" in counters and "tgi_request_success" in counters
    assert not [name for name in counters if name.endswith("_total")]
    assert not samples(text, "tgi_request_count_total")


def test_the_skipped_tokens_summary_gives_accepted_tokens_from_its_cumulative_sum() -> None:
    text = read(TGI_3)
    assert "# TYPE tgi_request_skipped_tokens summary" in text
    quantiles = samples(text, "tgi_request_skipped_tokens")
    assert {labels for labels, _ in quantiles} >= {'quantile="0.5"', 'quantile="1"'}
    sample = parse_tgi(text)
    accepted = value(text, "tgi_request_skipped_tokens_sum")
    assert sample.counters["spec_decode_accepted_tokens"] == accepted > 0
    # Drafts are not counted by TGI: no acceptance rate, said so.
    assert sample.counters["spec_decode_drafts"] is None
    assert sample.counters["spec_decode_draft_tokens"] is None
    assert "drafts" in sample.unavailable["spec_decode_acceptance"]


def test_it_keeps_tgi_s_own_buckets() -> None:
    text = read(TGI_3)
    sample = parse_tgi(text)
    for field, base in (
        ("e2e", "tgi_request_duration"),
        ("queue", "tgi_request_queue_duration"),
        ("itl", "tgi_request_mean_time_per_token_duration"),
    ):
        buckets = samples(text, f"{base}_bucket")
        bounds = tuple(float(labels.split('"')[1]) for labels, _ in buckets)
        histogram = sample.histograms[field]
        assert histogram.bounds == bounds
        assert histogram.bounds[-1] == float("inf") and len(bounds) == 36
        assert histogram.counts == tuple(count for _, count in buckets)
        assert histogram.count == value(text, f"{base}_count") > 0
        assert histogram.total == pytest.approx(value(text, f"{base}_sum"))
    # TGI has no time-to-first-token histogram: absent, with the reason.
    assert "ttft" not in sample.histograms
    assert "time-to-first-token" in sample.unavailable["ttft"]


@pytest.mark.parametrize("fixture", [TGI_3, TGI_2])
def test_what_tgi_lacks_is_none_with_a_reason_never_zero(fixture) -> None:  # type: ignore[no-untyped-def]
    sample = parse_tgi(read(fixture))
    for quantity, (kind, key) in NEVER.items():
        assert getattr(sample, kind)[key] is None, key
        assert sample.unavailable[quantity].startswith("not exposed by TGI"), quantity
    assert sample.gauges["kv_cache_usage_mean"] is None
    assert sample.counters["prefix_cache_queries"] is None


def test_it_reads_tgi_2_without_a_capacity_gauge() -> None:
    text = read(TGI_2)
    assert "# HELP" not in text  # TGI before 2.3.0 described nothing
    assert "# TYPE tgi_request_skipped_tokens histogram" in text
    sample = parse_tgi(text)
    assert sample.generation == "tgi-2"
    assert sample.cache.capacity_tokens is None
    assert "2.3.1" in sample.unavailable["kv_cache_capacity_tokens"]
    assert sample.gauges["requests_running"] == value(text, "tgi_batch_current_size") == 0
    assert sample.counters["prompt_tokens"] == value(text, "tgi_request_input_length_sum")
    assert sample.counters["spec_decode_accepted_tokens"] == value(
        text, "tgi_request_skipped_tokens_sum"
    )
    assert sample.histograms["e2e"].count == value(text, "tgi_request_duration_count") > 0


def test_a_fresh_tgi_3_reads_zero_for_what_it_has_not_recorded_yet() -> None:
    # Before its first request a TGI 3 shows only the capacity its backend set at start-up:
    # metrics-rs registers every other series on first use, so absent means nothing yet.
    text = read(TGI_3)
    fresh = (
        "\n".join(line for line in text.splitlines() if "tgi_batch_max_total_tokens" in line) + "\n"
    )
    sample = parse_tgi(fresh)
    assert sample.generation == "tgi-3"
    assert sample.cache.capacity_tokens == value(text, "tgi_batch_max_total_tokens")
    assert sample.gauges["requests_running"] == 0
    assert sample.gauges["requests_waiting"] == 0
    assert sample.counters["prompt_tokens"] == 0
    assert sample.counters["generation_tokens"] == 0
    # Speculation metrics exist only since 1.3 and are not read as zero when absent.
    assert sample.counters["spec_decode_accepted_tokens"] is None
    assert sample.histograms == {}


def test_an_empty_body_is_explained() -> None:
    with pytest.raises(ScrapeFormatError, match="served a request"):
        parse_tgi("")


def test_it_refuses_a_body_that_is_not_tgi() -> None:
    with pytest.raises(ScrapeFormatError, match="TGI"):
        parse_tgi(read(VLLM_032))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("<html><body>Bad gateway</body></html>\n", "not a metric sample"),
        ("tgi_queue_size 3", "truncated"),
        ('tgi_request_duration_bucket{le="soon"} 3\n', "not a number"),
        ("tgi_request_duration_bucket 3\n", "no le label"),
        ("tgi_queue_size 3\ntgi_queue_size 4\n", "duplicate series"),
        ("tgi_queue_size three\n", "malformed"),
    ],
)
def test_malformed_bodies_give_clear_errors(body: str, message: str) -> None:
    with pytest.raises(ScrapeFormatError, match=message):
        parse_tgi(body)


def test_a_truncated_capture_is_refused() -> None:
    text = read(TGI_3)
    with pytest.raises(ScrapeFormatError, match="truncated"):
        parse_tgi(text[: len(text) // 2])


def test_auto_detection_and_the_engine_registry_pick_tgi() -> None:
    text = read(TGI_3)
    assert detect_engine(text) == "tgi"
    assert parse_replica("auto", text) == parse_tgi(text)
    assert parse_replica("tgi", read(TGI_2)).generation == "tgi-2"


@pytest.mark.parametrize("fixture", [TGI_3, TGI_2])
def test_every_unavailable_key_is_a_canonical_quantity(fixture) -> None:  # type: ignore[no-untyped-def]
    unavailable = parse_tgi(read(fixture)).unavailable
    assert unavailable and set(unavailable) <= set(QUANTITIES)
