"""Agent-like work: a session's system prompt and tool schemas, a transcript that grows step
by step with bursts of tool output, think/act pauses, and a daily load shape."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

_VOCABULARY = tuple(
    "agent tool call result search read write file query plan step context user system "
    "function name description parameters type string integer object required schema value "
    "error retry summary table row column record status update list item repository branch "
    "commit test build deploy metric latency token cache replica request response".split()
)
TOOLS = (
    "search_docs",
    "read_file",
    "write_file",
    "run_tests",
    "query_metrics",
    "open_ticket",
    "list_dir",
    "git_diff",
)


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(_VOCABULARY) for _ in range(count))


def system_prompt(version: int) -> str:
    """The shared prefix every session sends: a deploy changes its version (and every cache)."""
    rng = random.Random(version)
    schemas = "\n".join(
        f'{{"name": "{tool}", "description": "{words(rng, 18)}", "parameters": '
        f'{{"type": "object", "properties": {{"{words(rng, 1)}": {{"type": "string"}}}}}}}}'
        for tool in TOOLS
    )
    return f"system prompt v{version}: you are a coding agent. {words(rng, 120)}\ntools:\n{schemas}"


@dataclass(frozen=True)
class Step:
    messages: list[dict[str, str]]
    max_tokens: int
    pause_after: float  # seconds the agent thinks and acts before its next step


def session(rng: random.Random, version: int, number: int) -> Iterator[Step]:
    """One agent task: 3 to 10 steps, each re-sending the whole transcript."""
    messages = [
        {"role": "system", "content": system_prompt(version)},
        {"role": "user", "content": f"task {number}: {words(rng, 40)}"},
    ]
    for step in range(rng.randint(3, 10)):
        yield Step(list(messages), rng.randint(40, 250), rng.uniform(1.0, 6.0))
        tool = rng.choice(TOOLS)
        messages.append(
            {
                "role": "assistant",
                "content": f"call {tool} step {step}: {words(rng, rng.randint(20, 80))}",
            }
        )
        # Tool output comes in bursts: usually short, sometimes a whole file or log.
        size = rng.choice((60, 120, 300, 600, 1500)) if rng.random() > 0.1 else 3000
        messages.append({"role": "tool", "content": f"{tool} result: {words(rng, size)}"})


def daily_load(t: float, day_seconds: float, trough: float = 0.15) -> float:
    """Share of the peak load at time t: low at night, highest in the afternoon."""
    phase = (t % day_seconds) / day_seconds  # 0 = midnight
    return trough + (1 - trough) * 0.5 * (1 - math.cos(2 * math.pi * (phase - 0.15)))
