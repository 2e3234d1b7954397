"""How numbers read on a page: units, and a dash for "no data" (never 0)."""

from __future__ import annotations

from typing import Any

from kneepoint.samples import ENGINE_NAMES, unavailable_reason


def show(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "–"
    if unit == "%":
        return f"{value:.{digits}%}"
    if unit == "$":
        return f"${value:,.{max(digits, 2)}f}"
    text = f"{value:,.{digits}f}"
    return f"{text} {unit}".strip()


def why(replica: dict[str, Any], key: str, text: str) -> str:
    """A metric's help: `text`, or, where the replica's engine does not give the number
    (it shows "–"), the reason first ("not exposed by llama.cpp since …")."""
    reason = unavailable_reason(replica.get("unavailable") or {}, key)
    return text if reason is None else f"{reason[0].upper()}{reason[1:]}. {text}"


def engine_label(replica: dict[str, Any]) -> str:
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
