"""Tables for people: st.dataframe with human column names, units, "–" for empty cells,
relative times with the exact UTC time beside them, yes/no for booleans, coloured badges
(● firing in red) for states and severities, and numbers that are never cut.

A page names the columns it shows, in order, with what each is:

    people_table(frame, {
        "state": badge("State"),
        "rule": text("Rule"),
        "fired_at": time("Fired", help="When it started firing."),
        "kv_cache_capacity_tokens": number("KV capacity", unit="tokens", compact=True),
        "stale": yes_no("Stale"),
    })

`prepare` does the work without Streamlit (tests use it): it returns the frame as shown and
its column_config. Numbers and times stay numbers and datetimes, so clicking a header sorts
them as such; their missing values show the dataframe's placeholder, "–".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
import streamlit as st

from app import format as fmt

Kind = Literal["text", "badge", "yes_no", "time", "number", "percent", "ratio", "money", "seconds"]


@dataclass(frozen=True)
class Column:
    """How one source column reads: its header (`label`, with `unit` in brackets), its kind
    and its header tooltip (`help`)."""

    label: str
    kind: Kind = "text"
    unit: str = ""
    help: str | None = None
    digits: int = 1
    compact: bool = False  # numbers: 459k, 1.2M (the dataframe's compact format)
    absolute: bool = True  # times: also an exact "<label> (UTC)" column beside it
    pinned: bool = False
    to_text: Callable[[Any], str] | None = field(default=None, compare=False)

    @property
    def header(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else self.label


def text(label: str, help: str | None = None, **kw: Any) -> Column:
    return Column(label, "text", help=help, **kw)


def badge(label: str, help: str | None = None, **kw: Any) -> Column:
    """A state or severity: ● firing in red, ● pending in orange, ● resolved in green
    (app/format.badge and tone)."""
    return Column(label, "badge", help=help, **kw)


def yes_no(label: str, help: str | None = None, **kw: Any) -> Column:
    return Column(label, "yes_no", help=help, **kw)


def time(label: str, help: str | None = None, *, absolute: bool = True, **kw: Any) -> Column:
    """A moment (epoch seconds, a datetime or a Timestamp): "12 minutes ago", sortable, with
    the exact UTC time in a "<label> (UTC)" column beside it unless `absolute` is False."""
    return Column(label, "time", help=help, absolute=absolute, **kw)


def number(
    label: str,
    unit: str = "",
    help: str | None = None,
    *,
    digits: int = 1,
    compact: bool = False,
    **kw: Any,
) -> Column:
    """A number, its unit in the header; `compact` for counts that grow long (459K)."""
    return Column(label, "number", unit=unit, help=help, digits=digits, compact=compact, **kw)


def percent(label: str, help: str | None = None, *, digits: int = 1, **kw: Any) -> Column:
    """A share 0..1, shown as 93.2% (the cell says the unit)."""
    return Column(label, "percent", help=help, digits=digits, **kw)


def ratio(label: str, of: str = "", help: str | None = None, *, digits: int = 2) -> Column:
    """A multiple: 2.16×, with what it is a multiple of in the header ("× budget")."""
    return Column(label, "ratio", unit=f"× {of}".strip(), help=help, digits=digits)


def money(label: str, help: str | None = None, **kw: Any) -> Column:
    """Dollars: $1,234.57."""
    return Column(label, "money", help=help, **kw)


def seconds(label: str, help: str | None = None, *, digits: int = 3, **kw: Any) -> Column:
    return Column(label, "seconds", unit="s", help=help, digits=digits, **kw)


def formatted(label: str, to_text: Callable[[Any], str], help: str | None = None) -> Column:
    """Text made from each value by `to_text` (empty values still show "–")."""
    return Column(label, "text", help=help, to_text=to_text)


UTC_SUFFIX = " (UTC)"
ABSOLUTE_FORMAT = "YYYY-MM-DD HH:mm:ss"


def _moments(values: pd.Series) -> pd.Series:
    if pd.api.types.is_numeric_dtype(values):
        return pd.to_datetime(values, unit="s", utc=True)
    return pd.to_datetime(values, utc=True)


def prepare(
    frame: pd.DataFrame | Sequence[Mapping[str, Any]], columns: Mapping[str, Column]
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The frame as people read it (only `columns`, in their order, under their headers)
    and the st.column_config for it. Text cells are never None/NaN ("–"); numbers and
    times keep their types (sortable), their missing values left to the placeholder."""
    source = frame if isinstance(frame, pd.DataFrame) else pd.DataFrame(list(frame))
    missing = [name for name in columns if name not in source.columns and len(source)]
    if missing:
        raise KeyError(f"no column {missing} in {list(source.columns)}")
    out: dict[str, pd.Series] = {}
    config: dict[str, Any] = {}
    cc = st.column_config
    for name, column in columns.items():
        values = (
            source[name].reset_index(drop=True)
            if name in source.columns
            else pd.Series([], dtype=object)
        )
        header = column.header
        pinned = True if column.pinned else None
        if column.kind == "time":
            moments = _moments(values)
            out[header] = moments
            config[header] = cc.DatetimeColumn(
                header,
                format="distance",
                help=_joined(
                    column.help,
                    f"Relative to now; the exact time is in “{header}{UTC_SUFFIX}”."
                    if column.absolute
                    else "Relative to now.",
                ),
                pinned=pinned,
            )
            if column.absolute:
                exact = header + UTC_SUFFIX
                out[exact] = moments
                config[exact] = cc.DatetimeColumn(
                    exact, format=ABSOLUTE_FORMAT, timezone="UTC", help=column.help
                )
        elif column.kind in ("number", "percent", "ratio", "money", "seconds"):
            numbers = pd.to_numeric(values, errors="coerce").astype(float)
            if column.kind == "percent":
                numbers = numbers * 100
            out[header] = numbers
            config[header] = cc.NumberColumn(
                header, format=_number_format(column), help=column.help, pinned=pinned
            )
        else:
            to_text = column.to_text or {
                "badge": fmt.badge,
                "yes_no": fmt.yes_no,
            }.get(column.kind, fmt.text)
            out[header] = pd.Series(
                [fmt.EMPTY if fmt.is_empty(v) else to_text(v) for v in values], dtype=object
            )
            config[header] = cc.TextColumn(header, help=column.help, pinned=pinned)
    return pd.DataFrame(out), config


def _number_format(column: Column) -> str:
    if column.kind == "money":
        return "dollar"
    if column.compact:
        return "compact"
    if column.kind == "percent":
        return f"%.{column.digits}f%%"
    if column.kind == "ratio":
        return f"%.{column.digits}f×"
    return f"%.{column.digits}f"


def _joined(*parts: str | None) -> str:
    return " ".join(p for p in parts if p)


def _tone_css(cell: Any) -> str:
    return "" if cell == fmt.EMPTY else f"color: {fmt.TONE_COLOURS[fmt.tone(cell)]}"


def styled(shown: pd.DataFrame, columns: Mapping[str, Column]) -> pd.DataFrame | Any:
    """`shown` with its badge columns coloured by their tone (a pandas Styler; the frame
    itself where there is nothing to colour). column_config's formats still rule the rest."""
    badges = [c.header for c in columns.values() if c.kind == "badge" and c.header in shown]
    if not badges or shown.empty:
        return shown
    return shown.style.map(_tone_css, subset=badges)


def people_table(
    frame: pd.DataFrame | Sequence[Mapping[str, Any]],
    columns: Mapping[str, Column],
    *,
    key: str | None = None,
    height: int | Literal["auto"] = "auto",
) -> None:
    """Show `frame` for people (prepare): full width, no index, "–" for what is missing."""
    shown, config = prepare(frame, columns)
    st.dataframe(
        styled(shown, columns),
        hide_index=True,
        width="stretch",
        height=height,
        column_config=config,
        placeholder=fmt.EMPTY,
        key=key,
    )
