"""How numbers read on a page: units, and a dash for "no data" (never 0)."""

from __future__ import annotations


def show(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "–"
    if unit == "%":
        return f"{value:.{digits}%}"
    if unit == "$":
        return f"${value:,.{max(digits, 2)}f}"
    text = f"{value:,.{digits}f}"
    return f"{text} {unit}".strip()


def quantile(values: dict[str, float | None] | None, key: str, unit: str = "s") -> str:
    if not values or values.get(key) is None:
        return "–"
    return show(values[key], unit, 3)
