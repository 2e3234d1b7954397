"""Pages at fleet size: above distribution.FLEET_THRESHOLD replicas (or GPUs) a page shows one
table of them, worst first and a page of rows at a time (app/tables.py people_table), and
the tiles of the replicas chosen in the sidebar only; a block of st.metric tiles per replica
(1,000 blocks) kept Chromium's renderer busy for minutes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kneepoint import distribution
from kneepoint.distribution import Worse


def at_fleet_size(count: int) -> bool:
    """Whether `count` replicas (or GPUs) are too many to draw one by one. Reads the
    threshold when called, so a test can lower it."""
    return count > distribution.FLEET_THRESHOLD


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def worst_first(
    rows: Sequence[Mapping[str, Any]],
    order: Sequence[tuple[str, Worse]],
    name: str = "replica",
) -> list[Mapping[str, Any]]:
    """`rows` by each (column, which way is bad) of `order` in turn, the worst first; a row
    without a value comes after those with one (nothing known is not the worst), ties by
    `name`."""

    def key(row: Mapping[str, Any]) -> tuple[Any, ...]:
        parts: list[tuple[bool, float]] = []
        for column, worse in order:
            value = row.get(column)
            if value is None or _missing(value):
                parts.append((True, 0.0))
            else:
                number = float(value)
                parts.append((False, -number if worse == "higher" else number))
        return (*parts, str(row.get(name, "")))

    return sorted(rows, key=key)
