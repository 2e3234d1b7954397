"""The twin against the field figures of docs/explanation/domain.md: an RTX 4000 Ada serving
Qwen3-4B in BF16 (max_num_seqs 32, as in the workshop), 256 input and 128 output tokens per request,
closed-loop clients at concurrency 1, 32 and 64; the figures in virtual time, and the
real-time HTTP server checked against its own counters."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from kneepoint.twin.fleet import Fleet, single_replica
from kneepoint.twin.ladder import ladder_run
from kneepoint.twin.profiles import gpu, model
from kneepoint.twin.simulated_engine import EngineConfig

pytestmark = pytest.mark.timeout(600)
MODEL = "Qwen/Qwen3-4B"


@dataclass(frozen=True)
class Point:
    output_tokens_per_second: float
    ttft_seconds: float


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    fleet = Fleet(single_replica("rtx4000ada", "qwen3-4b", 0, 0, max_num_seqs=32)).start()
    yield fleet.url("qwen3-4b")
    fleet.stop()


async def load(url: str, concurrency: int, requests_each: int) -> Point:
    rng = random.Random(concurrency)
    ttfts: list[float] = []
    tokens = 0
    sends: list[float] = []

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        await asyncio.sleep(rng.uniform(0, 0.5))  # a load test ramps, it does not stampede
        for _ in range(requests_each):
            sent = time.perf_counter()
            sends.append(sent)
            first = None
            async with http.stream(
                "POST",
                f"{url}/v1/completions",
                json={
                    "model": MODEL,
                    "prompt": [rng.randrange(150_000) for _ in range(256)],
                    "max_tokens": 128,
                    "ignore_eos": True,
                    "stream": True,
                },
            ) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {") and first is None:
                        first = time.perf_counter() - sent
            ttfts.append(first or 0.0)
            tokens += 128

    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=100)) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    # As a benchmark reports it: output tokens over the time from the first request sent.
    return Point(tokens / (time.perf_counter() - min(sends)), sum(ttfts) / len(ttfts))


def test_the_twin_reproduces_the_workshop_figures() -> None:
    """The physics, in virtual time: the figures cannot move with the test machine's load
    (the real-time server below sleeps each step, and a busy CPU oversleeps)."""
    engine = EngineConfig(gpu("rtx4000ada"), model("qwen3-4b"), max_num_seqs=32)
    run = ladder_run(engine, "workshop", MODEL, (1, 32, 64))
    single, at_32, at_64 = (
        Point(p.output_tokens_per_second, p.ttft_mean_seconds or 0.0) for p in run.points
    )
    report = f"1: {single}, 32: {at_32}, 64: {at_64}"
    # Field: 37–45 tok/s and 40–80 ms alone, about 700 tok/s at 32; the twin must stay
    # within ±25 % of them (the tolerance).
    assert 37 * 0.75 <= single.output_tokens_per_second <= 45 * 1.25, report
    assert 0.040 * 0.75 <= single.ttft_seconds <= 0.080 * 1.25, report
    assert 700 * 0.75 <= at_32.output_tokens_per_second <= 700 * 1.25, report
    # The knee: past 32, throughput barely grows while time to first token jumps.
    assert at_64.output_tokens_per_second < 1.2 * at_32.output_tokens_per_second, report
    assert at_64.ttft_seconds > 3 * at_32.ttft_seconds, report


def test_the_real_time_server_serves_what_its_counters_say(url: str) -> None:
    """Through real HTTP at concurrency 1 and 32: every request streams its 128 tokens and
    the server's own counters count exactly them, and its own TTFT histogram (engine time,
    not the client's clock) orders the two loads as the physics does."""
    before = _counters(url)
    asyncio.run(load(url, 1, 3))
    middle = _counters(url)
    asyncio.run(load(url, 32, 2))
    after = _counters(url)
    assert (
        middle["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 3 * 128
    )
    assert (
        after["vllm:generation_tokens_total"] - middle["vllm:generation_tokens_total"] == 64 * 128
    )
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 67 * 256

    def mean_ttft(start: dict[str, float], end: dict[str, float]) -> float:
        total = "vllm:time_to_first_token_seconds_sum"
        count = "vllm:time_to_first_token_seconds_count"
        return (end[total] - start[total]) / (end[count] - start[count])

    # 32 prompts of 256 tokens queue behind each other's prefill: far slower first tokens.
    assert mean_ttft(middle, after) > 2 * mean_ttft(before, middle)


def _counters(url: str) -> dict[str, float]:
    """The replica's own unlabelled totals (summed over label sets) from its /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals
