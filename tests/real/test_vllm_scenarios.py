"""Two scenarios a real vLLM 0.32 (CPU build) is driven into, each on its own server: forced
preemption and n-gram speculative decoding. kneepoint's numbers over the window must be
those vLLM's own counters give over the same window. (Prefix caching:
test_vllm_collect.py.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from collectors.collect import collect_once
from kneepoint.config import Config, Target
from kneepoint.derived.ratios import verdict
from kneepoint.store.db import open_store
from kneepoint.views import build_view
from tests.real.test_vllm_collect import vllm_counters
from tests.real.vllm_server import Vllm

pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]


@dataclass
class Observed:
    replica: dict[str, Any]  # kneepoint status over the window
    page: dict[str, Any]  # the page numbers (views) for the replica
    delta: Callable[[str], float]  # vLLM's own increase of a counter over the same window
    before: dict[str, float]
    after: dict[str, float]


def observe(url: str, folder: Path, load: Callable[[], int]) -> Observed:
    """Scrape, run `load` (it returns the requests it made), wait until vLLM has counted
    them, scrape again; kneepoint's view of that window and vLLM's counters around it."""
    config = Config(
        database=f"sqlite:///{folder / 'k.db'}",
        targets=[Target(name="real-vllm", kind="vllm", url=f"{url}/metrics")],
    )
    sessions = open_store(config.database)
    before = vllm_counters(url)
    [first] = collect_once(config, sessions, clock=lambda: 1000.0)
    requests = load()
    deadline = time.monotonic() + 60  # counters land when the engine finishes its step
    done = before.get("vllm:request_success_total", 0) + requests
    while vllm_counters(url).get("vllm:request_success_total", 0) < done:
        assert time.monotonic() < deadline, "vLLM did not count the requests within 60 s"
        time.sleep(0.2)
    after = vllm_counters(url)
    [second] = collect_once(config, sessions, clock=lambda: 1060.0)
    assert first.ok and second.ok, (first.error, second.error)
    with sessions() as session:
        view = build_view(session, config, 1060.0, 120.0)
    (replica,) = view.status["replicas"]
    return Observed(
        replica,
        view.rows["real-vllm"],
        lambda name: after.get(name, 0.0) - before.get(name, 0.0),
        before,
        after,
    )


def completions(
    url: str,
    count: int,
    max_tokens: int,
    prompt: Callable[[int], str],
    temperature: float = 0.0,
) -> int:
    async def run() -> None:
        async with httpx.AsyncClient(timeout=300) as client:

            async def one(number: int) -> None:
                body = {
                    "model": "tiny",
                    "prompt": prompt(number),
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "temperature": temperature,
                }
                response = await client.post(f"{url}/v1/completions", json=body)
                assert response.status_code == 200, response.text[:300]

            await asyncio.gather(*(one(n) for n in range(count)))

    asyncio.run(run())
    return count


@pytest.fixture(scope="module")
def starved(tiny_servers: dict[str, Vllm]) -> Vllm:
    """12 KV blocks of 128 tokens for 32 sequences of 300: vLLM must preempt."""
    return tiny_servers["starved"]


@pytest.fixture(scope="module")
def ngram(tiny_servers: dict[str, Vllm]) -> Vllm:
    """n-gram speculative decoding (vllm_server.NGRAM)."""
    return tiny_servers["ngram"]


def test_forced_preemption_is_counted_and_its_recompute_estimated(
    starved: Vllm, tmp_path: Path
) -> None:
    seen = observe(
        starved.url,
        tmp_path,
        lambda: completions(starved.url, 32, 300, lambda n: f"agent {n} reads file {n}"),
    )
    preempted = seen.delta("vllm:num_preemptions_total")
    assert preempted > 0, "the starved server did not preempt: the scenario did not happen"
    assert seen.replica["preemptions"] == preempted, "preemptions"
    assert seen.replica["preemptions_per_second"] == pytest.approx(preempted / 60), "per second"
    # V1 gives no recompute counter: kneepoint estimates it and says so.
    assert seen.replica["preemption_recompute_is_estimate"] is True
    hit_rate = seen.delta("vllm:prefix_cache_hits_total") / seen.delta(
        "vllm:prefix_cache_queries_total"
    )
    mean_prompt = seen.delta("vllm:request_prompt_tokens_sum") / seen.delta(
        "vllm:request_prompt_tokens_count"
    )
    mean_generated = seen.delta("vllm:request_generation_tokens_sum") / seen.delta(
        "vllm:request_generation_tokens_count"
    )
    # The estimate's formula (docs/reference/metrics.md), from vLLM's own counters.
    expected = preempted * (mean_prompt + 0.5 * mean_generated) * (1 - hit_rate)
    assert seen.replica["preemption_recompute_tokens"] == pytest.approx(expected), "recompute"
    finished = seen.delta("vllm:request_success_total")
    assert seen.page["preemptions_per_request"] == pytest.approx(preempted / finished)
    assert seen.page["peak_waiting"] is not None


def test_ngram_speculation_with_random_weights_reads_as_slowing_down(
    ngram: Vllm, tmp_path: Path
) -> None:
    seen = observe(
        ngram.url,
        tmp_path,
        # Sampled, not greedy: a random model's greedy output repeats itself, which an n-gram
        # drafter predicts (36 % accepted); sampled, its text is noise the drafter cannot match.
        lambda: completions(ngram.url, 8, 64, lambda n: f"plan step {n} call tool", 1.0),
    )
    drafts = seen.delta("vllm:spec_decode_num_drafts_total")
    drafted = seen.delta("vllm:spec_decode_num_draft_tokens_total")
    accepted = seen.delta("vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and drafted > 0, "the n-gram drafter proposed nothing"
    assert seen.replica["spec_decode_acceptance_rate"] == pytest.approx(accepted / drafted)
    assert seen.replica["spec_decode_mean_acceptance_length"] == pytest.approx(
        1 + accepted / drafts
    )
    positions = seen.replica["spec_decode_per_position_acceptance"]
    assert positions is not None and len(positions) == 3  # num_speculative_tokens
    assert accepted / drafted < 0.1, "random weights: almost nothing drafted is accepted"
    assert seen.page["spec_verdict"] == "slowing down"
    assert verdict(seen.page["spec_expected_speedup"]) == "slowing down"
    assert seen.page["spec_expected_speedup"] < 1
