"""The twin's scheduler against the real vLLM's: the same requests, the same KV blocks and
limits, the same counters.

    KNEEPOINT_WITH_VLLM=1 .venv/bin/python bench/scheduler_parity.py [--url URL] [--repeats N]
        [--max-num-batched-tokens N]

Starts the real vLLM CPU build's "starved" server (tests/real/vllm_server.py TINY_SERVERS:
12 KV blocks of 128 tokens, prefix caching on, the CPU defaults max_num_seqs 128 and
max_num_batched_tokens 2048, or the budget given: 256 splits the longer prompts into chunks),
or uses the one at --url (started with that budget). For each scenario it sends every
request at once (prompts as token ids, ignore_eos, max_tokens, temperature 0), and runs the
same requests through the twin (kneepoint/twin/simulated_engine.py) with the server's block
count and size and limits, all arriving at once. Prints, real against twin: preemptions
(vllm:num_preemptions_total), prefix-cache hits and queries, engine steps
(vllm:iteration_tokens_total's count) and the peak requests running and waiting (the real
server's polled every 50 ms, so a short peak can be missed).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kneepoint.twin.profiles import gpu, model  # noqa: E402
from kneepoint.twin.simulated_engine import Engine, EngineConfig  # noqa: E402

VOCAB = range(5, 330)  # the tiny model's 340 tokens, special ones left out
MAX_MODEL_LEN = 1024  # tests/real/vllm_server.py running_vllm
MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS = 128, 2048  # the CPU build's server defaults


@dataclass(frozen=True)
class Scenario:
    count: int
    prompt: tuple[int, int]  # unique prompt tokens, uniform between
    max_tokens: tuple[int, int]
    shared: int = 0  # tokens of a prefix every request starts with


SCENARIOS = {
    # 32 sequences of ~340 tokens in 11 usable blocks of 128: preemption after preemption.
    "preempt": Scenario(32, (30, 60), (300, 300)),
    # A 384-token prefix shared by 16 requests: prefix hits, little preemption.
    "prefix": Scenario(16, (16, 48), (64, 64), shared=384),
    # Longer prompts and mixed outputs: chunks, preemption and admission waits together.
    "mixed": Scenario(24, (100, 400), (50, 250)),
    # Prompts of 3-7 blocks: chunked under a small budget; the whole-sequence admission check.
    "long": Scenario(12, (400, 850), (50, 150)),
}

Request = tuple[list[int], int]


def requests_of(scenario: Scenario, seed: int) -> list[Request]:
    rng = random.Random(seed)
    shared = [rng.choice(VOCAB) for _ in range(scenario.shared)]
    return [
        (
            shared + [rng.choice(VOCAB) for _ in range(rng.randint(*scenario.prompt))],
            rng.randint(*scenario.max_tokens),
        )
        for _ in range(scenario.count)
    ]


def counters(url: str) -> dict[str, float]:
    values: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                values["block_size"] = float(sample.labels["block_size"])
                values["num_gpu_blocks"] = float(sample.labels["num_gpu_blocks"])
            elif not sample.labels.get("le") and not sample.name.endswith("_created"):
                if sample.name.startswith("vllm:num_requests_waiting_by_reason"):
                    continue
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


@dataclass
class Result:
    preemptions: float
    hits: float
    queries: float
    steps: float
    peak_running: float
    peak_waiting: float


def run_real(url: str, requests: list[Request]) -> Result:
    before = counters(url)
    peaks = {"running": 0.0, "waiting": 0.0}
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            now = counters(url)
            peaks["running"] = max(peaks["running"], now.get("vllm:num_requests_running", 0.0))
            peaks["waiting"] = max(peaks["waiting"], now.get("vllm:num_requests_waiting", 0.0))
            time.sleep(0.05)

    async def send() -> None:
        async with httpx.AsyncClient(timeout=600) as client:

            async def one(prompt: list[int], max_tokens: int) -> None:
                body = {
                    "model": "tiny",
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "temperature": 0.0,
                }
                response = await client.post(f"{url}/v1/completions", json=body)
                response.raise_for_status()

            await asyncio.gather(*(one(prompt, tokens) for prompt, tokens in requests))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        asyncio.run(send())
    finally:
        done.set()
        poller.join()
    time.sleep(1.0)  # the last step's counters reach /metrics
    after = counters(url)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    return Result(
        delta("vllm:num_preemptions_total"),
        delta("vllm:prefix_cache_hits_total"),
        delta("vllm:prefix_cache_queries_total"),
        delta("vllm:iteration_tokens_total_count"),
        peaks["running"],
        peaks["waiting"],
    )


def twin_engine(
    blocks: int, block_size: int, max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
) -> Engine:
    return Engine(
        EngineConfig(
            gpu=gpu("l4"),
            model=model("qwen3-4b"),
            num_gpu_blocks_override=blocks,
            block_size=block_size,
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=MAX_MODEL_LEN,
            enable_prefix_caching=True,
        )
    )


def run_twin(engine: Engine, requests: list[Request]) -> Result:
    for prompt, max_tokens in requests:
        engine.add(prompt, max_tokens)
    running = waiting = 0
    while not engine.idle:
        engine.step()
        running = max(running, len(engine.running))
        waiting = max(waiting, len(engine.waiting))
    stats = engine.stats
    return Result(
        stats.preemptions,
        stats.prefix_cache_hits,
        stats.prefix_cache_queries,
        sum(stats.histograms["iteration_tokens_total"].counts),
        running,
        waiting,
    )


def table(url: str, repeats: int, budget: int) -> list[tuple[str, int, Result, Result]]:
    shape = counters(url)
    blocks, block_size = int(shape["num_gpu_blocks"]), int(shape["block_size"])
    print(f"real server: {blocks} KV blocks of {block_size} tokens, budget {budget}", flush=True)
    rows = []
    for name, scenario in SCENARIOS.items():
        for repeat in range(repeats):
            # A fresh seed per run: no run hits the prefix cache another one filled.
            seed = hash((name, repeat, time.time_ns())) % 2**32
            requests = requests_of(scenario, seed)
            real = run_real(url, requests)
            twin = run_twin(twin_engine(blocks, block_size, budget), requests)
            rows.append((name, repeat, real, twin))
            print(row_text(name, repeat, real, twin), flush=True)
    return rows


HEADER = (
    "scenario  run  preemptions real/twin (ratio)  hits/queries real | twin"
    "            steps real/twin  peak running real/twin  peak waiting real/twin"
)


def row_text(name: str, repeat: int, real: Result, twin: Result) -> str:
    ratio = f"{twin.preemptions / real.preemptions:.2f}" if real.preemptions else "-"
    return (
        f"{name:<9} {repeat:>3}  {real.preemptions:>6.0f}/{twin.preemptions:<6.0f} ({ratio:>4})"
        f"       {real.hits:>5.0f}/{real.queries:<5.0f} | {twin.hits:>5.0f}/{twin.queries:<5.0f}"
        f"    {real.steps:>5.0f}/{twin.steps:<5.0f}"
        f"        {real.peak_running:>3.0f}/{twin.peak_running:<3.0f}"
        f"                {real.peak_waiting:>3.0f}/{twin.peak_waiting:<3.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running vLLM server with the starved configuration")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-num-batched-tokens", type=int, default=MAX_NUM_BATCHED_TOKENS)
    args = parser.parse_args()
    budget = args.max_num_batched_tokens
    print(HEADER)
    if args.url:
        table(args.url, args.repeats, budget)
        return
    from tests.real.vllm_server import STARTUP_SECONDS, TINY_SERVERS, running_vllm

    flags = TINY_SERVERS["starved"]
    if budget != MAX_NUM_BATCHED_TOKENS:
        flags = (*flags, "--max-num-batched-tokens", str(budget))
    with (
        tempfile.TemporaryDirectory() as folder,
        # A budget of its own compiles anew the first time (torch.compile's cache is keyed
        # by the configuration): give it longer.
        running_vllm(Path(folder), *flags, startup=STARTUP_SECONDS * 3) as server,
    ):
        table(server.url, args.repeats, budget)


if __name__ == "__main__":
    main()
