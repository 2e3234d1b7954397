"""Fit the twin's step-time model (kneepoint.twin.simulated_engine.StepCost) to a replica.

From a knee run (sweep or import): each concurrency step's throughput, mean TTFT and mean
inter-token latency are, for the twin, linear in the cost's coefficients given the schedule
(sweep.py), so the coefficients are the non-negative least-squares solution
(scipy.optimize.nnls) of those equations, each row divided by its measured value so that
the residuals are relative errors and a slow step does not outweigh a fast one.

From production history (history.py `Level`s): at a load level with b requests running,
a generation rate G and a computed-prompt rate P, a decode step carries b tokens and
P·b/G prompt tokens and reads the KV the running requests hold (occupancy × capacity), and
the mean inter-token latency is that step's duration: one more linear row per level.

From runs of an agent trace (trace.py, `calibrate_trace`): the same equations per measured
load, on the schedule the twin takes under the trace (exact without think time; with think
time the schedule depends on the cost, so the fit is iterated to a fixed point).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from kneepoint.knee.runs import Point, Run
from kneepoint.twin.profiles import GPUS, MODELS
from kneepoint.twin.simulated_engine import EngineConfig, StepCost
from kneepoint.whatif.profile import (
    MIN_POINTS,
    TRUST_RMS,
    EngineShape,
    FitPoint,
    FitQuality,
    Profile,
    WhatIfError,
)
from kneepoint.whatif.sweep import TERMS, StepTerms, coefficients, requests_for, simulate_step
from kneepoint.whatif.trace import AgentTrace, simulate_trace

# The terms fitted. sequence_seconds is left out: a decode step's sequences are its decode
# tokens, so the two cannot be told apart from sweeps (token_seconds absorbs it).
FITTED = (
    "overhead_seconds",
    "token_seconds",
    "context_token_seconds",
    "request_overhead_seconds",
)
# Fitted only when the data need it: the chunked-prefill term (an extra cost per prefill
# token beyond a decode token's). With it, a decode token's cost and a context token's trade
# against each other (a decode step's context is about its tokens × their length), so the
# fit is no longer unique; it is kept only when it cuts the RMS relative error by a fifth
# from above EXTRA_TERM_RMS.
OPTIONAL = ("prefill_token_seconds",)
EXTRA_TERM_RMS = 0.02


@dataclass(frozen=True)
class Level:
    """A replica's production load level (history.py): means over the time it spent there."""

    running: float  # requests running
    generation_tokens_per_second: float
    computed_prompt_tokens_per_second: float  # prompt tokens computed (not cache hits)
    kv_cache_usage: float  # 0..1
    itl_mean_seconds: float | None  # from the inter-token-latency histogram's sum ÷ count
    seconds: float  # time spent at this level


def sweep_terms(
    shape: EngineShape,
    points: Sequence[Point],
    input_tokens: int,
    output_tokens: int,
) -> list[StepTerms]:
    """The twin's schedule of each measured step (same concurrency, request count, lengths)."""
    config = shape.engine_config(StepCost())
    out = []
    for point in points:
        length = round(point.input_tokens_mean) if point.input_tokens_mean else input_tokens
        requests = point.completed or requests_for(point.concurrency)
        out.append(
            simulate_step(config, point.concurrency, requests, max(1, length), output_tokens)
        )
    return out


def calibrate_sweep(
    points: Sequence[Point],
    shape: EngineShape,
    input_tokens: int = 256,
    output_tokens: int = 128,
    replica: str = "replica",
    run_label: str | None = None,
    levels: Sequence[Level] = (),
    now: float | None = None,
) -> Profile:
    """Fit a profile to measured sweep points (and production levels, if any).

    `points`: a knee run's steps (concurrency, output_tokens_per_second, ttft_mean_seconds,
    itl_mean_seconds, completed, input_tokens_mean as measured; missing measures are skipped).
    `shape`: the engine's configuration when they were measured. `input_tokens` and
    `output_tokens`: the sweep's request shape (input_tokens_mean of a point wins where the
    server counted it). The profile's `fit` says how closely each measured number is
    reproduced and whether it is trusted (profile.TRUST_RMS); fitting never raises for a
    poor fit, predicting from it does."""
    if not points and not levels:
        raise WhatIfError("nothing to calibrate from: no sweep points and no history levels")
    equations = Equations()
    usable = [p for p in points if p.output_tokens_per_second > 0]
    terms = sweep_terms(shape, usable, input_tokens, output_tokens)
    for point, step in zip(usable, terms, strict=True):
        equations.add_step(
            "sweep",
            float(point.concurrency),
            step,
            point.output_tokens_per_second,
            point.ttft_mean_seconds,
            point.itl_mean_seconds,
        )
    for level in levels:
        row = level_row(shape, level)
        if row is not None and level.itl_mean_seconds:
            equations.add(
                row, level.itl_mean_seconds, 0.0, ("history", level.running, "itl_mean", 0)
            )
    loads = {float(p.concurrency) for p in usable} | {lv.running for lv in levels}
    theta, quality = equations.fit(fitted_terms(shape), loads)
    return Profile(
        replica=replica,
        shape=shape,
        cost=cost_of(theta, shape),
        fit=quality,
        run_label=run_label,
        fitted_at=time.time() if now is None else now,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        notes={"ladder": sorted({p.concurrency for p in usable})},
    )


@dataclass(frozen=True)
class TraceMeasurement:
    """What a real run of an agent trace measured at one load (a client's view, as
    kneepoint.whatif.trace describes the run): the means are fitted, the rest is reported.
    None: not measured."""

    load: int  # sessions at once
    wall_seconds: float  # first send to last answer
    generated_tokens: int
    ttft_mean: float | None
    itl_mean: float | None  # over every gap between a request's outputs, pooled
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    itl_p50: float | None = None
    itl_p95: float | None = None
    waiting_mean: float | None = None  # requests waiting, time-averaged
    preemptions: int | None = None


# Calibrating from a trace with think times: the schedule depends on the step times, so the
# fit is repeated on the schedule of the last fit until what the coefficients give for every
# measured number moves less than TRACE_CONVERGENCE, or TRACE_ITERATIONS fits have been made.
TRACE_CONVERGENCE = 0.01
TRACE_ITERATIONS = 6


def calibrate_trace(
    measured: Sequence[TraceMeasurement],
    shape: EngineShape,
    trace: AgentTrace,
    replica: str = "replica",
    seed: int = 0,
    initial: StepCost | None = None,
    now: float | None = None,
) -> Profile:
    """Fit a profile to measured runs of `trace` at several loads on one engine of `shape`.

    Each load's throughput (as wall time), mean TTFT and mean inter-token latency are linear
    in the cost's coefficients given the schedule the twin takes (trace.simulate_trace),
    fitted and judged as calibrate_sweep's. With think times the schedule itself depends on
    the cost (when a request arrives against the engine's steps), so the fit is a fixed-point
    iteration: simulate with the current cost (`initial`; default the shape's profile physics
    where it has a GPU and model, else StepCost()), fit, repeat until every fitted number
    moves less than TRACE_CONVERGENCE (at most TRACE_ITERATIONS fits). The profile's notes
    say how many fits it took and whether it converged."""
    usable = [m for m in measured if m.wall_seconds > 0 and m.generated_tokens > 0]
    if not usable:
        raise WhatIfError("nothing to calibrate from: no measured run generated tokens")
    if initial is None:
        initial = (
            StepCost.of(shape.engine_config(None)) if shape.gpu and shape.model else StepCost()
        )
    theta = coefficients(initial)
    fitted = fitted_terms(shape)
    loads = {float(m.load) for m in usable}
    # Without think times the schedule does not depend on the cost (as a sweep's): one fit
    # is exact, and its quality is the twin's own on that schedule.
    thinks = any(turn.think_seconds for session in trace.sessions for turn in session)
    best: tuple[float, np.ndarray, FitQuality] | None = None
    change = float("inf")
    fits = 0
    while True:
        # The twin at theta, on its own schedule: exactly what it predicts.
        config = shape.engine_config(cost_of(theta, shape))
        equations = Equations()
        for m in usable:
            run = simulate_trace(config, trace, m.load, seed)
            throughput = m.generated_tokens / m.wall_seconds
            equations.add_step(
                "trace", float(m.load), run.terms, throughput, m.ttft_mean, m.itl_mean
            )
        quality = equations.quality(theta, loads)
        if best is None or quality.rms < best[0]:
            best = (quality.rms, theta, quality)
        if fits == TRACE_ITERATIONS or change < TRACE_CONVERGENCE:
            break
        new_theta, new_quality = equations.fit(fitted, loads)
        fits += 1
        if not thinks:
            best, change = (new_quality.rms, new_theta, new_quality), 0.0
            break
        matrix, _, offsets = equations.arrays()
        before, after = matrix @ theta + offsets, matrix @ new_theta + offsets
        change = float(np.max(np.abs(after - before) / np.maximum(np.abs(before), 1e-12)))
        theta = new_theta
    _, theta, quality = best
    requests = [turn for session in trace.sessions for turn in session]
    return Profile(
        replica=replica,
        shape=shape,
        cost=cost_of(theta, shape),
        fit=quality,
        fitted_at=time.time() if now is None else now,
        input_tokens=round(sum(len(t.prompt) for t in requests) / len(requests)),
        output_tokens=round(sum(t.max_tokens for t in requests) / len(requests)),
        notes={
            "trace": {"sessions": len(trace.sessions), "requests": len(requests)},
            "loads": sorted(m.load for m in usable),
            "fits": fits,
            "converged": change < TRACE_CONVERGENCE,
            "last_change": change,
        },
    )


def calibrate(
    run: Run,
    shape: EngineShape,
    replica: str,
    levels: Sequence[Level] = (),
    now: float | None = None,
) -> Profile:
    """Fit a profile to a stored knee run (its notes' input/output tokens where recorded,
    else `kneepoint sweep`'s defaults 256 and 128) and the replica's production levels."""
    notes = run.notes or {}
    return calibrate_sweep(
        run.points,
        shape,
        int(notes.get("input_tokens") or 256),
        int(notes.get("output_tokens") or 128),
        replica=replica,
        run_label=run.label,
        levels=levels,
        now=now,
    )


def fitted_terms(shape: EngineShape) -> tuple[str, ...]:
    """The terms fitted for a shape: FITTED, and the drafter's where it has one."""
    extra = ("draft_token_seconds",) if shape.num_speculative_tokens else ()
    return (*FITTED, *extra)


class Equations:
    """Measured numbers as linear equations in the cost's coefficients (one row of TERMS
    each, plus a fixed part no fitted term pays), and their non-negative fit."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.measured: list[float] = []
        self.fixed: list[float] = []
        self.labels: list[tuple[str, float, str, int]] = []  # source, load, metric, tokens

    def add(
        self, row: np.ndarray, value: float, fixed: float, label: tuple[str, float, str, int]
    ) -> None:
        self.rows.append(row)
        self.measured.append(value)
        self.fixed.append(fixed)
        self.labels.append(label)

    def add_step(
        self,
        source: str,
        load: float,
        step: StepTerms,
        throughput: float,
        ttft_mean: float | None,
        itl_mean: float | None,
    ) -> None:
        """A simulated step's equations against what was measured at it: its wall time
        (compared as throughput: the twin's tokens over the measured rate), and the mean
        TTFT and inter-token latency where measured (missing ones are skipped)."""
        tokens = step.output_tokens
        self.add(
            step.wall, tokens / throughput, step.wall_fixed, (source, load, "throughput", tokens)
        )
        if ttft_mean:
            self.add(step.ttft_mean, ttft_mean, step.ttft_fixed, (source, load, "ttft_mean", 0))
        if itl_mean and step.itl_mean is not None:
            self.add(step.itl_mean, itl_mean, step.itl_fixed, (source, load, "itl_mean", 0))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The matrix, the measured values and the fixed parts."""
        if not self.rows:
            raise WhatIfError("no measured number to fit: every point lacks throughput and latency")
        return np.vstack(self.rows), np.asarray(self.measured), np.asarray(self.fixed)

    def fit(self, fitted: Sequence[str], loads: set[float]) -> tuple[np.ndarray, FitQuality]:
        """The coefficients over TERMS (those not in `fitted` zero, OPTIONAL added where
        they cut the error, as the module says) and how well they reproduce every number."""
        matrix, values, offsets = self.arrays()
        columns = [TERMS.index(name) for name in fitted]
        theta = _solve(matrix, values, offsets, columns)
        rms = _rms(matrix, values, offsets, theta)
        if rms > EXTRA_TERM_RMS:
            extra_columns = [*columns, *(TERMS.index(name) for name in OPTIONAL)]
            wider = _solve(matrix, values, offsets, extra_columns)
            if _rms(matrix, values, offsets, wider) < 0.8 * rms:
                theta = wider
        return theta, self.quality(theta, loads)

    def quality(self, theta: np.ndarray, loads: set[float]) -> FitQuality:
        """How closely coefficients `theta` reproduce every measured number (judge)."""
        matrix, values, offsets = self.arrays()
        fits = matrix @ theta + offsets
        points = []
        for (source, load, metric, tokens), value, fit in zip(
            self.labels, values, fits, strict=True
        ):
            if metric == "throughput":  # compared as throughput, as it was measured
                value, fit = tokens / value, (tokens / fit if fit > 0 else 0.0)
            points.append(FitPoint(source, load, metric, float(value), float(fit)))
        return judge(points, loads)


def _solve(
    matrix: np.ndarray, values: np.ndarray, offsets: np.ndarray, columns: list[int]
) -> np.ndarray:
    """Non-negative least squares over `columns`, each row divided by its measured value
    (residuals are relative errors)."""
    scale = np.where(values > 0, values, 1.0)
    solution, _ = nnls(matrix[:, columns] / scale[:, None], (values - offsets) / scale)
    theta = np.zeros(len(TERMS))
    theta[columns] = solution
    return theta


def _rms(matrix: np.ndarray, values: np.ndarray, offsets: np.ndarray, theta: np.ndarray) -> float:
    scale = np.where(values > 0, values, 1.0)
    return float(np.sqrt(np.mean(((matrix @ theta + offsets - values) / scale) ** 2)))


def level_row(shape: EngineShape, level: Level) -> np.ndarray | None:
    """The terms of a decode step at a production level (None when nothing was running)."""
    b, g = level.running, level.generation_tokens_per_second
    if b < 0.5 or g <= 0:
        return None
    accepted = 1.0 + shape.spec_acceptance_rate * shape.num_speculative_tokens
    steps_per_second = g / (b * accepted)
    prefill = level.computed_prompt_tokens_per_second / steps_per_second
    row = np.zeros(len(TERMS))
    row[TERMS.index("overhead_seconds")] = 1.0
    row[TERMS.index("token_seconds")] = b * (1 + shape.num_speculative_tokens) + prefill
    row[TERMS.index("prefill_token_seconds")] = prefill
    row[TERMS.index("context_token_seconds")] = level.kv_cache_usage * shape.capacity_tokens
    row[TERMS.index("sequence_seconds")] = b
    row[TERMS.index("draft_token_seconds")] = shape.num_speculative_tokens
    return row


def judge(points: list[FitPoint], loads: set[float]) -> FitQuality:
    """Trusted when there are enough points at two loads or more and their RMS relative
    error is within TRUST_RMS."""
    quality = FitQuality(tuple(points), False, "")
    rms = quality.rms
    if len(points) < MIN_POINTS or len(loads) < 2:
        reason = f"{len(points)} measured numbers at {len(loads)} loads; needs {MIN_POINTS} at 2"
        return FitQuality(tuple(points), False, reason)
    if not np.isfinite(rms) or rms > TRUST_RMS:
        reason = f"RMS relative error {rms:.0%} is above {TRUST_RMS:.0%}"
        return FitQuality(tuple(points), False, reason)
    return FitQuality(tuple(points), True, f"RMS relative error {rms:.1%} ≤ {TRUST_RMS:.0%}")


def cost_of(theta: np.ndarray, shape: EngineShape) -> StepCost:
    """A StepCost from fitted coefficients. The per-step constant is split into overhead
    and weights read in the proportion the GPU and model profiles give (needed only to
    scale it to another GPU); with no profile it all counts as overhead."""
    fixed = float(theta[TERMS.index("overhead_seconds")])
    weights = 0.0
    if shape.gpu and shape.model:
        default = StepCost.of(EngineConfig(GPUS[shape.gpu], MODELS[shape.model]))
        share = default.weight_read_seconds / (
            default.weight_read_seconds + default.overhead_seconds
        )
        weights = fixed * share
    return StepCost(
        overhead_seconds=fixed - weights,
        weight_read_seconds=weights,
        token_seconds=float(theta[TERMS.index("token_seconds")]),
        prefill_token_seconds=float(theta[TERMS.index("prefill_token_seconds")]),
        context_token_seconds=float(theta[TERMS.index("context_token_seconds")]),
        sequence_seconds=float(theta[TERMS.index("sequence_seconds")]),
        draft_token_seconds=float(theta[TERMS.index("draft_token_seconds")]),
        request_overhead_seconds=float(theta[TERMS.index("request_overhead_seconds")]),
    )
