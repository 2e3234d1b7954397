"""Prefix-cache hits by tier, a KV connector's hit rate, prefill computed, the multimodal
cache, KV offload, corrupted requests and LoRA adapters (kneepoint/derived/tiers.py): on the
real vLLM 0.32 capture, on SGLang's and TensorRT-LLM's fixtures, and through the status and
the page view of a seeded store, each against hand-computed values."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from collectors.engines.sglang import parse_sglang
from collectors.engines.trtllm import parse_trtllm
from collectors.engines.vllm import parse_vllm
from kneepoint.config import Config, Target
from kneepoint.derived import tiers
from kneepoint.status import build_status
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets, record_replica
from kneepoint.views import build_view
from tests.conftest import OWN_FIXTURES, VLLM_032, read


def test_vllm_032_capture_hand_computed() -> None:
    # The capture: prompt_tokens 25,095; cached by source device 17,024, the other tiers 0;
    # prefill computed 8,071 tokens over 64 requests; no KV connector, no multimodal input.
    sample = parse_vllm(read(VLLM_032))
    deltas = sample.counters  # increases since the process started (from 0)
    shares = tiers.tier_shares(deltas)
    assert shares == {
        "device": pytest.approx(17024 / 25095),
        "host": 0.0,
        "p2p": 0.0,
        "disk": 0.0,
        "external": 0.0,
    }
    assert tiers.prefill_computed_per_request(deltas) == pytest.approx(8071 / 64)
    assert tiers.mean_prompt_tokens(deltas) == pytest.approx(25095 / 64)
    assert tiers.external_hit_rate(deltas) is None  # 0 queries: no connector, no data
    assert tiers.mm_cache_hit_rate(deltas) is None
    assert "prompt_tokens_by_tier" not in sample.unavailable


def test_an_older_vllm_has_no_tiers_and_says_why() -> None:
    sample = parse_vllm(read(OWN_FIXTURES / "vllm-0.10.2-dp2.prom"))
    assert tiers.tier_shares(sample.counters) is None
    assert sample.unavailable["prompt_tokens_by_tier"].startswith("not exposed by")


def test_sglang_hierarchical_cache_tiers() -> None:
    # SGLang 0.5.10's own collector: cached_tokens_total{cache_source=device} 525 and
    # {cache_source=host} 75 (no storage hit yet: 0), prompt_tokens_total 2,000.
    sample = parse_sglang(read(OWN_FIXTURES / "sglang-0.5.10-tp2-all-schedulers.prom"))
    assert sample.counters["prompt_tokens_cached_device"] == 525
    assert sample.counters["prompt_tokens_cached_host"] == 75
    assert sample.counters["prompt_tokens_cached_external"] == 0  # storage: no hit yet
    assert sample.counters["prompt_tokens_cached_p2p"] is None  # SGLang has no such tier
    assert tiers.tier_shares(sample.counters) == {
        "device": pytest.approx(525 / 2000),
        "host": pytest.approx(75 / 2000),
        "p2p": None,
        "disk": None,
        "external": 0.0,
    }
    # The tiers add up to the hits the prefix-cache hit rate counts.
    assert sample.counters["prefix_cache_hits"] == 525 + 75


@pytest.mark.parametrize("fixture", ["sglang-0.5.16-spec.prom", "sglang-0.4.6.prom"])
def test_sglang_without_a_named_tier_has_no_shares(fixture: str) -> None:
    # 0.5.16 counts cached tokens as cache_source="total"; 0.4.6 has no cache_source at all.
    sample = parse_sglang(read(OWN_FIXTURES / fixture))
    assert sample.counters["prefix_cache_hits"]  # hits are counted, their tier is not
    assert tiers.tier_shares(sample.counters) is None
    assert "prompt_tokens_by_tier" in sample.unavailable


def test_trtllm_cache_levels_by_tier() -> None:
    # prompt_cache_hit_tokens_total{cache_tier=gpu} 29,216 and {cache_tier=host} 4,800 of
    # prompt_tokens_total 220,609 (tests/fixtures/make_trtllm_fixtures.py).
    sample = parse_trtllm(read(OWN_FIXTURES / "trtllm-full-iteration-stats.prom"))
    shares = tiers.tier_shares(sample.counters)
    assert shares is not None
    assert shares["device"] == pytest.approx(29216 / 220609)
    assert shares["host"] == pytest.approx(4800 / 220609)
    assert shares["disk"] == 0.0 and shares["external"] is None


@pytest.fixture
def seeded(tmp_path: Path) -> Config:
    config = Config(
        database=f"sqlite:///{tmp_path / 's.db'}",
        targets=[
            Target(name="a", kind="vllm", url="http://a/metrics"),
            Target(name="old", kind="vllm", url="http://b/metrics"),
        ],
    )
    first = parse_vllm(read(VLLM_032))
    for name in ("kv_offload_load_bytes", "kv_offload_store_bytes", "corrupted_requests"):
        first.counters[name] = 0.0  # as a server with offloading shows them at start
    first.gauges["kv_offload_usage"] = 0.1
    later = copy.deepcopy(first)
    steps = {
        "prompt_tokens": 10000,
        "prompt_tokens_cached_device": 3000,
        "prompt_tokens_cached_host": 1000,
        "external_prefix_cache_queries": 2000,
        "external_prefix_cache_hits": 500,
        "prefill_kv_computed_tokens_sum": 6000,
        "prefill_kv_computed_tokens_count": 20,
        "request_prompt_tokens_sum": 10000,
        "request_prompt_tokens_count": 20,
        "kv_offload_load_bytes": 3_000_000,
        "kv_offload_store_bytes": 6_000_000,
        "mm_cache_queries": 10,
        "mm_cache_hits": 4,
        "corrupted_requests": 2,
    }
    for name, step in steps.items():
        later.counters[name] = (first.counters[name] or 0.0) + step
    later.gauges["kv_offload_usage"] = 0.35
    later.lora = {"running": ["sql", "chat"], "waiting": ["code"], "max_lora": 4}
    old = parse_vllm(read(OWN_FIXTURES / "vllm-0.10.2-dp2.prom"))
    sessions = open_store(config.database)
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        record_replica(session, ids["a"], 1000.0, first)
        record_replica(session, ids["a"], 1030.0, later)
        record_replica(session, ids["old"], 1000.0, old)
        record_replica(session, ids["old"], 1030.0, old)
    return config


def test_status_and_view_hand_computed(seeded: Config) -> None:
    sessions = open_store(seeded.database)
    with sessions() as session:
        status = build_status(session, seeded, now=1040.0, window=300.0)
        view = build_view(session, seeded, now=1040.0, window=300.0)
    a, old = status["replicas"]
    assert a["prefix_cache_tier_shares"] == {
        "device": pytest.approx(0.3),
        "host": pytest.approx(0.1),
        "p2p": 0.0,
        "disk": 0.0,
        "external": 0.0,
    }
    assert a["external_prefix_cache_hit_rate"] == pytest.approx(500 / 2000)
    assert a["corrupted_requests"] == 2
    assert a["lora_adapters"] == {"running": ["sql", "chat"], "waiting": ["code"], "max_lora": 4}
    assert a["kv_offload_usage"] == pytest.approx(0.35)
    # An engine without the tier counters: null, with its reason, never 0.
    assert old["prefix_cache_tier_shares"] is None
    assert "prompt_tokens_by_tier" in old["unavailable"]
    assert old["lora_adapters"] is None and old["kv_offload_usage"] is None
    assert old["corrupted_requests"] is None
    # The fleet: the same increases summed (the old replica adds none).
    assert status["fleet"]["prefix_cache_tier_shares"] == a["prefix_cache_tier_shares"]
    rows = view.rows["a"]
    assert rows["prefill_computed_tokens_per_request"] == pytest.approx(6000 / 20)
    assert rows["mean_prompt_tokens"] == pytest.approx(10000 / 20)
    assert rows["kv_offload_load_bytes_per_second"] == pytest.approx(3_000_000 / 30)
    assert rows["kv_offload_store_bytes_per_second"] == pytest.approx(6_000_000 / 30)
    assert rows["mm_cache_hit_rate"] == pytest.approx(4 / 10)
    assert view.rows["old"]["kv_offload_load_bytes_per_second"] is None
