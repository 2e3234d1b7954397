"""Live agent traffic over HTTP against twin (or real) OpenAI-compatible replicas.

Sessions start so that the number running follows a daily shape (compressed for the demo);
each session re-sends its transcript step by step. Routing is session-sticky (every step of a
session goes to the replica holding its cache) or round-robin (each step to the next replica),
which is what decides the prefix-cache hit rate. deploy() changes the system prompt: every
session started afterwards misses every cache once. A replica that says it sleeps (vLLM's
GET /is_sleeping, asked every few seconds) gets no traffic: its sessions go to the next
awake replica of their group until it wakes.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import httpx

from kneepoint.twin.agents import daily_load, session

Routing = Literal["sticky", "round-robin"]
SLEEP_CHECK_SECONDS = 3.0


@dataclass
class Group:
    """Replicas serving one model, and how many agent sessions they see at the daily peak."""

    model: str
    urls: list[str]
    peak_sessions: float
    routing: Routing = "sticky"


@dataclass
class TrafficStats:
    requests: int = 0
    errors: int = 0
    by_url: dict[str, int] = field(default_factory=dict)


class Traffic:
    def __init__(
        self,
        groups: list[Group],
        day_seconds: float = 1800.0,
        pause_scale: float = 1.0,
        seed: int = 0,
        shape: Callable[[float], float] | None = None,
        deploy_every: float | None = None,
    ) -> None:
        self.groups = groups
        self.deploy_every = deploy_every  # seconds between prompt deploys (None: never)
        # Share of each group's peak sessions that runs at a given time.
        self.shape = shape or (lambda t: daily_load(t, day_seconds))
        self.pause_scale = pause_scale
        self.version = 1
        self.stats = TrafficStats()
        self._rng = random.Random(seed)
        self._numbers = itertools.count(1)
        self._round_robin = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sleeping: set[str] = set()  # replica URLs that said they sleep
        self.draining: set[str] = set()  # replica URLs taken out of the routing by hand

    def deploy(self) -> None:
        """A new system prompt and tool schema: every prefix cache is cold for it."""
        self.version += 1

    def start(self) -> Traffic:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._main()), name="twin-traffic", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:
            active: dict[str, set[asyncio.Task[None]]] = {g.model: set() for g in self.groups}
            last_deploy = time.monotonic()
            last_check = 0.0
            while not self._stop.is_set():
                if time.monotonic() - last_check >= SLEEP_CHECK_SECONDS:
                    await self._check_sleep(client)
                    last_check = time.monotonic()
                if self.deploy_every and time.monotonic() - last_deploy >= self.deploy_every:
                    self.deploy()
                    last_deploy = time.monotonic()
                share = self.shape(time.time())
                for group in self.groups:
                    tasks = active[group.model]
                    tasks -= {task for task in tasks if task.done()}
                    while len(tasks) < round(group.peak_sessions * share):
                        tasks.add(asyncio.create_task(self._session(client, group)))
                await asyncio.sleep(0.5)
            for tasks in active.values():
                for task in tasks:
                    task.cancel()

    async def _check_sleep(self, client: httpx.AsyncClient) -> None:
        async def asleep(url: str) -> bool:
            try:
                response = await client.get(f"{url}/is_sleeping", timeout=2)
                return response.status_code == 200 and bool(response.json().get("is_sleeping"))
            except (httpx.HTTPError, ValueError, AttributeError):
                return False  # no such endpoint (or no answer): routed as before

        urls = [url for group in self.groups for url in group.urls]
        answers = await asyncio.gather(*(asleep(url) for url in urls))
        self.sleeping = {url for url, sleeps in zip(urls, answers, strict=True) if sleeps}

    def route(self, group: Group, home: int) -> str | None:
        """The replica for a session's next step: its home (sticky) or the next in turn,
        passing over sleeping ones; None when every replica of the group sleeps."""
        count = len(group.urls)
        start = home if group.routing == "sticky" else next(self._round_robin)
        for offset in range(count):
            url = group.urls[(start + offset) % count]
            if url not in self.sleeping and url not in self.draining:
                return url
        return None

    async def _session(self, client: httpx.AsyncClient, group: Group) -> None:
        number = next(self._numbers)
        rng = random.Random(self._rng.random())
        home = number % len(group.urls)
        for step in session(rng, self.version, number):
            if self._stop.is_set():
                return
            url = self.route(group, home)
            if url is not None:
                await self._call(client, url, group.model, step.messages, step.max_tokens)
            await asyncio.sleep(step.pause_after * self.pause_scale)

    async def _call(
        self,
        client: httpx.AsyncClient,
        url: str,
        model: str,
        messages: list[dict[str, str]],
        max_tokens: int,
    ) -> None:
        self.stats.requests += 1
        self.stats.by_url[url] = self.stats.by_url.get(url, 0) + 1
        try:
            response = await client.post(
                f"{url}/v1/chat/completions",
                json={"model": model, "messages": messages, "max_tokens": max_tokens},
            )
            response.raise_for_status()
        except httpx.HTTPError:
            self.stats.errors += 1
