"""The request length histograms the what-if replays per bucket (samples.LOAD_HISTOGRAMS
prompt_length and output_length), read from the real vLLM 0.32 capture: each equals the
capture's own vllm:request_prompt_tokens / vllm:request_generation_tokens lines, read by a
filter that shares nothing with the normalizer; an engine without them gives none."""

from __future__ import annotations

import re

import pytest

from collectors.engines.vllm import parse_vllm
from kneepoint.samples import LOAD_HISTOGRAMS
from tests.conftest import OWN_FIXTURES, VLLM_032, read

FAMILIES = {
    "prompt_length": "vllm:request_prompt_tokens",
    "output_length": "vllm:request_generation_tokens",
}


def own_lines(text: str, family: str) -> tuple[list[tuple[float, float]], float, float]:
    """(le, cumulative) pairs, sum and count of one family, straight from the text."""
    buckets = []
    for le, value in re.findall(rf'^{family}_bucket{{[^}}]*le="([^"]+)"[^}}]*}} (\S+)', text, re.M):
        buckets.append((float(le), float(value)))
    total = sum(float(v) for v in re.findall(rf"^{family}_sum{{[^}}]*}} (\S+)", text, re.M))
    count = sum(float(v) for v in re.findall(rf"^{family}_count{{[^}}]*}} (\S+)", text, re.M))
    return sorted(buckets), total, count


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_length_histograms_are_the_capture_s(name: str) -> None:
    assert name in LOAD_HISTOGRAMS
    text = read(VLLM_032)
    buckets, total, count = own_lines(text, FAMILIES[name])
    assert count > 0  # the capture served requests: the comparison means something
    histogram = parse_vllm(text).histograms[name]
    assert list(zip(histogram.bounds, histogram.counts, strict=True)) == buckets
    assert histogram.total == pytest.approx(total)
    assert histogram.count == count


def test_an_engine_without_them_gives_none() -> None:
    from collectors.engines.sglang import parse_sglang

    sample = parse_sglang(read(OWN_FIXTURES / "sglang-0.4.0.prom"))
    assert "prompt_length" not in sample.histograms
    assert "output_length" not in sample.histograms
