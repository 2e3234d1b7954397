"""Dispatch by engine: every fixture is told apart by its names (`kind: auto`), and `auto`
reads it exactly as its engine's own kind does."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.engines import ENGINES, PARSERS, detect_engine, parse_replica
from collectors.parse import ScrapeFormatError, parse_exposition
from kneepoint.samples import QUANTITIES
from tests.conftest import DCGM_L4, DCGM_T4, OWN_FIXTURES, VLLM_032, read

# Every engine capture here, by the engine its file name says it is.
CAPTURES = sorted([VLLM_032, *OWN_FIXTURES.glob("*.prom")])


def engine_of(path: Path) -> str:
    return path.name.split("-")[0]


def test_the_captures_cover_vllm_and_sglang_at_least() -> None:
    assert {"vllm", "sglang"} <= {engine_of(p) for p in CAPTURES}
    assert {"vllm", "sglang"} <= set(PARSERS)
    assert set(PARSERS) <= set(ENGINES)


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_auto_detects_each_capture_s_engine_from_its_names(path: Path) -> None:
    text = read(path)
    engine = engine_of(path)
    assert detect_engine(text) == engine
    # The same from a parsed scrape (every name kept).
    assert detect_engine(parse_exposition(text, lambda name: True)) == engine


@pytest.mark.parametrize(
    "path", [p for p in CAPTURES if engine_of(p) in PARSERS], ids=lambda p: p.name
)
def test_auto_reads_a_capture_exactly_as_its_engine_s_kind_does(path: Path) -> None:
    text = read(path)
    sample = parse_replica("auto", text)
    assert sample == parse_replica(engine_of(path), text)
    assert sample.engine == engine_of(path)
    # What an engine cannot give is keyed by a canonical quantity and said in words.
    assert set(sample.unavailable) <= set(QUANTITIES)
    assert all(reason.startswith("not exposed by") for reason in sample.unavailable.values())


@pytest.mark.parametrize("path", [DCGM_L4, DCGM_T4], ids=lambda p: p.name)
def test_a_dcgm_exporter_is_no_engine(path: Path) -> None:
    assert detect_engine(read(path)) is None
    with pytest.raises(ScrapeFormatError, match="no engine's metrics found"):
        parse_replica("auto", read(path))


def test_an_lmcache_or_dynamo_series_beside_an_engine_does_not_change_its_engine() -> None:
    text = read(VLLM_032) + (
        'lmcache:num_hit_tokens_total{model_name="tiny",worker_id="0"} 5.0\n'
        'dynamo_component_requests_total{dynamo_namespace="d"} 3.0\n'
    )
    assert detect_engine(text) == "vllm"


def test_an_empty_body_is_refused_for_auto() -> None:
    with pytest.raises(ScrapeFormatError, match="empty"):
        parse_replica("auto", "\n")


def test_auto_on_trtllm_serve_s_json_metrics_says_where_its_prometheus_text_is() -> None:
    body = '[{"gpuMemUsage": 123, "iter": 7, "kvCacheStats": {"usedNumBlocks": 3}}]'
    with pytest.raises(ScrapeFormatError, match="/prometheus/metrics"):
        parse_replica("auto", body)
