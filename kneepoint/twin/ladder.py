"""A concurrency sweep of one twin engine in virtual time: what `kneepoint sweep` would
measure against the replica over HTTP, in a fraction of a second (for the demo's Knee page
and for what-ifs). Closed-loop clients, fixed input and output lengths, random prompts. A
sweep measures what the engine can do, so an engine's queue limits (which would answer the
sweep's own clients 503) are lifted for it."""

from __future__ import annotations

import random
from dataclasses import replace

from kneepoint.knee.runs import Point, Run
from kneepoint.knee.sweep import DEFAULT_LADDER, Outcome, summarize
from kneepoint.twin.openai_api import VOCABULARY
from kneepoint.twin.simulated_engine import Engine, EngineConfig


def step(
    config: EngineConfig,
    concurrency: int,
    requests: int,
    input_tokens: int = 256,
    output_tokens: int = 128,
    seed: int = 0,
) -> Point:
    engine = Engine(
        replace(config, max_num_queued_reqs=None, max_num_queued_tokens=None), seed=seed
    )
    rng = random.Random(seed * 7919 + concurrency)
    outcomes: list[Outcome] = []
    sent = 0

    def send() -> None:
        nonlocal sent
        sent += 1
        outcome = Outcome(start=engine.now)
        outcomes.append(outcome)
        state = {"last": engine.now}

        def sink(count: int, done: bool, at: float) -> None:
            if outcome.ttft is None:
                outcome.ttft = at - outcome.start
            else:
                outcome.gaps.append(at - state["last"])
            state["last"] = at
            outcome.output_tokens += count
            if done:
                outcome.end = at
                if sent < requests:
                    pending.append(at)

        prompt = [rng.randrange(VOCABULARY) for _ in range(input_tokens)]
        engine.add(prompt, output_tokens, sink)

    pending: list[float] = []
    for _ in range(min(concurrency, requests)):
        send()
    while not engine.idle or pending:
        while pending:  # each finished client sends its next request at once
            pending.pop()
            send()
        if not engine.idle:
            engine.step()
    return summarize(concurrency, outcomes, 0.0, {})


def ladder_run(
    config: EngineConfig,
    label: str,
    model: str,
    ladder: tuple[int, ...] = DEFAULT_LADDER,
    input_tokens: int = 256,
    output_tokens: int = 128,
) -> Run:
    points = tuple(step(config, c, max(8, 4 * c), input_tokens, output_tokens) for c in ladder)
    # The client costs nothing in virtual time; a CPU figure would only mislead.
    points = tuple(Point.from_dict({**p.as_dict(), "client_cpu_cores": None}) for p in points)
    notes = {"input_tokens": input_tokens, "output_tokens": output_tokens, "virtual_time": True}
    return Run(label, model, "sweep", points, None, notes)
