"""How numbers read on a page: units, and a dash for "no data" (never 0)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pandas as pd

from collectors.engines import ENGINE_NAMES
from kneepoint import catalogue
from kneepoint.records import Numbers
from kneepoint.samples import unavailable_reason


def show(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "–"
    if unit == "%":
        return f"{value:.{digits}%}"
    if unit == "$":
        return f"${value:,.{max(digits, 2)}f}"
    text = f"{value:,.{digits}f}"
    return f"{text} {unit}".strip()


def why(replica: Numbers, key: str, text: str) -> str:
    """A metric's help: `text`, or, where the replica's engine does not give the number
    (it shows "–"), the reason first ("not exposed by llama.cpp since …")."""
    reason = unavailable_reason(replica.get("unavailable") or {}, key)
    return text if reason is None else f"{reason[0].upper()}{reason[1:]}. {text}"


def engine_label(replica: Numbers) -> str:
    """The engine and its generation ("SGLang 0.5.23", "vLLM v1"), or "unknown engine"
    before the first scrape."""
    engine = replica.get("engine")
    if engine is None:
        return "unknown engine"
    generation = replica.get("engine_generation")
    name = ENGINE_NAMES.get(engine, engine)
    return f"{name} {generation}" if generation else name


def quantile(values: dict[str, float | None] | None, key: str, unit: str = "s") -> str:
    if not values or values.get(key) is None:
        return "–"
    return show(values[key], unit, 3)


# Tables and numbers for people (app/tables.py): never None/NaN/NaT, never a cut number.
EMPTY = "–"


def is_empty(value: Any) -> bool:
    """None, NaN, NaT, pd.NA or a blank string: shown as "–"."""
    if isinstance(value, str):
        return not value.strip()
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or an array: not one empty cell
        return False


def text(value: Any) -> str:
    return EMPTY if is_empty(value) else str(value)


def yes_no(value: Any) -> str:
    """A boolean as a word: "yes", "no", or "–" when unknown."""
    return EMPTY if is_empty(value) else ("yes" if bool(value) else "no")


_UNITS = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))


def compact(value: float | None, unit: str = "", digits: int = 3) -> str:
    """A number short enough never to be cut: 459088 → "459k", 1234567 → "1.23M",
    with `digits` significant digits (trailing zeros dropped) and the unit after it."""
    if is_empty(value):
        return EMPTY
    assert value is not None
    number = float(value)
    suffix = ""
    for index, (scale, letter) in enumerate(_UNITS):
        if abs(number) >= scale:
            scaled = float(f"{number / scale:.{digits}g}")
            if abs(scaled) >= 1000 and index > 0:  # 999,950 rounds to 1000k: say 1M
                scale, letter = _UNITS[index - 1]
                scaled = float(f"{number / scale:.{digits}g}")
            number, suffix = scaled, letter
            break
    if suffix:
        shown = f"{number:.{digits}g}"
    else:
        shown = f"{number:,.{max(digits - len(str(int(abs(number)))), 0)}f}"
        if "." in shown:
            shown = shown.rstrip("0").rstrip(".")
    return f"{shown}{suffix} {unit}".strip()


_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float | None, unit: str, digits: int = 3) -> str:
    """A physical quantity with an SI prefix, never cut: 3_400_000 J → "3.4 MJ",
    459_088 W → "459 kW", 12.5 J → "12.5 J"."""
    if is_empty(value):
        return EMPTY
    assert value is not None
    number = float(value)
    for scale, prefix in _SI:
        if abs(number) >= scale:
            return f"{float(f'{number / scale:.{digits}g}'):g} {prefix}{unit}"
    return f"{compact(number)} {unit}"


def times(value: float | None, what: str = "", digits: int = 2) -> str:
    """A ratio with its unit: 2.1636 → "2.16×", with what it is a multiple of
    ("2.16× budget"); 1.0 → "1×"."""
    if is_empty(value):
        return EMPTY
    assert value is not None
    shown = f"{float(value):.{digits}f}".rstrip("0").rstrip(".")
    return f"{shown}× {what}".strip()


def duration(seconds: float) -> str:
    """A span in the largest units that say it: "45 s", "12 min", "1 h 20 min", "3 d 4 h"."""
    seconds = abs(float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def ago(ts: float | None, now: float) -> str:
    """A moment relative to `now`: "just now", "12 min ago", "in 5 min"; "–" for none."""
    if is_empty(ts):
        return EMPTY
    assert ts is not None
    delta = now - float(ts)
    if abs(delta) < 5:
        return "just now"
    return f"{duration(delta)} ago" if delta > 0 else f"in {duration(delta)}"


def clock(ts: float | None, now: float) -> str:
    """A moment as people read it on a page: "09:12 UTC" today, "Mon 3 Aug 09:12 UTC" on
    another day; "–" for none. Never an ISO string."""
    if is_empty(ts):
        return EMPTY
    assert ts is not None
    moment = datetime.fromtimestamp(float(ts), UTC)
    today = moment.date() == datetime.fromtimestamp(float(now), UTC).date()
    day = "" if today else moment.strftime(f"%a {moment.day} %b ")  # no %-d: not portable
    return f"{day}{moment:%H:%M} UTC"


def utc(ts: float | None) -> str:
    """The absolute time: "2026-12-01 14:03:05 UTC"; "–" for none."""
    if is_empty(ts):
        return EMPTY
    assert ts is not None
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# A state or severity as a badge: a dot before the word, coloured by app/tables (a text
# colour, not an emoji: emoji fonts are missing on many Linux desktops and in headless
# Chromium, where they show as empty boxes). The word alone still says it.
DOT = "●"
_TONES = {
    "red": "firing critical page down gone failed failing broken error refused refusing dead "
    "stalled",
    "orange": "pending warning ticket stale retrying degraded burning",
    "green": "resolved ok up live done sent delivered healthy success inactive",
    "blue": "info asleep",
}
_TONE = {word: tone for tone, words in _TONES.items() for word in words.split()}
# Readable on the light and the dark theme alike.
TONE_COLOURS = {
    "red": "#e5484d",
    "orange": "#e2760a",
    "green": "#30a46c",
    "blue": "#0b84e5",
    "gray": "#8b8d98",
}


def tone(value: Any) -> str:
    """A state's or severity's tone: red (firing, down, page, refusing), orange (pending,
    stale, ticket), green (resolved, up, done), blue (info, asleep), gray (anything else or
    nothing). A state with a detail in brackets ("asleep (weights offloaded)") has its
    word's tone."""
    if is_empty(value):
        return "gray"
    word = str(value).strip().lower().removeprefix(DOT).strip()
    return _TONE.get(word, _TONE.get(word.split(" (")[0], "gray"))


def badge(value: Any) -> str:
    """A state or severity as a badge: "● firing" (coloured by its tone in a table), or "–"
    when there is none."""
    if is_empty(value):
        return EMPTY
    return f"{DOT} {value}"


def metric_unit(metric: str) -> str:
    """The unit an alert rule's metric reads in (kneepoint/catalogue.py): "%" for shares,
    "points" for a drop in a share, "× budget" for SLO burn rates, "×", "s", "$", "/s" for
    rates, or "" for counts."""
    if catalogue.burn_slo(metric) is not None:
        return "× budget"
    return catalogue.rule_unit(metric)


def metric_value(value: float | None, unit: str) -> str:
    """An alert's value or threshold in its metric's unit (metric_unit): 2.1636 with
    "× budget" → "2.16× budget", 0.93 with "%" → "93.0%", 0.3 "points" → "30 points"."""
    if is_empty(value):
        return EMPTY
    assert value is not None
    if unit.startswith("×"):
        return times(value, unit[1:].strip())
    if unit == "points":
        return f"{float(value) * 100:.0f} points"
    if unit == "s":
        return show(float(value), "s", 3)
    if unit in ("%", "$"):
        return show(float(value), unit)
    if unit == "/s":
        return f"{compact(value)}/s"
    return compact(value)


def metric_text(value: Any, unit: str) -> str:
    """An alert's value as app/data.alerts gives it (a number or its text, "no data", or
    the reason the engine does not give it) in the metric's unit (metric_value)."""
    if is_empty(value):
        return EMPTY
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return metric_value(number, unit)


# The two meanings of "utilization", named apart wherever both appear (issue 17).
GPU_BUSY_VS_LOAD = (
    "GPU busy (DCGM) is the share of time a GPU runs a kernel; load vs knee is the throughput "
    "served ÷ the knee's. They differ by design: decode at small batch is memory-bound, the GPU "
    "is busy reading the weights each step whether one or 64 sequences ride along, so a GPU can "
    "be 90 % busy at 5 % of its knee."
)
