"""A concurrency sweep against any OpenAI-compatible server (vLLM, SGLang, llama.cpp, the
fleet twin).

Each step runs `concurrency` closed-loop clients: each sends a streaming completion of fixed
input and output length, waits for it to finish, and sends the next, until the step's request
count (or duration) is used up. Output throughput is output tokens over the step's wall time
from the first request sent to the last token received (as `vllm bench serve` reports it);
TTFT and inter-token gaps are measured per request from the stream. Errors are counted.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from collectors.engines import parse_replica
from kneepoint.knee.runs import Point, Run
from kneepoint.samples import ReplicaSample

DEFAULT_LADDER = (1, 2, 4, 8, 16, 32, 64, 128)
# Prompts are text, as agents send them and as other load generators do (the server's
# tokenization is part of TTFT: a few milliseconds under load on a CPU server). The words are
# common ones that are one token each in the usual tokenizers, so a prompt of N words is about
# N tokens (the server's own count is reported), and random order means no prefix-cache hits.
PROMPT_WORDS = tuple(
    "the of and a to is agent tool call result file search read write plan step system "
    "prompt cache token".split()
)
# A load generator above this share of one core adds its own queueing to the latencies.
CLIENT_SATURATED_CORES = 0.9
MIN_WALL_FOR_CPU = 0.5  # seconds: a shorter step (every request refused at once) says nothing
_USAGE = re.compile(rb'"usage":\s*\{')
_NO_CHOICES = re.compile(rb'"choices":\s*\[\]')


def random_prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(PROMPT_WORDS) for _ in range(words))


@dataclass(frozen=True)
class SweepSettings:
    url: str  # the server's base URL (`http://host:8000` or `…/v1`)
    model: str
    ladder: tuple[int, ...] = DEFAULT_LADDER
    input_tokens: int = 256
    output_tokens: int = 128
    requests_per_step: int | None = None  # default: 4 × concurrency, at least 8
    duration: float | None = None  # seconds per step instead of a request count
    ignore_eos: bool = True
    metrics_url: str | None = None  # capture the server's /metrics around each step
    timeout: float = 600.0
    # Fresh prompts per sweep by default: a repeated sweep must not hit the prefix cache
    # its predecessor filled (that would measure the cache, not the server).
    seed: int | None = None

    @property
    def completions_url(self) -> str:
        base = self.url.rstrip("/")
        return f"{base if base.endswith('/v1') else base + '/v1'}/completions"

    def requests_for(self, concurrency: int) -> int | None:
        if self.duration is not None and self.requests_per_step is None:
            return None
        return self.requests_per_step or max(8, 4 * concurrency)


@dataclass
class Outcome:
    """One request as the client saw it."""

    start: float
    end: float = 0.0
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0  # as the server counted them (0: it did not say)
    error: str | None = None


async def one_request(http: aiohttp.ClientSession, settings: SweepSettings, prompt: str) -> Outcome:
    body = {
        "model": settings.model,
        "prompt": prompt,
        "max_tokens": settings.output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if settings.ignore_eos:
        body["ignore_eos"] = True
    # llama.cpp's server closes the connection after each streamed response although it
    # answers "Keep-Alive": a request on such a pooled connection finds it dead before the
    # server has read a byte. It is sent again (on the next pooled connection, at worst a new
    # one), as curl does; the request's clock starts again with it.
    pooled = http.connector.limit if http.connector is not None else 0
    for _ in range(pooled + 1):
        outcome, stale = await _stream(http, settings.completions_url, body)
        if not stale:
            break
    return outcome


async def _stream(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[Outcome, bool]:
    """One streamed request, and whether it failed on a dead connection before any answer."""
    outcome = Outcome(start=time.perf_counter())
    last = outcome.start
    chunks = 0
    answered = stale = False
    try:
        async with http.post(url, json=body) as response:
            answered = True
            if response.status != 200:
                text = (await response.read()).decode(errors="replace")[:200]
                outcome.error = f"HTTP {response.status}: {text}"
            else:
                buffer = b""
                async for data in response.content.iter_any():
                    now = time.perf_counter()
                    buffer += data
                    *events, buffer = buffer.split(b"\n\n")
                    for event in events:
                        # Most events are one token's text: timestamp them without parsing
                        # JSON, so the client stays far from saturating a core.
                        if not event.startswith(b"data:") or event.endswith(b"[DONE]"):
                            continue
                        if b'"error"' in event or _USAGE.search(event):
                            payload = json.loads(event[5:])
                            if "error" in payload:  # refused after the stream began
                                error = payload["error"]
                                outcome.error = str(error.get("message", error))
                                break
                            usage = payload["usage"]
                            outcome.output_tokens = int(usage["completion_tokens"])
                            outcome.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                            # llama.cpp's closing chunk carries its usage (always, asked for
                            # or not) beside a choice with empty text and the finish reason:
                            # no token, whatever its choices.
                            if not _carries_text(payload):
                                continue
                        if _NO_CHOICES.search(event):  # the usage chunk carries no token
                            continue
                        if outcome.ttft is None:
                            outcome.ttft = now - outcome.start
                        else:
                            outcome.gaps.append(now - last)
                        last = now
                        chunks += 1
                if outcome.ttft is None and outcome.error is None:
                    outcome.error = "the stream ended without a token"
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, KeyError, ValueError) as error:
        outcome.error = f"{type(error).__name__}: {error}"[:200]
        # A connection that could not be opened is no stale one: the server is not there.
        stale = (
            not answered
            and isinstance(error, (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError))
            and not isinstance(error, aiohttp.ClientConnectorError)
        )
    outcome.end = time.perf_counter()
    if outcome.error is None and outcome.output_tokens == 0:
        outcome.output_tokens = chunks  # servers without usage in streams: a token per chunk
    return outcome, stale


def _carries_text(payload: dict[str, Any]) -> bool:
    """Whether a parsed stream chunk holds generated text (a completion's `text`, a chat
    delta's `content`)."""
    for choice in payload.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or delta.get("reasoning_content"):
            return True
    return False


def _quantile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def summarize(
    concurrency: int, outcomes: list[Outcome], cpu_seconds: float, server: dict[str, float | None]
) -> Point:
    """A step's point from its requests (latencies of failed requests are not latencies)."""
    ok = [o for o in outcomes if o.error is None]
    wall = max((o.end for o in outcomes), default=0.0) - min(
        (o.start for o in outcomes), default=0.0
    )
    ttfts = [o.ttft for o in ok if o.ttft is not None]
    gaps = [g for o in ok for g in o.gaps]
    e2e = [o.end - o.start for o in ok]
    tokens = sum(o.output_tokens for o in ok)
    accepted, drafted = server.get("spec_accepted_tokens"), server.get("spec_draft_tokens")
    return Point(
        concurrency=concurrency,
        output_tokens_per_second=tokens / wall if wall > 0 else 0.0,
        requests_per_second=len(ok) / wall if wall > 0 else None,
        ttft_mean_seconds=_mean(ttfts),
        ttft_p50_seconds=_quantile(ttfts, 50),
        ttft_p90_seconds=_quantile(ttfts, 90),
        ttft_p99_seconds=_quantile(ttfts, 99),
        itl_mean_seconds=_mean(gaps),
        itl_p50_seconds=_quantile(gaps, 50),
        itl_p90_seconds=_quantile(gaps, 90),
        itl_p99_seconds=_quantile(gaps, 99),
        e2e_mean_seconds=_mean(e2e),
        e2e_p99_seconds=_quantile(e2e, 99),
        input_tokens_mean=_mean([o.prompt_tokens for o in ok if o.prompt_tokens]),
        completed=len(ok),
        errors=len(outcomes) - len(ok),
        first_error=next((o.error for o in outcomes if o.error), None),
        duration_seconds=wall,
        spec_acceptance_rate=accepted / drafted if accepted is not None and drafted else None,
        server=server,
        client_cpu_cores=cpu_seconds / wall if wall >= MIN_WALL_FOR_CPU else None,
    )


class ServerWatch:
    """The server's /metrics before, during (peaks) and after a step."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url
        self.before: ReplicaSample | None = None
        self.peaks: dict[str, float] = {}
        self.ready = asyncio.Event()

    async def sample(self) -> ReplicaSample | None:
        try:
            async with self.http.get(self.url, timeout=aiohttp.ClientTimeout(total=5)) as response:
                response.raise_for_status()
                # Any engine's /metrics (vLLM, SGLang, llama.cpp, ...), told by its names.
                sample = parse_replica("auto", await response.text())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None  # a missed capture loses that capture, never the step
        for gauge in ("kv_cache_usage", "requests_running", "requests_waiting"):
            value = sample.gauges.get(gauge)
            if value is not None:
                self.peaks[gauge] = max(self.peaks.get(gauge, 0.0), value)
        return sample

    async def watch(self, stop: asyncio.Event, every: float = 1.0) -> None:
        self.before = await self.sample()
        self.ready.set()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), every)
            except TimeoutError:
                await self.sample()

    async def finish(self) -> dict[str, float | None]:
        after = await self.sample()
        out: dict[str, float | None] = {
            "kv_cache_occupancy_peak": self.peaks.get("kv_cache_usage"),
            "requests_running_peak": self.peaks.get("requests_running"),
            "requests_waiting_peak": self.peaks.get("requests_waiting"),
        }
        pairs = {
            "preemptions": "preemptions",
            "prefix_cache_hits": "prefix_cache_hits",
            "prefix_cache_queries": "prefix_cache_queries",
            "spec_accepted_tokens": "spec_decode_accepted_tokens",
            "spec_draft_tokens": "spec_decode_draft_tokens",
        }
        for name, counter in pairs.items():
            first = self.before.counters.get(counter) if self.before else None
            last = after.counters.get(counter) if after else None
            out[name] = None if first is None or last is None else max(0.0, last - first)
        return out


async def run_step(
    http: aiohttp.ClientSession,
    settings: SweepSettings,
    concurrency: int,
    on_request: Callable[[Outcome], None] = lambda _o: None,
) -> Point:
    rng = random.Random(None if settings.seed is None else settings.seed * 1_000_003 + concurrency)
    budget = settings.requests_for(concurrency)
    deadline = None if settings.duration is None else time.perf_counter() + settings.duration
    issued = 0
    outcomes: list[Outcome] = []

    async def client() -> None:
        nonlocal issued
        while (budget is None or issued < budget) and (
            deadline is None or time.perf_counter() < deadline
        ):
            issued += 1
            prompt = random_prompt(rng, settings.input_tokens)
            outcome = await one_request(http, settings, prompt)
            outcomes.append(outcome)
            on_request(outcome)

    watch = ServerWatch(http, settings.metrics_url) if settings.metrics_url else None
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch.watch(stop)) if watch else None
    if watch:
        await watch.ready.wait()  # the "before" capture goes out before the first request
    # The event loop's thread: the client's own CPU, not that of a server running beside it.
    cpu = time.thread_time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    cpu = time.thread_time() - cpu
    server: dict[str, float | None] = {}
    if watch and watcher:
        stop.set()
        await watcher
        server = await watch.finish()
    return summarize(concurrency, outcomes, cpu, server)


async def sweep_async(
    settings: SweepSettings,
    label: str,
    on_step: Callable[[int, int | None], None] = lambda _c, _n: None,
    on_request: Callable[[Outcome], None] = lambda _o: None,
    on_point: Callable[[Point], None] = lambda _p: None,
) -> Run:
    connector = aiohttp.TCPConnector(limit=max(settings.ladder) + 8)
    timeout = aiohttp.ClientTimeout(total=settings.timeout)
    points = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        for concurrency in settings.ladder:
            on_step(concurrency, settings.requests_for(concurrency))
            point = await run_step(http, settings, concurrency, on_request)
            points.append(point)
            on_point(point)
    notes = {
        "url": settings.url,
        "input_tokens": settings.input_tokens,
        "output_tokens": settings.output_tokens,
        "ignore_eos": settings.ignore_eos,
    }
    return Run(label, settings.model, "sweep", tuple(points), time.time(), notes)


def sweep(settings: SweepSettings, label: str, **callbacks: Callable[..., None]) -> Run:
    # Whatever the process already holds is frozen out of the garbage collector's scans, so a
    # full collection in a big process (a test session, the app) cannot pause the client.
    gc.collect()
    gc.freeze()
    try:
        return asyncio.run(sweep_async(settings, label, **callbacks))
    finally:
        gc.unfreeze()
