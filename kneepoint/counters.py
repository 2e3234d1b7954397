"""Counter arithmetic over a window, with reset handling as PromQL's increase() does it.

A counter that goes down was reset (engine restart): the value after the reset is the
increase since the reset. The result is never negative and never a spike. Unlike PromQL,
nothing is extrapolated to the window's edges: the increase is between the first and the
last sample inside the window.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def increase(values: Sequence[float | None]) -> float | None:
    """Total increase of a cumulative counter over consecutive samples; None without two."""
    known = [value for value in values if value is not None]
    if len(known) < 2:
        return None
    total = 0.0
    for earlier, later in itertools.pairwise(known):
        total += later - earlier if later >= earlier else later
    return total


def reset_points(values: Sequence[float | None]) -> list[int]:
    """Indexes i where values[i+1] < values[i]: the last sample before a reset."""
    points = []
    previous_index: int | None = None
    for index, value in enumerate(values):
        if value is None:
            continue
        if previous_index is not None and value < (values[previous_index] or 0.0):
            points.append(previous_index)
        previous_index = index
    return points
