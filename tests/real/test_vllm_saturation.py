"""The saturation verdict on a real vLLM 0.32 (CPU build), the "limits" server
(vllm_server.LIMITS_FLAGS: 2 running, at most 4 in flight, a 256-token budget per step): a
prefill-heavy run (prompts of nearly the whole context, 1-2 output tokens, more clients than
the server admits) is called saturated while its KV occupancy stays low, and a light run (one
short request at a time) is not. Each run is collected by kneepoint's own collector into a
store of its own, and judged by `build_status` over that run's window."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from collectors.collect import collect_once
from kneepoint.config import load_config
from kneepoint.samples import SATURATION
from kneepoint.status import build_status
from kneepoint.store.db import open_store
from kneepoint.store.models import ReplicaSampleRow
from tests.conftest import migrated
from tests.real.vllm_server import BATCHED_TOKENS_LIMITS, MAX_QUEUED_LIMITS, MAX_SEQS_LIMITS, Vllm

pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]

NAME = "vllm-limits"
# Each run's length; the collector scrapes once a second. The heavy run's verdict reads
# 20 samples (the queue) and ~900 step records (the budget); the light one only has to
# judge the budget, which a few hundred steps do.
HEAVY_SECONDS, LIGHT_SECONDS = 20.0, 10.0
PROMPT_TOKENS = 1000  # the model's max-model-len is 1024
CLIENTS = 2 * (MAX_SEQS_LIMITS + MAX_QUEUED_LIMITS)  # more than the server admits at once


@pytest.fixture(scope="module")
def limits(tiny_servers: dict[str, Vllm]) -> Vllm:
    return tiny_servers["limits"]


def _prompt(rng: random.Random, tokens: int, vocabulary: int) -> list[int]:
    """A prompt of exactly `tokens` ids, random from its first token on: no two share a
    cached prefix block, so every one is prefilled whole. (The first ids are the special
    tokens.)"""
    return [rng.randrange(10, vocabulary) for _ in range(tokens)]


async def _client(
    server: Vllm, seed: int, tokens: int, output: int, until: float, answers: list[int]
) -> None:
    vocabulary = json.loads((server.model / "config.json").read_text())["vocab_size"]
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=120) as client:
        while time.monotonic() < until:
            body = {
                "model": "tiny",
                "prompt": _prompt(rng, tokens, vocabulary),
                "max_tokens": output,
                "ignore_eos": True,
            }
            answer = await client.post(f"{server.url}/v1/completions", json=body)
            answers.append(answer.status_code)
            if answer.status_code == 503:  # refused at admission: try again a little later
                await asyncio.sleep(0.2)


def _load(
    server: Vllm, clients: int, tokens: int, output: int, seconds: float, answers: list[int]
) -> None:
    until = time.monotonic() + seconds

    async def run() -> None:
        await asyncio.gather(
            *(_client(server, n, tokens, output, until, answers) for n in range(clients))
        )

    asyncio.run(run())


def _judged_run(
    server: Vllm, folder: Path, clients: int, tokens: int, output: int, seconds: float
) -> tuple[dict[str, Any], float | None, list[int]]:
    """Run the load while kneepoint's collector scrapes the server once a second into a store
    of its own; return the replica's status over the run's window (from the scrape before
    the load to the moment its clients stop sending: the requests still in flight then
    drain after it), the highest KV occupancy stored, and the HTTP status of every request."""
    folder.mkdir()
    path = folder / "kneepoint.yaml"
    path.write_text(
        f"database: sqlite:///{folder / 'k.db'}\n"
        "scrape_interval: 1s\n"
        f"targets:\n  - {{name: {NAME}, kind: vllm, url: '{server.url}/metrics', "
        f"timeout: 5s, max_num_batched_tokens: {BATCHED_TOKENS_LIMITS}}}\n"
    )
    config = load_config(migrated(path))
    sessions = open_store(config.database)
    answers: list[int] = []
    started = time.time()
    assert collect_once(config, sessions)[0].ok  # the window's first sample: before the load
    load = threading.Thread(target=_load, args=(server, clients, tokens, output, seconds, answers))
    stopped = time.time() + seconds  # when _load's clients stop sending
    load.start()
    while load.is_alive():
        time.sleep(config.scrape_interval)  # the collector's own cadence
        assert collect_once(config, sessions)[0].ok
    load.join()
    with sessions() as session:
        (replica,) = build_status(session, config, stopped, stopped - started)["replicas"]
        peak_kv = session.scalar(select(func.max(ReplicaSampleRow.kv_cache_usage)))
        queue = session.execute(
            select(ReplicaSampleRow.requests_running, ReplicaSampleRow.requests_waiting).where(
                ReplicaSampleRow.ts <= stopped
            )
        ).all()
    print(f"{folder.name}: (running, waiting) at each scrape: {[tuple(q) for q in queue]}")
    return replica, peak_kv, answers


def test_a_prefill_heavy_run_is_saturated_with_kv_low_and_a_light_run_is_not(
    limits: Vllm, tmp_path: Path
) -> None:
    light, light_kv, light_answers = _judged_run(
        limits, tmp_path / "light", 1, 16, 16, LIGHT_SECONDS
    )
    heavy, heavy_kv, heavy_answers = _judged_run(
        limits, tmp_path / "heavy", CLIENTS, PROMPT_TOKENS, 1, HEAVY_SECONDS
    )
    evidence = f"light: {light['saturation']}\nheavy: {heavy['saturation']}"
    print(evidence)
    print(f"peak KV stored: light {light_kv}, heavy {heavy_kv}")
    print(
        f"answers: light {len(light_answers)}, heavy {heavy_answers.count(200)} served, "
        f"{heavy_answers.count(503)} refused"
    )
    assert set(light_answers) == {200} and set(heavy_answers) <= {200, 503}
    assert heavy_answers.count(200) >= CLIENTS  # the heavy run served, not only refused

    assert light["saturation"]["saturated"] is False, evidence
    assert light["saturation"]["reasons"] == []
    # The light run's token budget was judged, not skipped: its steps are far below it.
    assert "token_budget_full" not in light["saturation"]["unjudged"], evidence

    assert heavy["saturation"]["saturated"] is True, evidence
    reasons = {reason["reason"] for reason in heavy["saturation"]["reasons"]}
    assert reasons - {"kv_full"}, evidence
    # The KV cache was never near full: the verdict did not come from it.
    assert heavy_kv is not None and heavy_kv < SATURATION
    assert "kv_full" not in reasons
    # The prefill work itself, not only the queue limit, says saturated.
    assert reasons & {"token_budget_full", "queue_growing"}, evidence
