"""Agent traffic: what routing and deploys do to the prefix-cache hit rate."""

from __future__ import annotations

import random
import time

import httpx

from collectors.engines.vllm import parse_vllm
from kneepoint.twin.agents import daily_load, session
from kneepoint.twin.fleet import Fleet, FleetSpec
from kneepoint.twin.openai_api import chat_prompt, tokenize
from kneepoint.twin.profiles import gpu, model
from kneepoint.twin.simulated_engine import Engine, EngineConfig
from kneepoint.twin.traffic import Group, Traffic

TWO_REPLICAS = {
    "nodes": [{"name": "node", "gpus": ["h100-80gb", "h100-80gb"]}],
    "replicas": [
        {
            "name": f"r{i}",
            "model": "qwen3-4b",
            "node": "node",
            "gpu_index": i,
            "max_model_len": 16384,
        }
        for i in range(2)
    ],
}


def hit_rate(fleet: Fleet) -> float:
    hits = queries = 0.0
    for name in fleet.replicas:
        sample = parse_vllm(httpx.get(f"{fleet.url(name)}/metrics").text)
        hits += sample.counters["prefix_cache_hits"] or 0
        queries += sample.counters["prefix_cache_queries"] or 0
    assert queries > 0, "no traffic reached the replicas"
    return hits / queries


def run(routing: str) -> tuple[float, int]:
    fleet = Fleet(FleetSpec.model_validate(TWO_REPLICAS | {"speed": 4.0})).start()
    urls = [fleet.url(name) for name in fleet.replicas]
    traffic = Traffic(
        [Group("Qwen/Qwen3-4B", urls, 6, routing)],  # type: ignore[arg-type]
        pause_scale=0.02,
        shape=lambda _: 1.0,
        seed=1,
    ).start()
    try:
        deadline = time.monotonic() + 60
        while traffic.stats.requests < 60 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        traffic.stop()
    rate = hit_rate(fleet)
    fleet.stop()
    return rate, traffic.stats.errors


def test_sticky_routing_keeps_the_hit_rate_that_round_robin_loses() -> None:
    sticky, sticky_errors = run("sticky")
    round_robin, rr_errors = run("round-robin")
    assert sticky_errors == rr_errors == 0
    assert sticky > round_robin + 0.1, (sticky, round_robin)


def test_a_deploy_makes_the_next_session_miss_the_system_prompt() -> None:
    engine = Engine(EngineConfig(gpu("h100-80gb"), model("qwen3-4b")))

    def first_step_hits(version: int, number: int) -> int:
        before = engine.stats.prefix_cache_hits
        step = next(session(random.Random(number), version, number))
        engine.add(tokenize(chat_prompt(step.messages)), 8)
        while not engine.idle:
            engine.step()
        return engine.stats.prefix_cache_hits - before

    first_step_hits(1, 1)  # warms the cache with version 1's system prompt
    assert first_step_hits(1, 2) > 500  # another session shares the whole system prompt
    assert first_step_hits(2, 3) == 0  # after the deploy nothing is shared


def test_the_daily_shape_is_low_at_night_and_high_in_the_afternoon() -> None:
    day = 86400.0
    night, afternoon = daily_load(3 * 3600, day), daily_load(15 * 3600, day)
    assert night < 0.3 < 0.9 < afternoon <= 1.0


def test_deploys_come_on_schedule() -> None:
    fleet = Fleet(
        FleetSpec.model_validate(
            {
                "nodes": [{"name": "n", "gpus": ["h100-80gb"]}],
                "replicas": [{"name": "r", "model": "qwen3-4b", "node": "n"}],
            }
        )
    ).start()
    traffic = Traffic(
        [Group("Qwen/Qwen3-4B", [fleet.url("r")], 1)],
        shape=lambda _: 1.0,
        pause_scale=0.02,
        deploy_every=0.4,
    ).start()
    try:
        time.sleep(2.5)
    finally:
        traffic.stop()
        fleet.stop()
    assert traffic.version >= 3
    assert traffic.stats.requests > 0 and traffic.stats.errors == 0
