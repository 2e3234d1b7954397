"""A closed-loop load over a ladder of concurrency steps against real vLLM servers, each step
held against the server's own counters. Run as its own process on the core the engines leave
free: `python -m tests.real.whatif_load URLS LADDER INPUT OUTPUT PER_CLIENT MINIMUM ROUNDS`
(URLS comma-separated; a step of concurrency c sends max(MINIMUM, PER_CLIENT × c) requests).
It prints one JSON object per step and server.

Per step, the server's counters are read before the first request and after the server has
recorded the step's last one (nothing else uses the server meanwhile), so a step's figures
are the server's: generated tokens, the sum and count of its TTFT histogram, preemptions. The
wall is the client's, first request sent to last token read, as `kneepoint sweep` reports it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import replace
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kneepoint.knee.sweep import SweepSettings, run_step

COUNTERS = {
    "requests": "vllm:time_to_first_token_seconds_count",
    "ttft_sum": "vllm:time_to_first_token_seconds_sum",
    "finished": "vllm:e2e_request_latency_seconds_count",
    "tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "preemptions": "vllm:num_preemptions_total",
    "itl_sum": "vllm:inter_token_latency_seconds_sum",
    "itl_count": "vllm:inter_token_latency_seconds_count",
}


async def totals(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    out = dict.fromkeys(COUNTERS, 0.0)
    names = {name: key for key, name in COUNTERS.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                out[names[sample.name]] += sample.value
    return out


async def measure(
    http: aiohttp.ClientSession, url: str, settings: SweepSettings, concurrency: int
) -> dict[str, Any]:
    """One closed-loop step on the server at `url`, with the server's counters' deltas."""
    before = await totals(http, url)
    load = os.getloadavg()[0]
    point = await run_step(http, settings, concurrency)
    deadline = time.monotonic() + 30
    while True:  # the server records a request just after its last token went out
        after = await totals(http, url)
        if after["finished"] - before["finished"] >= (point.completed or 0):
            break
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    delta = {key: after[key] - before[key] for key in COUNTERS}
    wall = point.duration_seconds or 0.0
    return {
        "url": url,
        "concurrency": concurrency,
        "completed": point.completed,
        "errors": point.errors,
        "first_error": point.first_error,
        "wall_seconds": wall,
        "load_average": max(load, os.getloadavg()[0]),
        "client_ttft_mean_seconds": point.ttft_mean_seconds,
        "client_itl_mean_seconds": point.itl_mean_seconds,
        **{f"server_{key}": value for key, value in delta.items()},
        "generation_tokens_per_second": delta["tokens"] / wall if wall else 0.0,
        "ttft_mean_seconds": delta["ttft_sum"] / delta["requests"] if delta["requests"] else None,
        "itl_mean_seconds": delta["itl_sum"] / delta["itl_count"] if delta["itl_count"] else None,
    }


async def rounds(
    urls: list[str],
    steps: list[int],
    input_tokens: int,
    output_tokens: int,
    per_client: int,
    minimum: int,
    count: int,
) -> None:
    """`count` rounds of the ladder; at each step every server in turn (who goes first
    alternates), so that the servers' steps meet the machine in the same state. A short
    warm-up step on each server first (not reported)."""
    settings = SweepSettings(
        url=urls[0],
        model="tiny",
        ladder=tuple(steps),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )
    connector = aiohttp.TCPConnector(limit=max(steps) + 8)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as http:
        for url in urls:
            warm = replace(settings, url=url, requests_per_step=steps[0])
            await run_step(http, warm, steps[0])
        turn = 0
        for number in range(count):
            for concurrency in steps:
                order = urls if turn % 2 == 0 else urls[::-1]
                turn += 1
                for url in order:
                    step = replace(
                        settings, url=url, requests_per_step=max(minimum, per_client * concurrency)
                    )
                    measured = await measure(http, url, step, concurrency)
                    print(json.dumps({"round": number, **measured}), flush=True)


def main(argv: list[str]) -> None:
    urls, steps, input_tokens, output_tokens, per_client, minimum, count = argv
    asyncio.run(
        rounds(
            urls.split(","),
            [int(s) for s in steps.split(",")],
            int(input_tokens),
            int(output_tokens),
            int(per_client),
            int(minimum),
            int(count),
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
