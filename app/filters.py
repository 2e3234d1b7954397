"""The sidebar's time range and replica filter, kept in the URL's query string so that a link
reopens the same view: ?page=overview&range=1h&replica=qwen3-32b-a"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from kneepoint.durations import format_duration, parse_duration

RANGES = ("15m", "1h", "6h", "24h", "7d", "30d")
DEFAULT_RANGE = "1h"


@dataclass(frozen=True)
class Filters:
    range_seconds: float
    range_label: str
    replicas: tuple[str, ...]  # empty: all replicas


def current(all_replicas: list[str]) -> Filters:
    """The filters as the query string says (pages call this; the sidebar edits it)."""
    label = st.query_params.get("range", DEFAULT_RANGE)
    try:
        seconds = parse_duration(label)
    except ValueError:
        label, seconds = DEFAULT_RANGE, parse_duration(DEFAULT_RANGE)
    chosen = tuple(r for r in st.query_params.get_all("replica") if r in all_replicas)
    return Filters(seconds, label, chosen)


def sidebar(all_replicas: list[str]) -> Filters:
    """Draw the filters and write them back to the query string."""
    filters = current(all_replicas)
    options = list(RANGES) if filters.range_label in RANGES else [*RANGES, filters.range_label]
    label = st.sidebar.selectbox("Time range", options, index=options.index(filters.range_label))
    replicas = st.sidebar.multiselect(
        "Replicas", all_replicas, default=list(filters.replicas), placeholder="All replicas"
    )
    st.query_params["range"] = label
    st.query_params["replica"] = replicas
    return Filters(parse_duration(label), format_duration(parse_duration(label)), tuple(replicas))
