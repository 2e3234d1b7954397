"""Stalled engines: a replica that answers its scrapes while its engine does no work.

The field's most-reported failure is a vLLM whose engine core died or wedged while its API
server still answers `/health` and `/metrics`: requests sit running or waiting and no token
is produced. From stored samples that reads as: work present (requests running or waiting)
at two consecutive samples, and between them no token counter moved (prompt and generation
tokens, and the engine's step counter where one is given), and none went down.

- An idle replica (nothing running or waiting) is never stalled: an idle engine does not
  step, so unmoving counters say nothing.
- A counter that goes down was reset (a restart): that is movement, not a stall; the run
  starts again from the sample after the reset.
- An asleep replica (vLLM's sleep mode, `sleep_level` > 0: the engine was put to sleep on
  purpose to free GPU memory, `vllm:engine_sleep_state`) is never stalled: its counters are
  frozen by design, and a request that reaches it waits for the wake-up, not for a wedged
  engine. A sample asleep counts as no work present, like an idle one; stored summary rows
  keep the level's mean, so a summary row asleep for any part of it counts as asleep.
- A missing sample (a failed scrape, a stale target) is `target-down`'s and
  `collector-stale`'s business: two samples further apart than `max_gap` are not read as
  one stuck stretch.
- A long prefill moves nothing for a while, and that is not a stall. vLLM V1 adds a
  request's prompt tokens to `prompt_tokens_total` only when its prefill ends (with the
  first token: `IterationStats.update_from_output` counts them on the output that carries
  the first token; chunked prefill's earlier chunks produce no output), and
  `generation_tokens_total` moves only with decoded tokens. So a replica prefilling one long
  prompt with nothing decoding beside it shows work present and frozen counters until the
  prefill ends. A 128k-token prompt on one GPU prefills in seconds to a few tens of seconds
  (chunked prefill, 8k tokens a step), so STALL_AFTER (60 s) is above a normal long prefill
  and below what a wedged engine costs the agents waiting on it. Any decoding stream beside
  the prefill moves `generation_tokens` at every step, so the window only matters when the
  long prompt is alone. Where an engine's step counter is given (`engine_steps`), a step
  is movement. vLLM's (the count of `iteration_tokens_total`, collectors/engines/vllm.py) counts
  in V1 only the steps that emit output, so a chunk of a lone long prefill does not move
  it either, and STALL_AFTER still has to cover that prefill.

A stall is counted as unavailability by the SLOs (alerts/slo.py) and read as the
"upstream (stalled engine)" cause (kneepoint/causes.py); the `engine-stalled` rule watches
the `engine_stalled` metric (alerts/values.py), and `kneepoint status --json` shows
`stalled` and `stalled_since` per replica.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

# Seconds of work present with frozen counters before a replica counts as stalled: the
# `engine-stalled` rule's default `for`, and the default minimum length of a stalled
# interval. Above a normal long prefill (see the module docstring).
STALL_AFTER = 60.0

# The counters whose movement is progress, in the order they are read.
PROGRESS = ("prompt_tokens", "generation_tokens", "engine_steps")


class StallSample(Protocol):
    """What a stored replica sample must have: a time and its queues; its cumulative
    progress counters `prompt_tokens`, `generation_tokens` and (where the engine has a
    step/iteration counter) `engine_steps`, and its `sleep_level`, are read where present
    (None or missing: unknown). kneepoint.store.models.ReplicaSampleRow rows fit as they
    are (their counter columns are set at import, out of a type checker's sight); `Point`
    is a plain one."""

    @property
    def ts(self) -> float: ...

    @property
    def requests_running(self) -> float | None: ...

    @property
    def requests_waiting(self) -> float | None: ...


@dataclass(frozen=True)
class Point:
    """One replica sample, as much of it as stall detection reads (cumulative counters)."""

    ts: float
    requests_running: float | None
    requests_waiting: float | None
    prompt_tokens: float | None
    generation_tokens: float | None
    engine_steps: float | None = None
    sleep_level: float | None = None  # 0 awake, 1 or 2 asleep (None: not known, awake)


def asleep(sample: StallSample) -> bool:
    """The engine was put to sleep (its `sleep_level` known and above 0)."""
    level = getattr(sample, "sleep_level", None)
    return level is not None and not math.isnan(level) and level > 0


def busy(sample: StallSample) -> bool:
    """Requests running or waiting at this sample (unknown queues: not busy), the engine
    awake (an asleep one is never busy: module docstring)."""
    if asleep(sample):
        return False
    queued = [q for q in (sample.requests_running, sample.requests_waiting) if q is not None]
    return sum(queued) > 0


def _counters(sample: StallSample) -> tuple[float | None, ...]:
    return tuple(getattr(sample, name, None) for name in PROGRESS)


def stuck(earlier: StallSample, later: StallSample, max_gap: float | None = None) -> bool:
    """Between these two consecutive samples: work present at both, at least one progress
    counter known at both, none of them moved, none went down (a reset), and the samples
    no further apart than `max_gap` (when given)."""
    if not (busy(earlier) and busy(later)):
        return False
    if max_gap is not None and later.ts - earlier.ts > max_gap:
        return False
    pairs = [
        (a, b)
        for a, b in zip(_counters(earlier), _counters(later), strict=True)
        if a is not None and b is not None
    ]
    return bool(pairs) and all(b == a for a, b in pairs)


def _runs(samples: Iterable[StallSample], max_gap: float | None) -> list[tuple[float, float]]:
    """Every maximal stretch of stuck consecutive samples, (first ts, last ts)."""
    ordered = sorted(samples, key=lambda s: s.ts)
    runs: list[tuple[float, float]] = []
    going = False  # the last pair was stuck: a stuck pair extends runs[-1]
    for earlier, later in itertools.pairwise(ordered):
        if not stuck(earlier, later, max_gap):
            going = False
        elif going:
            runs[-1] = (runs[-1][0], later.ts)
        else:
            runs.append((earlier.ts, later.ts))
            going = True
    return runs


def stalled_intervals(
    samples: Iterable[StallSample],
    min_duration: float = STALL_AFTER,
    max_gap: float | None = None,
) -> list[tuple[float, float]]:
    """The stalled intervals (start, end) in seconds, oldest first, from one replica's
    samples (any order): stretches of consecutive stuck samples (`stuck`) lasting at least
    `min_duration`. An interval runs from the first sample of the stretch to its last; one
    still going at the last sample ends there."""
    return [(a, b) for a, b in _runs(samples, max_gap) if b - a >= min_duration]


def stalled_since(
    samples: Iterable[StallSample],
    min_duration: float = 0.0,
    max_gap: float | None = None,
) -> float | None:
    """When the stall still going at the latest sample began, if it has lasted at least
    `min_duration`; None when the latest two samples are not stuck."""
    ordered = sorted(samples, key=lambda s: s.ts)
    if not ordered:
        return None
    runs = _runs(ordered, max_gap)
    if not runs or runs[-1][1] != ordered[-1].ts:
        return None
    start, end = runs[-1]
    return start if end - start >= min_duration else None
