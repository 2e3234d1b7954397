"""The timeline's events for the app: the Timeline page's list, and the markers every
time-series chart draws (dashboards/charts.py MARKERS, set once per page run by app/main.py
for the sidebar's range and replicas)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import data
from app.filters import Filters
from dashboards.charts import MARKERS, WINDOW, Marker
from kneepoint.config import config_path
from kneepoint.timeline import Event


def events(since: float, until: float, replicas: tuple[str, ...] = ()) -> list[Event]:
    """Events in [since, until]: of `replicas` and the fleet's, or all when empty."""
    found = _events(str(config_path().resolve()), since, until)
    if not replicas:
        return found
    return [e for e in found if e.replica is None or e.replica in replicas]


@st.cache_data(ttl=10, show_spinner=False)
def _events(path: str, since: float, until: float) -> list[Event]:
    from kneepoint.timeline import events as timeline_events

    config, sessions = data._open(path)
    with sessions() as session:
        return timeline_events(session, config, since, until)


def mark_charts(chosen: Filters) -> None:
    """Every time-series chart of this page run marks the events of its range and replicas
    (a vertical line each, the detail on hover), and spans that range (charts line up)."""
    until = data.now()
    found = events(until - chosen.range_seconds, until, chosen.replicas)
    MARKERS.set(tuple(Marker.of(e) for e in found))
    WINDOW.set(
        (
            pd.Timestamp(until - chosen.range_seconds, unit="s", tz="UTC"),
            pd.Timestamp(until, unit="s", tz="UTC"),
        )
    )


