"""Compact text for histograms and short lists in one column of a wide row.

A histogram is `layout|sum|n0,n1,…` where `layout` names its bucket bounds (stored once in
histogram_layouts) and n are the per-bucket counts, not cumulative: mostly small numbers and
zeros, which keeps a row near 60 bytes per histogram instead of ~300.
"""

from __future__ import annotations

from itertools import accumulate
from operator import sub

from kneepoint.samples import Histogram


def number(value: float) -> str:
    """Write a float exactly and short: integral values without a decimal point."""
    return str(int(value)) if value.is_integer() and abs(value) < 2**63 else repr(value)


def encode_bounds(bounds: tuple[float, ...]) -> str:
    return ",".join(number(b) if b != float("inf") else "+Inf" for b in bounds)


def decode_bounds(text: str) -> tuple[float, ...]:
    return tuple(float(part) for part in text.split(","))


def encode_histogram(layout_id: int, histogram: Histogram) -> str:
    counts = histogram.counts
    # Each bucket's own count: the first, then each cumulative count less the one before.
    per_bucket = [counts[0], *map(sub, counts[1:], counts)] if counts else []
    return f"{layout_id}|{number(histogram.total)}|{numbers(per_bucket)}"


def numbers(values: list[float]) -> str:
    """`values` written by number(), comma-separated; the same text, made in one pass where
    repr() already writes each as number() would once a trailing ".0" is cut: a finite
    float's repr ends in ".0" exactly when it is integral and below 1e16 (then number()
    writes int()'s digits, the same), and uses an exponent ("e") from 1e16 on. Lists with an
    "e" (large, tiny), a "-" (a negative zero is "-0.0" to repr and "0" to number()) or a
    value that is not a float go value by value."""
    text = ",".join(map(repr, values)) + ","
    if "e" in text or "-" in text or "n" in text or set(map(type, values)) - {float}:
        return ",".join(number(v) for v in values)
    return text.replace(".0,", ",")[:-1]


def decode_histogram(text: str, layouts: dict[int, tuple[float, ...]]) -> Histogram:
    layout, total, counts = text.split("|")
    cumulative = tuple(accumulate(float(part) for part in counts.split(","))) if counts else ()
    return Histogram(layouts[int(layout)], cumulative, float(total))


def encode_floats(values: list[float] | None) -> str | None:
    return None if values is None else numbers(values)


def decode_floats(text: str | None) -> list[float] | None:
    return None if not text else [float(part) for part in text.split(",")]
