"""Fleet charts' data, computed by the database (kneepoint/store/fleet_series.py) and cached
as app/data.py caches (data.versioned): keyed on the config file, the arguments and the
store's data version, shared by every session, and made again by the warmer for a new
round. A fleet-size page run reads a few hundred buckets, one mean per series and the rows
of the few series drawn, never every replica's series."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from app import data
from dashboards import charts
from kneepoint.distribution import Fleet, Worse
from kneepoint.store import fleet_series

Key = data.Key


def replica_chart(
    column: str,
    start: float,
    end: float,
    worse: Worse = "higher",
    chosen: Sequence[str] = (),
    resample: int = 0,
) -> Fleet:
    """The fleet chart data of replica series `column` over [start, end] (each replica's
    series resampled to `resample` seconds first, when given)."""
    path = data.config_file()
    version = data.known(path).samples
    return _replica_chart(path, column, start, end, worse, tuple(chosen), resample, version)


@data.versioned("samples", times=("start", "end"))
def _replica_chart(
    path: str,
    column: str,
    start: float,
    end: float,
    worse: Worse,
    chosen: tuple[str, ...],
    resample: int,
    version: Key,
) -> Fleet:
    config, sessions = data._open(path)
    with sessions() as session:
        return fleet_series.replica_fleet(
            session, start, end, column, config.scrape_interval, worse, chosen, resample=resample
        )


def gpu_chart(
    column: str, start: float, end: float, worse: Worse = "higher", chosen: Sequence[str] = ()
) -> Fleet:
    """The fleet chart data of GPU reading `column` over [start, end]."""
    path = data.config_file()
    return _gpu_chart(path, column, start, end, worse, tuple(chosen), data.known(path).samples)


@data.versioned("samples", times=("start", "end"))
def _gpu_chart(
    path: str,
    column: str,
    start: float,
    end: float,
    worse: Worse,
    chosen: tuple[str, ...],
    version: Key,
) -> Fleet:
    config, sessions = data._open(path)
    with sessions() as session:
        return fleet_series.gpu_fleet(
            session, start, end, column, config.scrape_interval, worse, chosen
        )


def replica_lines(
    column: str,
    start: float,
    end: float,
    title: str,
    percent: bool = False,
    unit: str = "",
    y_title: str | None = None,
    *,
    worse: Worse = "higher",
    chosen: Sequence[str] = (),
    resample: int = 0,
) -> go.Figure:
    """charts.lines' fleet figure of replica series `column`, from replica_chart."""
    fleet = replica_chart(column, start, end, worse, chosen, resample)
    return charts.fleet_lines(
        fleet, column, title, "replica", percent, unit, y_title, worse=worse, chosen=chosen
    )


def gpu_lines(
    column: str,
    start: float,
    end: float,
    title: str,
    percent: bool = False,
    unit: str = "",
    y_title: str | None = None,
    *,
    worse: Worse = "higher",
    chosen: Sequence[str] = (),
) -> go.Figure:
    """charts.lines' fleet figure of GPU reading `column`, from gpu_chart."""
    fleet = gpu_chart(column, start, end, worse, chosen)
    return charts.fleet_lines(
        fleet, column, title, "gpu", percent, unit, y_title, worse=worse, chosen=chosen
    )
