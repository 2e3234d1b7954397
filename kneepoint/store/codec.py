"""Compact text for histograms and short lists in one column of a wide row.

A histogram is `layout|sum|n0,n1,…` where `layout` names its bucket bounds (stored once in
histogram_layouts) and n are the per-bucket counts, not cumulative: mostly small numbers and
zeros, which keeps a row near 60 bytes per histogram instead of ~300.
"""

from __future__ import annotations

from itertools import accumulate

from kneepoint.samples import Histogram


def number(value: float) -> str:
    """Write a float exactly and short: integral values without a decimal point."""
    return str(int(value)) if value.is_integer() and abs(value) < 2**63 else repr(value)


def encode_bounds(bounds: tuple[float, ...]) -> str:
    return ",".join(number(b) if b != float("inf") else "+Inf" for b in bounds)


def decode_bounds(text: str) -> tuple[float, ...]:
    return tuple(float(part) for part in text.split(","))


def encode_histogram(layout_id: int, histogram: Histogram) -> str:
    per_bucket = (
        [
            histogram.counts[0],
            *(
                later - earlier
                for earlier, later in zip(histogram.counts, histogram.counts[1:], strict=False)
            ),
        ]
        if histogram.counts
        else []
    )
    return f"{layout_id}|{number(histogram.total)}|{','.join(number(n) for n in per_bucket)}"


def decode_histogram(text: str, layouts: dict[int, tuple[float, ...]]) -> Histogram:
    layout, total, counts = text.split("|")
    cumulative = tuple(accumulate(float(part) for part in counts.split(","))) if counts else ()
    return Histogram(layouts[int(layout)], cumulative, float(total))


def encode_floats(values: list[float] | None) -> str | None:
    return None if values is None else ",".join(number(v) for v in values)


def decode_floats(text: str | None) -> list[float] | None:
    return None if not text else [float(part) for part in text.split(",")]
