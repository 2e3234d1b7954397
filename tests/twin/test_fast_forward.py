"""Engine.advance fast-forwards pure-decode stretches with the results of step() one at a
time: the same counters, histograms, preemptions and times (to float rounding)."""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable

import pytest

from kneepoint.twin.profiles import gpu, model
from kneepoint.twin.simulated_engine import Engine, EngineConfig

Arrival = tuple[float, list[int], int]  # time, prompt, max_tokens


def config(**overrides: object) -> EngineConfig:
    base: dict[str, object] = {"gpu": gpu("rtx4000ada"), "model": model("qwen3-4b")}
    return EngineConfig(**(base | overrides))  # type: ignore[arg-type]


def load(seed: int, count: int, rate: float, shared: int = 0) -> list[Arrival]:
    """Poisson arrivals of random prompts (the first `shared` tokens common to all)."""
    rng = random.Random(seed)
    common = [rng.randrange(50_000) for _ in range(shared)]
    now, arrivals = 0.0, []
    for _ in range(count):
        now += rng.expovariate(rate)
        prompt = common + [rng.randrange(50_000) for _ in range(rng.randint(20, 400))]
        arrivals.append((now, prompt, rng.randint(1, 300)))
    return arrivals


Sinks = dict[int, list[tuple[int, bool, float]]]


def sink_for(sinks: Sinks, index: int) -> Callable[[int, bool, float], None]:
    sinks[index] = []
    return lambda tokens, done, at: sinks[index].append((tokens, done, at))


def by_steps(engine: Engine, arrivals: list[Arrival]) -> Sinks:
    sinks: Sinks = {}
    index = 0
    while True:
        while index < len(arrivals) and arrivals[index][0] <= engine.now:
            _, prompt, max_tokens = arrivals[index]
            engine.add(prompt, max_tokens, sink_for(sinks, index))
            index += 1
        if engine.idle:
            if index == len(arrivals):
                return sinks
            engine.now = arrivals[index][0]
            continue
        engine.step()


def by_advance(engine: Engine, arrivals: list[Arrival]) -> Sinks:
    sinks: Sinks = {}
    index = 0
    while True:
        while index < len(arrivals) and arrivals[index][0] <= engine.now:
            _, prompt, max_tokens = arrivals[index]
            engine.add(prompt, max_tokens, sink_for(sinks, index))
            index += 1
        if index == len(arrivals) and engine.idle:
            return sinks
        engine.advance(arrivals[index][0] if index < len(arrivals) else math.inf)


def assert_same(stepped: Engine, advanced: Engine) -> None:
    assert advanced.now == pytest.approx(stepped.now, rel=1e-9)
    ours, theirs = dataclasses.asdict(advanced.stats), dataclasses.asdict(stepped.stats)
    histograms = ours.pop("histograms"), theirs.pop("histograms")
    for name, value in theirs.items():
        assert ours[name] == pytest.approx(value, rel=1e-9), name
    for name, histogram in histograms[1].items():
        assert histograms[0][name]["counts"] == histogram["counts"], name
        assert histograms[0][name]["total"] == pytest.approx(histogram["total"], rel=1e-9), name


LOADS = {
    # 60 blocks of 16 tokens for up to ~700-token sequences: preemptions.
    "preemption": (config(num_gpu_blocks_override=60), load(1, 40, 20.0)),
    # A shared 256-token system prompt: prefix hits.
    "prefix hits": (config(num_gpu_blocks_override=400), load(2, 40, 10.0, shared=256)),
    # A 128-token budget splits every longer prompt into chunks.
    "chunked prefill": (config(max_num_batched_tokens=128), load(3, 30, 10.0)),
    # Four running at most, the rest wait.
    "max_num_seqs": (config(max_num_seqs=4), load(4, 30, 30.0)),
    # No chunking: a prompt past the budget left waits for a later step.
    "no chunked prefill": (
        config(max_num_batched_tokens=512, enable_chunked_prefill=False),
        load(5, 30, 30.0),
    ),
}


@pytest.mark.parametrize("name", LOADS)
def test_advance_gives_what_stepping_gives(name: str) -> None:
    engine_config, arrivals = LOADS[name]
    stepped, advanced = Engine(engine_config), Engine(engine_config)
    step_sinks = by_steps(stepped, arrivals)
    advance_sinks = by_advance(advanced, arrivals)
    assert advanced.fast_forwarded > 0, "no stretch was fast-forwarded: nothing compared"
    assert_same(stepped, advanced)
    for index, heard in step_sinks.items():
        got = advance_sinks[index]
        assert sum(tokens for tokens, _, _ in got) == sum(tokens for tokens, _, _ in heard)
        assert got[-1][1] and heard[-1][1]
        assert got[-1][2] == pytest.approx(heard[-1][2], rel=1e-9)
    if name == "preemption":
        assert stepped.stats.preemptions > 0
    if name == "prefix hits":
        assert stepped.stats.prefix_cache_hits > 0


COUNTERS = (
    "prompt_tokens",
    "generation_tokens",
    "preemptions",
    "preempted_prompt_tokens",
    "preempted_output_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prompt_local_compute",
    "finished",
)


@pytest.mark.parametrize("name", LOADS)
def test_a_counters_only_engine_runs_the_same_and_keeps_the_counters(name: str) -> None:
    """The what-if replay's engine: the same times, tokens and counters, exactly; no
    histogram observed and no time or work summed."""
    engine_config, arrivals = LOADS[name]
    full, lean = Engine(engine_config), Engine(engine_config, counters_only=True)
    full_sinks, lean_sinks = by_advance(full, arrivals), by_advance(lean, arrivals)
    assert lean.fast_forwarded == full.fast_forwarded > 0
    assert lean.now == full.now and lean_sinks == full_sinks
    for counter in COUNTERS:
        assert getattr(lean.stats, counter) == getattr(full.stats, counter), counter
    assert full.stats.busy_seconds > 0 and full.stats.estimated_flops > 0
    assert lean.stats.busy_seconds == lean.stats.estimated_flops == 0.0
    assert sum(full.stats.histograms["inter_token_latency_seconds"].counts) > 0
    assert all(sum(h.counts) == 0 for h in lean.stats.histograms.values())


def test_advance_stops_at_until_and_when_a_request_finishes() -> None:
    engine = Engine(config())
    engine.add(list(range(100)), 50)
    engine.add(list(range(1000, 1100)), 500)
    now = engine.advance(0.5)
    assert now >= 0.5 and engine.stats.finished["length"] == 0
    before = engine.now
    engine.advance(math.inf)  # runs until the first request finishes
    assert engine.stats.finished["length"] == 1 and len(engine.running) == 1
    assert engine.now > before
    engine.advance(math.inf)
    assert engine.idle
    idle_since = engine.now
    assert engine.advance(idle_since + 10) == idle_since + 10


def test_an_idle_engine_jumps_to_until() -> None:
    engine = Engine(config())
    assert engine.advance(12.5) == 12.5


def test_fast_forward_is_faster_on_a_decode_heavy_load() -> None:
    # 32 requests decoding 500 tokens each: advance() runs most steps in bulk.
    arrivals = [(0.0, [n] * 64 + list(range(n * 100, n * 100 + 64)), 500) for n in range(32)]
    timings = {}
    for mode, drive in (("step", by_steps), ("advance", by_advance)):
        engine = Engine(config())
        started = time.perf_counter()
        drive(engine, arrivals)
        timings[mode] = time.perf_counter() - started
    assert timings["advance"] < timings["step"] / 3, timings


def test_a_subclass_that_notes_each_step_is_stepped_one_at_a_time() -> None:
    class Noting(Engine):
        noted = 0

        def _duration(self, work: list) -> float:  # type: ignore[type-arg]
            self.noted += 1
            return super()._duration(work)

    engine = Noting(config())
    engine.add(list(range(64)), 200)
    engine.advance(math.inf)
    assert engine.fast_forwarded == 0
    assert engine.noted == sum(engine.stats.histograms["iteration_tokens_total"].counts) == 200
