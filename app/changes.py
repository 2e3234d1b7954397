"""The timeline's events for the app: the Timeline page's list, and the markers every
time-series chart draws (dashboards/charts.py MARKERS, set once per page run by app/main.py
for the sidebar's range and replicas, read only when a chart draws)."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from app import data
from app.filters import Filters
from dashboards.charts import MARKERS, WINDOW, Marker
from kneepoint import timeline
from kneepoint.timeline import Event


def events(since: float, until: float, replicas: tuple[str, ...] = ()) -> list[Event]:
    """Events in [since, until]: of `replicas` and the fleet's, or all when empty."""
    path = data.config_file()
    found = _events(path, since, until, data.known(path).key)
    if not replicas:
        return found
    return [e for e in found if e.replica is None or e.replica in replicas]


# Keyed on the data version (samples and mutations: the timeline shows both), shared by
# every session; never on the wall clock.
@data.versioned("key", times=("since", "until"))
def _events(path: str, since: float, until: float, version: data.Key) -> list[Event]:
    config, sessions = data._open(path)
    with sessions() as session:
        return timeline.events(session, config, since, until)


def mark_charts(chosen: Filters) -> None:
    """Every time-series chart of this page run marks the events of its range and replicas
    (a vertical line each, the detail on hover), and spans that range (charts line up).
    The events are read when the first chart marks them: a page without one never does."""
    until = data.now()
    MARKERS.set(_markers(until - chosen.range_seconds, until, chosen.replicas))
    WINDOW.set(
        (
            pd.Timestamp(until - chosen.range_seconds, unit="s", tz="UTC"),
            pd.Timestamp(until, unit="s", tz="UTC"),
        )
    )


def _markers(
    since: float, until: float, replicas: tuple[str, ...]
) -> Callable[[], tuple[Marker, ...]]:
    """The markers of [since, until], read on the first call and kept for the page run."""
    kept: list[tuple[Marker, ...]] = []

    def read() -> tuple[Marker, ...]:
        if not kept:
            kept.append(tuple(Marker.of(e) for e in events(since, until, replicas)))
        return kept[0]

    return read
