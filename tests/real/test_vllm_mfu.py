"""MFU and MBU on a real vLLM 0.32 (CPU build, the "limits" server: --enable-mfu-metrics):
scraped through kneepoint's collector into a store before and after a short load, status's
figures equal the documented formula (docs/reference/metrics.md) computed here from the two
raw scrapes, with the peak of a gpu_peaks entry (the CPU has no GPU peak)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.collect import collect_once
from kneepoint.config import parse_config
from kneepoint.status import build_status
from kneepoint.store.db import open_store
from tests.real.vllm_server import MAX_SEQS_LIMITS, Vllm

pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]

PEAK_TFLOPS, PEAK_GB_S = 2.0, 50.0  # the gpu_peaks entry the replica is judged against
FLOPS = "vllm:estimated_flops_per_gpu_total"
READ, WRITE = "vllm:estimated_read_bytes_per_gpu_total", "vllm:estimated_write_bytes_per_gpu_total"
TOKENS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")


def raw(url: str) -> tuple[dict[str, float], set[str]]:
    """vLLM's own counters, each summed over its engines (prometheus_client's parser, not
    kneepoint's), and the engines that report them."""
    values: dict[str, float] = {}
    engines: set[str] = set()
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (FLOPS, READ, WRITE, *TOKENS, "vllm:request_success_total"):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
                if sample.name == FLOPS:
                    engines.add(sample.labels.get("engine", "0"))
    return values, engines


async def load(url: str, requests: int) -> None:
    """`requests` completions, at most max_num_seqs at once (none refused by the queue limit)."""
    async with httpx.AsyncClient(timeout=120) as client:
        for start in range(0, requests, MAX_SEQS_LIMITS):
            batch = range(start, min(start + MAX_SEQS_LIMITS, requests))
            answers = await asyncio.gather(
                *(
                    client.post(
                        f"{url}/v1/completions",
                        json={
                            "model": "tiny",
                            "prompt": f"mfu {n}: the agent reads the file and writes the plan",
                            "max_tokens": 48,
                            "ignore_eos": True,
                        },
                    )
                    for n in batch
                )
            )
            assert all(a.status_code == 200 for a in answers), [a.text[:200] for a in answers]


def test_status_mfu_and_mbu_are_the_documented_formula_over_two_raw_scrapes(
    tiny_servers: dict[str, Vllm], tmp_path: Path
) -> None:
    url = tiny_servers["limits"].url
    config = parse_config(
        f"database: sqlite:///{tmp_path / 'mfu.db'}\n"
        "gpu_peaks:\n"
        f"  - {{match: kneepoint test cpu, tflops: {{bf16: {PEAK_TFLOPS}}},"
        f" bandwidth_gb_s: {PEAK_GB_S}}}\n"
        "targets:\n"
        f"  - {{name: limits, kind: vllm, url: '{url}/metrics', gpu_model: kneepoint test CPU}}\n"
    )
    sessions = open_store(config.database)
    before, engines = raw(url)
    [first] = collect_once(config, sessions, clock=lambda: 1000.0)
    assert first.ok, first.error
    requests = 6
    asyncio.run(load(url, requests))
    deadline = time.monotonic() + 30  # the counters land when the engine finishes its step
    after, _ = raw(url)
    while (
        after["vllm:request_success_total"] < before["vllm:request_success_total"] + requests
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
        after, _ = raw(url)
    [second] = collect_once(config, sessions, clock=lambda: 1060.0)
    assert second.ok, second.error
    assert raw(url)[0] == after  # idle: the collector read what the raw scrape read

    with sessions() as session:
        status = build_status(session, config, now=1060.0, window=120.0)
    [replica] = status["replicas"]
    grown = {name: after[name] - before[name] for name in (FLOPS, READ, WRITE, *TOKENS)}
    # The FLOPs grew with the tokens served.
    assert sum(grown[name] for name in TOKENS) > 0 and grown[FLOPS] > 0
    assert replica["engines"] == len(engines) >= 1
    seconds = 1060.0 - 1000.0
    capacity = seconds * len(engines) * PEAK_TFLOPS * 1e12
    bandwidth = seconds * len(engines) * PEAK_GB_S * 1e9
    assert replica["mfu_unavailable"] is None and replica["mbu_unavailable"] is None
    assert replica["mfu"] == pytest.approx(grown[FLOPS] / capacity, rel=1e-9)
    assert replica["mbu"] == pytest.approx((grown[READ] + grown[WRITE]) / bandwidth, rel=1e-9)
    assert status["fleet"]["mfu"] == pytest.approx(replica["mfu"], rel=1e-9)
