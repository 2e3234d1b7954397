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

On a phone (390 px) a table shows what it is for first: every table names its `identity`
(the row's name, pinned) and the one or two columns that `matter`; `phone_layout` puts them
first with widths that fit their header and every value, all of them together within
PHONE_WIDTH; the other columns follow and scroll sideways under the pinned name.
"""

from __future__ import annotations

import math
import zlib
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
    # A shorter header the grid shows (a phone's narrow column); the frame keeps `header`,
    # and the header's tooltip starts with it.
    short: str | None = None
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
    times keep their types (sortable), their missing values left to the placeholder.
    The order people see on a phone is phone_layout's (people_table)."""
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
                column.short or header,
                format=_number_format(column),
                help=_shortened(column),
                pinned=pinned,
            )
        else:
            to_text = column.to_text or {
                "badge": fmt.badge,
                "yes_no": fmt.yes_no,
            }.get(column.kind, fmt.text)
            out[header] = pd.Series(
                [fmt.EMPTY if fmt.is_empty(v) else to_text(v) for v in values], dtype=object
            )
            config[header] = cc.TextColumn(
                column.short or header, help=_shortened(column), pinned=pinned
            )
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


def _shortened(column: Column) -> str | None:
    """The header's tooltip: what a `short` header stands for, then its `help`."""
    if not column.short:
        return column.help
    return _joined(f"{column.header}:" if column.help else f"{column.header}.", column.help)


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


# --- A phone's view ---------------------------------------------------------------------

# The visible width of a table in the main area at a 390 px viewport: 390 − 2 × 12 px of page
# padding − 2 px of border = 364 px (measured in Chromium), less 4 px to spare.
PHONE_WIDTH = 360
# Inside an expander its own padding and border take about 34 px more.
PHONE_WIDTH_IN_EXPANDER = 326
# glide-data-grid draws a cell's text 8 px in from each edge; 4 px to spare.
CELL_PADDING = 20
MIN_WIDTH = 50  # the dataframe's narrowest column
# Advance widths (px) of the table font, 14 px Source Sans, measured in Chromium with
# measureText; any other character counts as 14 px (1 em), wider than all but a few here.
_GLYPH_WIDTHS = {
    **dict.fromkeys("0123456789#$+<=>^~×±÷≥≤", 7.0),
    **dict.fromkeys(" ", 2.8),
    **dict.fromkeys("',.:;·’", 3.5),
    **dict.fromkeys("!", 4.1),
    **dict.fromkeys("()[]{}", 4.3),
    **dict.fromkeys("-", 4.4),
    **dict.fromkeys("/\\", 4.9),
    **dict.fromkeys("°", 4.7),
    **dict.fromkeys("*\"?", 6.0),
    **dict.fromkeys("%", 11.6),
    **dict.fromkeys("&", 8.6),
    **dict.fromkeys("@", 11.9),
    **dict.fromkeys("_`", 7.6),
    **dict.fromkeys("|", 3.4),
    "A": 7.7, "B": 8.3, "C": 8.0, "D": 8.7, "E": 7.4, "F": 7.0, "G": 8.7, "H": 9.2,
    "I": 3.7, "J": 6.8, "K": 8.2, "L": 6.9, "M": 10.2, "N": 9.1, "O": 9.3, "P": 8.0,
    "Q": 9.3, "R": 8.0, "S": 7.5, "T": 7.6, "U": 9.1, "V": 7.3, "W": 11.1, "X": 7.2,
    "Y": 6.7, "Z": 7.6,
    "a": 7.1, "b": 7.8, "c": 6.4, "d": 7.8, "e": 7.0, "f": 4.1, "g": 7.1, "h": 7.7,
    "i": 3.5, "j": 3.5, "k": 7.0, "l": 3.6, "m": 11.7, "n": 7.7, "o": 7.6, "p": 7.8,
    "q": 7.8, "r": 4.9, "s": 5.9, "t": 4.8, "u": 7.7, "v": 6.6, "w": 10.1, "x": 6.3,
    "y": 6.6, "z": 6.0,
    "●": 8.4, "–": 6.8, "—": 11.2, "…": 13.3, "µ": 7.9, "→": 8.7,
}  # fmt: skip
# What a "distance" time may read (dayjs's relative time), the widest first.
DISTANCE_TEXTS = ("a few seconds ago", "in a few seconds", "44 minutes ago", "11 months ago")
ABSOLUTE_TEXT = "2026-12-31 23:59:59"


def text_width(text: str) -> float:
    """How wide `text` is drawn in a table cell or header, in px (no padding)."""
    return sum(_GLYPH_WIDTHS.get(char, 14.0) for char in text)


def _printf(template: str, value: float) -> str:
    try:
        return template % value
    except (TypeError, ValueError):
        return f"{value:,.4f}"


def cell_texts(values: pd.Series, config: Mapping[str, Any] | None) -> list[str]:
    """What the dataframe draws for `values` under their column `config` (a column_config
    entry), as near as the server can tell: for sizing, not for showing."""
    kind = (config or {}).get("type_config") or {}
    template = kind.get("format")
    if pd.api.types.is_datetime64_any_dtype(values):
        return list(DISTANCE_TEXTS) if template == "distance" else [ABSOLUTE_TEXT]
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        texts = []
        for value in values:
            if fmt.is_empty(value):
                texts.append(fmt.EMPTY)
            elif template == "compact":
                texts.append(fmt.compact(float(value)).upper())  # the grid writes 459K
            elif template == "dollar":
                texts.append(f"${float(value):,.2f}")
            elif template:
                texts.append(_printf(template, float(value)))
            elif float(value).is_integer():
                texts.append(f"{int(value)}")
            else:
                texts.append(f"{float(value):.4f}".rstrip("0"))
        return texts
    return [fmt.EMPTY if fmt.is_empty(v) else str(v) for v in values]


def fitted_width(header: str, values: pd.Series, config: Mapping[str, Any] | None) -> int:
    """A column's width in px that shows its header and every value whole."""
    texts = [header, *cell_texts(values, config)]
    return max(MIN_WIDTH, math.ceil(max(text_width(t) for t in texts) + CELL_PADDING))


def phone_layout(
    shown: pd.DataFrame,
    identity: str,
    matters: Sequence[str] = (),
    config: Mapping[str, Any] | None = None,
    *,
    budget: int = PHONE_WIDTH,
) -> tuple[list[str], dict[str, Any]]:
    """column_order and column_config for `shown` (columns as displayed) on any screen, a
    phone's first: `identity` first and pinned, then `matters` in their order, then the rest.
    The identity and the columns that matter get widths that fit their header and values;
    when those add up to more than `budget` px each gives up the same share (not below
    MIN_WIDTH), so together they still fit a phone's table without scrolling."""
    config = dict(config or {})
    leading = [identity, *(m for m in matters if m != identity)]
    missing = [name for name in leading if name not in shown.columns]
    if missing:
        raise KeyError(f"no column {missing} in {list(shown.columns)}")
    order = [*leading, *(c for c in shown.columns if c not in leading)]

    def entry(name: str) -> dict[str, Any]:
        found = config.get(name)
        return dict(found) if isinstance(found, Mapping) else {}

    widths = {
        name: fitted_width(str(entry(name).get("label") or name), shown[name], entry(name))
        for name in leading
    }
    total = sum(widths.values())
    if total > budget:
        share = budget / total
        widths = {name: max(MIN_WIDTH, math.floor(w * share)) for name, w in widths.items()}
    for name in leading:
        config[name] = {**entry(name), "width": widths[name]}
    config[identity]["pinned"] = True
    return order, config


# --- Long tables: a page of rows at a time ------------------------------------------------

# The most rows a table sends to the browser at once; longer tables get a text filter and a
# page selector (a fleet of 1,000 replicas is 20 pages, not 1,000 rows drawn at once).
PAGE_ROWS = 50


@dataclass(frozen=True)
class Page:
    """The rows of one page (`rows`), which they are (`first`..`last`, 1-based, of the
    `matched` rows that pass the filter) and how many there are in all (`total`)."""

    rows: pd.DataFrame
    first: int
    last: int
    matched: int
    total: int
    pages: int
    number: int  # the page shown (1-based), clamped to 1..pages

    def caption(self, query: str = "") -> str:
        """ "rows 1–50 of 1,000"; with a filter, how many match and how many there are."""
        if not self.matched:
            return f"no rows match “{query}” ({self.total:,} in all)"
        shown = f"rows {self.first:,}–{self.last:,} of {self.matched:,}"
        if self.matched != self.total:
            shown += f" matching “{query}” ({self.total:,} in all)"
        return shown


def page_rows(
    shown: pd.DataFrame,
    *,
    query: str = "",
    number: int = 1,
    size: int = PAGE_ROWS,
    searched: Sequence[str] | None = None,
) -> Page:
    """Page `number` (1-based, clamped) of `size` rows of `shown`, keeping only rows where a
    `searched` column (every text column by default) contains `query`, ignoring case; rows
    keep their order (a page sorts worst first before it shows a table)."""
    total = len(shown)
    kept = shown
    needle = query.strip().lower()
    if needle:
        columns = [
            c for c in (searched if searched is not None else shown.columns)
            if c in shown
            and (pd.api.types.is_object_dtype(shown[c]) or pd.api.types.is_string_dtype(shown[c]))
        ]  # fmt: skip
        hit = pd.Series(False, index=shown.index)
        for column in columns:
            hit |= shown[column].astype(str).str.lower().str.contains(needle, regex=False)
        kept = shown[hit]
    matched = len(kept)
    pages = max(1, math.ceil(matched / size))
    number = min(max(1, number), pages)
    start = (number - 1) * size
    rows = kept.iloc[start : start + size]
    return Page(rows, start + 1 if matched else 0, start + len(rows), matched, total, pages, number)


def _pager(shown: pd.DataFrame, key: str, size: int) -> Page:
    """A text filter and a page selector above a long table, and the page they choose."""
    filter_key, page_key = f"{key}-filter", f"{key}-page"
    left, right = st.columns([3, 1])
    query = left.text_input(
        "Filter rows",
        key=filter_key,
        placeholder="Text in any column, e.g. a replica's name",
    )
    pages = page_rows(shown, query=query, size=size).pages
    # A narrower filter can leave fewer pages than the one chosen: start over at its last.
    if st.session_state.get(page_key, 1) > pages:
        st.session_state[page_key] = pages
    number = right.number_input("Page", min_value=1, max_value=pages, step=1, key=page_key)
    page = page_rows(shown, query=query, number=int(number), size=size)
    st.caption(page.caption(query))
    return page


def _table_key(columns: Mapping[str, Column], identity: str) -> str:
    """A stable key for a table's widgets: its columns' headers."""
    headers = "|".join(c.header for c in columns.values())
    return f"table-{identity}-{zlib.crc32(headers.encode()):08x}"


def people_table(
    frame: pd.DataFrame | Sequence[Mapping[str, Any]],
    columns: Mapping[str, Column],
    *,
    identity: str,
    matters: Sequence[str] = (),
    key: str | None = None,
    height: int | Literal["auto"] = "auto",
    budget: int = PHONE_WIDTH,
    page_size: int | None = PAGE_ROWS,
) -> None:
    """Show `frame` for people (prepare): full width, no index, "–" for what is missing;
    `identity` (a key of `columns`: the row's name) pinned first, then `matters` (the one
    or two columns the table is for), whole on a phone (phone_layout); `budget`: the table's
    width on a phone, less inside an expander (PHONE_WIDTH_IN_EXPANDER).

    Over `page_size` rows (None: never) only one page of rows is sent, chosen with a text
    filter and a page selector, under a caption "rows 1–50 of 1,000" (page_rows)."""
    shown, config = prepare(frame, columns)
    if page_size is not None and len(shown) > page_size:
        shown = _pager(shown, key or _table_key(columns, identity), page_size).rows
        shown = shown.reset_index(drop=True)
    order, config = phone_layout(
        shown,
        columns[identity].header,
        [columns[name].header for name in matters],
        config,
        budget=budget,
    )
    st.dataframe(
        styled(shown, columns),
        hide_index=True,
        width="stretch",
        height=height,
        column_order=order,
        column_config=config,
        placeholder=fmt.EMPTY,
        key=key,
    )
