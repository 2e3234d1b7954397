"""kneepoint's collectors against a real vLLM 0.32 (CPU build): what kneepoint stores and
reports over a window equals what vLLM's own counters say over the same window."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.collect import collect_once
from kneepoint.config import Config, Target
from kneepoint.status import build_status
from kneepoint.store import queries
from kneepoint.store.db import open_store
from kneepoint.twin.fleet import Fleet, single_replica
from tests.real.vllm_server import Vllm

pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]

SYSTEM = " ".join(["system prompt: you are an agent with tools search read write plan"] * 12)


@pytest.fixture(scope="module")
def vllm_url(vllm: Vllm) -> str:
    return vllm.url


def vllm_counters(url: str) -> dict[str, float]:
    """vLLM's own numbers, read straight from /metrics with prometheus_client."""
    values: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            if sample.name == "vllm:cache_config_info":
                values["block_size"] = float(sample.labels["block_size"])
                values["num_gpu_blocks"] = float(sample.labels["num_gpu_blocks"])
            elif sample.name == "vllm:time_to_first_token_seconds_count":
                values["ttft_count"] = sample.value
            elif not sample.labels.get("le") and not sample.labels.get("reason"):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


async def agent_sessions(
    url: str, sessions: int, steps: int, model: str = "tiny"
) -> tuple[int, int, int]:
    """Agent-like traffic: each session re-sends its growing transcript after a shared system
    prompt. Returns (requests, prompt tokens, completion tokens) from the responses' usage."""
    totals = [0, 0, 0]

    async def session(client: httpx.AsyncClient, number: int) -> None:
        transcript = f"{SYSTEM}\nuser {number}: plan the file search"
        for step in range(steps):
            response = await client.post(
                f"{url}/v1/completions",
                json={
                    "model": model,
                    "prompt": transcript,
                    "max_tokens": 12,
                    "ignore_eos": True,
                    "temperature": 0,
                },
            )
            assert response.status_code == 200, f"{url}: {response.text[:500]}"
            usage = response.json()["usage"]
            totals[0] += 1
            totals[1] += usage["prompt_tokens"]
            totals[2] += usage["completion_tokens"]
            transcript += f"\nassistant: call tool {step}\ntool result {step}: read the file"

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(session(client, n) for n in range(sessions)))
    return totals[0], totals[1], totals[2]


def test_kneepoint_reports_what_vllm_counted_over_the_window(vllm_url: str, tmp_path: Path) -> None:
    config = Config(
        database=f"sqlite:///{tmp_path / 'k.db'}",
        targets=[Target(name="real-vllm", kind="vllm", url=f"{vllm_url}/metrics")],
    )
    sessions = open_store(config.database)
    before = vllm_counters(vllm_url)
    [first] = collect_once(config, sessions, clock=lambda: 1000.0)
    assert first.ok, first.error

    requests, prompt_tokens, completion_tokens = asyncio.run(agent_sessions(vllm_url, 4, 3))
    deadline = time.monotonic() + 30  # counters land when the engine finishes its step
    while (
        vllm_counters(vllm_url).get("vllm:request_success_total", 0)
        < (before.get("vllm:request_success_total", 0) + requests)
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    after = vllm_counters(vllm_url)
    [second] = collect_once(config, sessions, clock=lambda: 1060.0)
    assert second.ok, second.error

    with sessions() as session:
        status = build_status(session, config, now=1060.0, window=120.0)
        frame = queries.replica_frame(session, 0, 2000)
    replica = status["replicas"][0]
    assert replica["up"] is True, replica["last_error"]
    assert (replica["engine_generation"], replica["engines"], replica["model_names"]) == (
        "v1",
        1,
        ["tiny"],
    )
    assert replica["kv_cache_capacity_tokens"] == after["block_size"] * after["num_gpu_blocks"]

    def vllm_delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    # Tokens: kneepoint's rate over the 60 s between its scrapes, times 60, is vLLM's own
    # increase, which is what the responses' usage said.
    generated = replica["generation_tokens_per_second"] * 60
    assert generated == pytest.approx(vllm_delta("vllm:generation_tokens_total")), "generation"
    assert generated == pytest.approx(completion_tokens), "generation tokens vs. usage"
    prompt = replica["prompt_tokens_per_second"] * 60
    assert prompt == pytest.approx(vllm_delta("vllm:prompt_tokens_total")), "prompt tokens"
    assert prompt == pytest.approx(prompt_tokens), "prompt tokens vs. usage"
    assert replica["preemptions"] == vllm_delta("vllm:num_preemptions_total") == 0
    # Stored counters and histograms move exactly as vLLM's do.
    numeric = frame.select_dtypes("number")
    stored = numeric.iloc[-1] - numeric.iloc[0]
    assert stored["prefix_cache_queries"] == vllm_delta("vllm:prefix_cache_queries_total")
    assert stored["prefix_cache_hits"] == vllm_delta("vllm:prefix_cache_hits_total")
    assert stored["prefix_cache_hits"] > 0, "agent steps re-send their prefix: some must hit"
    assert replica["prefix_cache_hit_rate"] == pytest.approx(
        vllm_delta("vllm:prefix_cache_hits_total") / vllm_delta("vllm:prefix_cache_queries_total")
    ), "prefix-cache hit rate"
    assert stored["requests_finished_length"] == requests
    with sessions() as session:
        layouts = queries.histogram_layouts(session)
    ttft = queries.histograms(frame["hist_ttft"], layouts)
    assert ttft[-1] is not None and ttft[0] is not None
    assert ttft[-1].count - ttft[0].count == after["ttft_count"] - before["ttft_count"] == requests
    assert replica["requests_running"] == 0 and replica["requests_waiting"] == 0


def metric_families(url: str) -> dict[str, tuple[str, frozenset[str]]]:
    found = {}
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name.startswith("vllm:"):
            labels = frozenset().union(*(set(s.labels) - {"le"} for s in family.samples))
            found[family.name] = (family.type, labels)
    return found


def test_the_twin_speaks_vllm_0_32_like_the_real_server(vllm_url: str) -> None:
    """The same workload through a real vLLM and through the fleet twin: the same metric
    families, types and label names come out."""
    twin = Fleet(single_replica("l4", "qwen3-4b", 0, 0)).start()
    try:
        asyncio.run(agent_sessions(vllm_url, 2, 2))
        asyncio.run(agent_sessions(twin.url("qwen3-4b"), 2, 2, model="Qwen/Qwen3-4B"))
        real, simulated = metric_families(vllm_url), metric_families(twin.url("qwen3-4b"))
    finally:
        twin.stop()
    assert set(simulated) == set(real), (
        f"only in vLLM: {set(real) - set(simulated)}; "
        f"only in the twin: {set(simulated) - set(real)}"
    )
    differing = {
        name: (real[name], simulated[name]) for name in real if real[name] != simulated[name]
    }
    assert not differing, differing
