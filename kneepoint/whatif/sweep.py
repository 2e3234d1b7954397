"""A closed-loop sweep of the twin, recorded term by term, and predicted for a profile.

In a closed loop whose clients send their next request the moment the last one ends, which
requests share a step does not depend on how long the steps take: only their order matters.
So one run of the twin per concurrency gives, for every step, how many times each term of
the step-cost model (kneepoint.twin.simulated_engine.StepCost) is paid in it, and every latency the
sweep measures (the step's wall time, each request's TTFT, each inter-token gap) is a sum of
whole steps: a linear function of the cost's coefficients. That is what calibration fits
(calibrate.py) and what predicting a sweep evaluates.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kneepoint.twin.simulated_engine import (
    STEP_OVERHEAD_SECONDS,
    Engine,
    EngineConfig,
    Request,
    StepCost,
)

# The step-cost model's terms, in the order of a feature row (StepCost's fields).
TERMS = (
    "overhead_seconds",  # paid once per step with work (with weight_read: "per step")
    "token_seconds",
    "prefill_token_seconds",
    "context_token_seconds",
    "sequence_seconds",
    "draft_token_seconds",
    "request_overhead_seconds",  # once per request, in its TTFT only
)
VOCABULARY = 150_000


def coefficients(cost: StepCost) -> np.ndarray:
    """The cost as a vector over TERMS (weights read once per step count as overhead)."""
    return np.array(
        [
            cost.overhead_seconds + cost.weight_read_seconds,
            cost.token_seconds,
            cost.prefill_token_seconds,
            cost.context_token_seconds,
            cost.sequence_seconds,
            cost.draft_token_seconds,
            cost.request_overhead_seconds,
        ]
    )


class _Recorder(Engine):
    """An engine that notes each step's terms (and each stall's fixed time)."""

    def __init__(self, config: EngineConfig, seed: int = 0) -> None:
        super().__init__(config, seed=seed)
        self.rows: list[tuple[float, ...]] = []
        self.stalls: list[float] = []

    def _duration(self, work: list[tuple[Request, int]]) -> float:
        tokens = sum(count for _, count in work)
        context = sum(request.computed + count for request, count in work)
        prefill = sum(count for r, count in work if r.computed < r.prefill_target)
        decoding = any(r.computed >= r.prefill_target for r, _ in work)
        drafts = self.config.num_speculative_tokens if decoding else 0
        self.rows.append((1.0, tokens, prefill, context, len(work), drafts, 0.0))
        self.stalls.append(0.0)
        return super()._duration(work)

    def _stall(self) -> float:
        self.rows.append((0.0,) * len(TERMS))
        self.stalls.append(STEP_OVERHEAD_SECONDS)
        return super()._stall()


@dataclass(frozen=True)
class StepTerms:
    """One concurrency step of a simulated sweep: each measured quantity as terms × cost
    plus a fixed part (stalls), and what the schedule itself decided."""

    concurrency: int
    requests: int
    output_tokens: int  # generated over the step
    wall: np.ndarray  # terms of the step's wall time
    wall_fixed: float
    ttft_mean: np.ndarray
    ttft_fixed: float
    itl_mean: np.ndarray | None  # None: no request made two tokens
    itl_fixed: float
    preemptions: int
    preempted_prompt_tokens: int  # recomputed prefill (prompt and output of the preempted)
    preempted_output_tokens: int

    def throughput(self, theta: np.ndarray) -> float:
        wall = float(self.wall @ theta) + self.wall_fixed
        return self.output_tokens / wall if wall > 0 else 0.0

    def ttft(self, theta: np.ndarray) -> float:
        return float(self.ttft_mean @ theta) + self.ttft_fixed

    def itl(self, theta: np.ndarray) -> float | None:
        if self.itl_mean is None:
            return None
        return float(self.itl_mean @ theta) + self.itl_fixed


def simulate_step(
    config: EngineConfig,
    concurrency: int,
    requests: int,
    input_tokens: int,
    output_tokens: int,
    seed: int = 0,
) -> StepTerms:
    """`requests` requests of `input_tokens` random tokens and `output_tokens` generated,
    sent by `concurrency` closed-loop clients (as kneepoint/twin/ladder.py and a real
    `kneepoint sweep` do), recorded term by term."""
    engine = _Recorder(config, seed=seed)
    rng = random.Random(seed * 7919 + concurrency)
    sends: list[int] = []  # step index at send, per request
    firsts: list[int] = []
    gaps: list[tuple[int, int]] = []
    pending = 0
    sent = 0

    def send() -> None:
        nonlocal sent
        sent += 1
        start = len(engine.rows)
        sends.append(start)
        state = {"last": -1}

        def sink(_count: int, done: bool, _at: float) -> None:
            nonlocal pending
            now = len(engine.rows)
            if state["last"] < 0:
                firsts.append(now - start)
                ttft_pairs.append((start, now))
            else:
                gaps.append((state["last"], now))
            state["last"] = now
            if done and sent + pending < requests:
                pending += 1

        prompt = [rng.randrange(VOCABULARY) for _ in range(input_tokens)]
        engine.add(prompt, output_tokens, sink)

    ttft_pairs: list[tuple[int, int]] = []
    for _ in range(min(concurrency, requests)):
        send()
    while not engine.idle or pending:
        while pending:
            pending -= 1
            send()
        if not engine.idle:
            engine.step()
    rows = np.vstack([np.zeros(len(TERMS)), np.asarray(engine.rows, dtype=float)])
    cumulative = np.cumsum(rows, axis=0)
    fixed = np.cumsum(np.asarray([0.0, *engine.stalls]))

    def mean_of(pairs: Sequence[tuple[int, int]]) -> tuple[np.ndarray, float]:
        starts = np.asarray([a for a, _ in pairs])
        ends = np.asarray([b for _, b in pairs])
        terms = (cumulative[ends] - cumulative[starts]).mean(axis=0)
        return terms, float((fixed[ends] - fixed[starts]).mean())

    ttft, ttft_fixed = mean_of(ttft_pairs)
    ttft = ttft.copy()
    ttft[TERMS.index("request_overhead_seconds")] = 1.0
    itl, itl_fixed = mean_of(gaps) if gaps else (None, 0.0)
    stats = engine.stats
    return StepTerms(
        concurrency=concurrency,
        requests=requests,
        output_tokens=stats.generation_tokens,
        wall=cumulative[-1],
        wall_fixed=float(fixed[-1]),
        ttft_mean=ttft,
        ttft_fixed=ttft_fixed,
        itl_mean=itl,
        itl_fixed=itl_fixed,
        preemptions=stats.preemptions,
        preempted_prompt_tokens=stats.preempted_prompt_tokens,
        preempted_output_tokens=stats.preempted_output_tokens,
    )


def requests_for(concurrency: int) -> int:
    """A sweep step's request count when not given: `kneepoint sweep`'s default."""
    return max(8, 4 * concurrency)


@dataclass(frozen=True)
class SweepPrediction:
    """A predicted concurrency step of a closed-loop sweep, with bounds from the
    calibration's RMS relative error of the same metric (± one RMS)."""

    concurrency: int
    requests: int
    output_tokens_per_second: float
    output_tokens_per_second_bounds: tuple[float, float]
    ttft_mean_seconds: float
    ttft_mean_seconds_bounds: tuple[float, float]
    itl_mean_seconds: float | None
    preemptions: int
    recomputed_prefill_tokens: int  # prompt and output tokens of preempted requests

    def as_dict(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "output_tokens_per_second": self.output_tokens_per_second,
            "output_tokens_per_second_bounds": list(self.output_tokens_per_second_bounds),
            "ttft_mean_seconds": self.ttft_mean_seconds,
            "ttft_mean_seconds_bounds": list(self.ttft_mean_seconds_bounds),
            "itl_mean_seconds": self.itl_mean_seconds,
            "preemptions": self.preemptions,
            "recomputed_prefill_tokens": self.recomputed_prefill_tokens,
        }


def bounds(value: float, relative: float | None) -> tuple[float, float]:
    spread = abs(value) * (relative or 0.0)
    return (max(0.0, value - spread), value + spread)
