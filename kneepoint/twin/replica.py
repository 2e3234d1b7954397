"""A twin replica in real time: a thread steps the engine and sleeps each step's duration,
so requests sent over HTTP see the latencies the physics gives."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kneepoint.twin import sglang
from kneepoint.twin.exposition import Snapshot, render
from kneepoint.twin.simulated_engine import Engine, EngineConfig


@dataclass(frozen=True)
class Tokens:
    """Tokens a request got in one engine step (and whether it is finished)."""

    count: int
    done: bool
    reason: str


class Replica:
    def __init__(
        self,
        name: str,
        served_name: str,
        config: EngineConfig,
        vllm_version: str = "0.32",
        speed: float = 1.0,
        seed: int = 0,
        sglang_version: str | None = None,
    ) -> None:
        """A vLLM replica of `vllm_version`, or with `sglang_version` an SGLang one."""
        self.name = name
        self.served_name = served_name
        self.vllm_version = vllm_version
        self.speed = speed  # engine seconds per wall second (1: real time)
        self.engine = Engine(config, seed=seed)
        # SGLang's metric state (its scheduler's logs, its tokenizer's request counts).
        self.sglang = sglang.SglangMetrics(self.engine, sglang_version) if sglang_version else None
        self.started_at = time.time()
        self._origin = time.monotonic()
        self._lock = threading.Condition()
        self._stopping = False
        self._stalled = False  # stall(): the engine makes no step, the server still answers
        self._failing: tuple[float, str] = (0.0, "error")  # fail(): share and finish reason
        self._fail_due = 0.0
        self._thread = threading.Thread(target=self._run, name=f"twin-{name}", daemon=True)
        self._pending: list[tuple[queue.Queue[Tokens], Tokens]] = []  # this step's tokens

    def start(self) -> Replica:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._thread.join(timeout=5)

    def stall(self) -> None:
        """Wedge the engine as a SIGSTOPped vLLM engine core: requests are still accepted and
        /metrics still answers with them running and waiting, but no step runs, so no token
        counter moves (the `engine-stalled` rule's failure). resume() undoes it."""
        with self._lock:
            self._stalled = True

    def resume(self) -> None:
        with self._lock:
            self._stalled = False
            self._lock.notify_all()

    def sleep(self, level: int = 1) -> None:
        """vLLM's POST /sleep?level= : requests in flight are aborted (their clients get
        what they had), the engine steps no more and its counters stay frozen, while
        /metrics still answers with `vllm:engine_sleep_state` saying so. wake_up() undoes
        it."""
        with self._lock:
            self.engine.sleep(level)
            delivered, self._pending = self._pending, []
        for events, tokens in delivered:
            events.put(tokens)

    def wake_up(self) -> None:
        with self._lock:
            self.engine.wake_up()
            self._lock.notify_all()

    @property
    def sleeping(self) -> bool:
        return bool(self.engine.sleep_level)

    def fail(self, share: float, reason: str = "error") -> None:
        """End `share` of the requests submitted from now on (evenly: every 1/share-th) after
        their first token with finish reason `reason` ("error" or "abort"), as vLLM counts
        them in request_success_total{finished_reason}. fail(0) ends it."""
        with self._lock:
            self._failing, self._fail_due = (share, reason), 0.0

    @property
    def engine_name(self) -> str:
        """The engine this replica plays: "vllm" or "sglang"."""
        return "sglang" if self.sglang else "vllm"

    @property
    def version(self) -> str:
        return self.sglang.version if self.sglang else self.vllm_version

    def submit(
        self,
        tokens: Sequence[int],
        max_tokens: int,
        stop_after: int | None = None,
        stream: bool = False,
    ) -> queue.Queue[Tokens]:
        """Queue a request; its tokens arrive on the returned queue as the engine makes them.

        `stop_after` ends it early with finish reason "stop" (the model's end of sequence);
        `stream` says whether its client streams (SGLang's metrics tell them apart). Raises
        `Rejected` when the engine's queue limits refuse it (vLLM answers 503)."""
        events: queue.Queue[Tokens] = queue.Queue()
        limit = min(max_tokens, stop_after) if stop_after else max_tokens
        reason = "stop" if stop_after and stop_after < max_tokens else "length"

        def sink(count: int, done: bool, _at: float) -> None:
            self._pending.append((events, Tokens(count, done, reason)))

        with self._lock:
            self._fail_due += self._failing[0]
            if self._fail_due >= 1.0 - 1e-9:
                self._fail_due -= 1.0
                limit, reason = 1, self._failing[1]
            self._sync_clock()
            request = self.engine.add(
                tokens, limit, sink, finish_reason=reason, max_tokens_param=max_tokens
            )
            if self.sglang is not None:
                request.sink = self.sglang.track(request, sink, stream)
            self._lock.notify_all()
        return events

    def metrics(self) -> bytes:
        with self._lock:
            if self.sglang is not None:
                return sglang.render(self.sglang, self.served_name)
            snapshot = Snapshot(
                self.engine,
                self.served_name,
                self.started_at,
                self.engine.config.gpu_memory_utilization,
            )
            return render(snapshot, self.vllm_version)

    def _sync_clock(self) -> None:
        # While idle the engine's clock stands still; arrivals happen at wall-clock time.
        wall = (time.monotonic() - self._origin) * self.speed
        self.engine.now = max(self.engine.now, wall)

    def _run(self) -> None:
        while True:
            with self._lock:
                while (
                    self.engine.idle or self._stalled or self.engine.sleep_level
                ) and not self._stopping:
                    self._lock.wait()
                if self._stopping:
                    return
                self._sync_clock()
                duration = self.engine.step()
                delivered, self._pending = self._pending, []
            # The step's tokens exist when the step ends.
            time.sleep(duration / self.speed)
            for events, tokens in delivered:
                events.put(tokens)
