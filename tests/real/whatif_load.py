"""Replay a recorded agent trace (kneepoint.whatif.trace.AgentTrace) closed-loop against real
vLLM servers, each run held against the servers' own counters. Run as its own process on the
core the engines leave free (vllm_server.off_engine_core): `python -m tests.real.whatif_load`
reads one JSON job on stdin, {"runs": [{"trace": PATH, "sessions": m, "urls": [..], "load": n,
...}, ...]} (a run replays the first m sessions of the trace at PATH; its other keys are
echoed), and prints one JSON object per run, in order, as each ends.

A run of load n: n clients, each running one session at a time, its turns in order (send the
turn's token-id prompt to /v1/completions with its max_tokens, ignore_eos and a stream; wait
for the whole answer; wait the turn's think time unless it was the session's last; next);
when a client's session ends it takes the next session of the trace not yet taken; the run
ends when every session of the trace has run. With several urls (replicas), session i's
turns all go to urls[i mod replicas] (sticky, as the twin's simulate_trace routes them).

Before a run each server's prefix cache is emptied (POST /reset_prefix_cache: the servers
run in dev mode), so a configuration replayed again does not find the last run's blocks.
A run's figures:
- the servers' counters before and after (summed over the urls): requests, generated and
  prompt tokens, preemptions, prefix-cache queries and hits, spec-decode drafts, draft and
  accepted tokens; "after" is read once the servers have recorded every request of the run;
- the gauges vllm:num_requests_waiting and _running sampled every SAMPLE_SECONDS on every
  server (summed), their time-averages over the run;
- per request, from the stream: the time to its first token and the gaps between the
  chunks that carried tokens after it (one gap per engine step that emitted tokens, as
  vLLM's own inter-token-latency histogram counts them; a step of speculative decoding may
  emit several), with the number of tokens each chunk carried (usage, continuous stats);
- the wall time, first request sent to last token read.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import time
from typing import Any

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "requests": "vllm:time_to_first_token_seconds_count",
    "finished": "vllm:e2e_request_latency_seconds_count",
    "tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "preemptions": "vllm:num_preemptions_total",
    "prefix_queries": "vllm:prefix_cache_queries_total",
    "prefix_hits": "vllm:prefix_cache_hits_total",
    "spec_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}
GAUGES = {"waiting": "vllm:num_requests_waiting", "running": "vllm:num_requests_running"}
SAMPLE_SECONDS = 0.25


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The server's counters and gauges of COUNTERS and GAUGES (summed over label sets)."""
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    names = {name: key for key, name in {**COUNTERS, **GAUGES}.items()}
    out = dict.fromkeys(names.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                out[names[sample.name]] += sample.value
    return out


async def totals(http: aiohttp.ClientSession, urls: list[str]) -> dict[str, float]:
    each = await asyncio.gather(*(scrape(http, url) for url in urls))
    return {key: sum(one[key] for one in each) for key in each[0]}


async def one_request(
    http: aiohttp.ClientSession, url: str, prompt: list[int], max_tokens: int
) -> dict[str, Any]:
    """One streamed completion: its TTFT, the gaps between token-carrying chunks after the
    first, the tokens each of those chunks carried, the tokens the server reported."""
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    sent = time.monotonic()
    out: dict[str, Any] = {"ttft": None, "gaps": [], "chunk_tokens": [], "tokens": 0, "error": None}
    last: float | None = None
    seen = 0
    try:
        async with http.post(f"{url}/v1/completions", json=body) as response:
            if response.status != 200:
                out["error"] = f"HTTP {response.status}: {(await response.text())[:300]}"
                return out
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                payload = json.loads(line[5:])
                if "error" in payload:
                    out["error"] = str(payload["error"])[:300]
                    return out
                usage = payload.get("usage") or {}
                count = int(usage.get("completion_tokens") or 0)
                if count > seen:
                    now = time.monotonic()
                    if last is None:
                        out["ttft"] = now - sent
                    else:
                        out["gaps"].append(now - last)
                        out["chunk_tokens"].append(count - seen)
                    last, seen = now, count
    except (TimeoutError, aiohttp.ClientError) as error:
        out["error"] = f"{type(error).__name__}: {error}"
    out["tokens"] = seen
    out["end"] = last
    out["sent"] = sent
    return out


async def sample_gauges(
    http: aiohttp.ClientSession, urls: list[str], into: list[tuple[float, float, float]]
) -> None:
    """(time, waiting, running) every SAMPLE_SECONDS until cancelled."""
    while True:
        started = time.monotonic()
        try:
            now = await totals(http, urls)
            into.append((started, now["waiting"], now["running"]))
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(max(0.0, SAMPLE_SECONDS - (time.monotonic() - started)))


def time_average(samples: list[tuple[float, float, float]], index: int) -> float | None:
    """The step function through the samples, averaged over their span (None: < 2)."""
    if len(samples) < 2:
        return None
    area = sum(a[index] * (b[0] - a[0]) for a, b in itertools.pairwise(samples))
    return area / (samples[-1][0] - samples[0][0])


async def run(
    http: aiohttp.ClientSession, urls: list[str], sessions: list[Any], load: int
) -> dict[str, Any]:
    """One closed-loop replay of `sessions` (each a sequence of turns with .prompt,
    .max_tokens, .think_seconds) at `load` clients (see the module's docstring)."""
    for url in urls:
        async with http.post(f"{url}/reset_prefix_cache") as response:
            assert response.status == 200, f"reset_prefix_cache: HTTP {response.status}"
    before = await totals(http, urls)
    load_average = os.getloadavg()[0]
    samples: list[tuple[float, float, float]] = []
    sampler = asyncio.create_task(sample_gauges(http, urls, samples))
    queue = list(range(len(sessions)))
    requests: list[dict[str, Any]] = []
    started = time.monotonic()

    async def client() -> None:
        while queue:
            number = queue.pop(0)
            url = urls[number % len(urls)]
            turns = sessions[number]
            for index, turn in enumerate(turns):
                outcome = await one_request(http, url, list(turn.prompt), turn.max_tokens)
                outcome.update(
                    session=number,
                    turn=index,
                    replica=number % len(urls),
                    prompt_tokens=len(turn.prompt),
                    max_tokens=turn.max_tokens,
                )
                requests.append(outcome)
                if index + 1 < len(turns) and turn.think_seconds > 0:
                    await asyncio.sleep(turn.think_seconds)

    await asyncio.gather(*(client() for _ in range(load)))
    ends = [r["end"] for r in requests if r.get("end") is not None]
    wall = (max(ends) if ends else time.monotonic()) - started
    deadline = time.monotonic() + 30
    while True:  # the server records a request just after its last token went out
        after = await totals(http, urls)
        if after["finished"] - before["finished"] >= len(requests):
            break
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    sampler.cancel()
    samples = [s for s in samples if s[0] <= started + wall]
    gaps = [g for r in requests for g in r["gaps"]]
    return {
        "load": load,
        "replicas": len(urls),
        "requests": len(requests),
        "errors": sum(1 for r in requests if r["error"]),
        "first_error": next((r["error"] for r in requests if r["error"]), None),
        "requested_tokens": sum(r["max_tokens"] for r in requests),
        "streamed_tokens": sum(r["tokens"] for r in requests),
        "wall_seconds": wall,
        "load_average": max(load_average, os.getloadavg()[0]),
        "server": {key: after[key] - before[key] for key in COUNTERS},
        "waiting_mean": time_average(samples, 1),
        "running_mean": time_average(samples, 2),
        "gauge_samples": len(samples),
        "itl_gaps": len(gaps),
        "itl_quantiles": quantiles(gaps),
        "tokens_per_chunk_mean": (
            sum(t for r in requests for t in r["chunk_tokens"]) / len(gaps) if gaps else None
        ),
        # Per request, in the order they finished: one list per field (TTFT in seconds,
        # start and end in seconds from the run's start).
        "per_request": {
            "session": [r["session"] for r in requests],
            "turn": [r["turn"] for r in requests],
            "replica": [r["replica"] for r in requests],
            "prompt_tokens": [r["prompt_tokens"] for r in requests],
            "max_tokens": [r["max_tokens"] for r in requests],
            "tokens": [r["tokens"] for r in requests],
            "ttft": [None if r["ttft"] is None else round(r["ttft"], 5) for r in requests],
            "start": [round(r["sent"] - started, 4) for r in requests],
            "end": [
                None if r.get("end") is None else round(r["end"] - started, 4) for r in requests
            ],
        },
    }


def quantiles(values: list[float]) -> dict[str, float] | None:
    """p50, p95 (numpy's linear interpolation, as the twin's TraceRun) and the mean of
    `values` (None when empty)."""
    if not values:
        return None
    p50, p95 = np.percentile(values, [50, 95])
    return {"p50": float(p50), "p95": float(p95), "mean": float(np.mean(values))}


async def job(trace_sessions: list[Any], runs: list[dict[str, Any]]) -> None:
    connector = aiohttp.TCPConnector(limit=max(r["load"] for r in runs) + 16)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=900)
    ) as http:
        for spec in runs:
            measured = await run(http, spec["urls"], trace_sessions, spec["load"])
            print(json.dumps({**spec, **measured}), flush=True)


def main() -> None:
    from kneepoint.whatif.trace import AgentTrace

    spec = json.loads(sys.stdin.read())
    traces: dict[str, Any] = {}
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for one in spec["runs"]:
        by_trace.setdefault(one["trace"], []).append(one)
    # Runs keep their order; each names its trace (a path), read once.
    for path in by_trace:
        with open(path) as handle:
            traces[path] = AgentTrace.from_json(handle.read())

    async def all_runs() -> None:
        for one in spec["runs"]:
            sessions = list(traces[one["trace"]].sessions)[: one["sessions"]]
            assert len(sessions) == one["sessions"], "the trace has fewer sessions"
            await job(sessions, [one])

    asyncio.run(all_runs())


if __name__ == "__main__":
    main()
