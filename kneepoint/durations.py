"""Durations as the config and command line write them: 15s, 5m, 48h, 30d, 500ms."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str | float | int) -> float:
    """Return seconds; a bare number is seconds. Raise ValueError naming the bad text."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"duration {text} is negative")
        return float(text)
    match = _DURATION.fullmatch(str(text).strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 15s, 5m, 48h or 30d")
    return float(match.group(1)) * _UNITS[match.group(2)]


def format_duration(seconds: float) -> str:
    """Write seconds back in the largest unit that divides them exactly."""
    for unit in ("w", "d", "h", "m", "s"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
