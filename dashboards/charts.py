"""Generic chart builders: a DataFrame in, a Plotly figure out.

Every figure has a title and axis titles that end in their unit in parentheses ("time (UTC)",
"KV-cache occupancy (%)"); time series hover all their lines at once ("x unified") over the
page's time range (WINDOW), so the charts of a page line up. `config` is what the app passes
to st.plotly_chart (the modebar's PNG download, named after the chart) and `data_csv` the
chart's data as CSV."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NamedTuple

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from kneepoint.distribution import (
    CHOSEN_LIMIT,
    FLEET_THRESHOLD,
    MEDIAN,
    WORST_PREFIX,
    Fleet,
    Worse,
    distribution,
    tail_name,
    worst,
)

if TYPE_CHECKING:  # a type only: the figure builders load no store
    from kneepoint.timeline import Event

LAYOUT = {"height": 280, "margin": {"l": 10, "r": 10, "t": 40, "b": 10}}
CHANGES = "changes"  # the name of the markers' trace
TIME_AXIS = "time (UTC)"
HOVER = "x unified"


class Marker(NamedTuple):
    """A change on the timeline (kneepoint/timeline.py) as charts mark it."""

    at: pd.Timestamp
    kind: str
    text: str  # shown on hover

    @classmethod
    def of(cls, event: Event) -> Marker:
        """A timeline event as the app's pages and the weekly review mark it."""
        where = f" on {event.replica}" if event.replica else ""
        return cls(
            pd.Timestamp(event.at, unit="s", tz="UTC"),
            event.kind,
            f"{event.kind}{where}: {event.detail}",
        )


# The changes every time-series chart marks, set once per page run (app/changes.py).
# Or a function that reads them, called by the first chart that marks (a page without a
# time-series chart never reads the timeline).
MARKERS: ContextVar[tuple[Marker, ...] | Callable[[], tuple[Marker, ...]]] = ContextVar(
    "kneepoint_chart_markers", default=()
)
# The page's time range (the sidebar's), set with MARKERS: every time series spans it.
WINDOW: ContextVar[tuple[pd.Timestamp, pd.Timestamp] | None] = ContextVar(
    "kneepoint_chart_window", default=None
)


def axis_title(name: str, unit: str) -> str:
    """ "KV-cache occupancy (%)": the unit in parentheses, where the hover and a reader look."""
    return f"{name} ({unit})" if unit else name


def over_time(figure: go.Figure, times: pd.Series | None = None) -> go.Figure:
    """A time series' x axis: titled with its zone, one hover for all lines at a time, and
    the page's WINDOW (widened to `times` where they reach past it, as a fragment's later
    run does) so the page's charts share their x range."""
    figure.update_layout(hovermode=HOVER)
    figure.update_xaxes(title_text=TIME_AXIS)
    window = WINDOW.get()
    if window is not None:
        start, end = window
        if times is not None and len(times):
            start = min(start, pd.Timestamp(times.min()))
            end = max(end, pd.Timestamp(times.max()))
        figure.update_xaxes(range=[start, end])
    return figure


def vline(at: pd.Timestamp) -> dict[str, Any]:
    """The dotted vertical line a marker draws: figure.add_vline(x=at, line_dash="dot",
    line_width=1, line_color="slategray")'s shape on a one-plot figure, the plot's full
    height."""
    return {
        "type": "line",
        "x0": at,
        "x1": at,
        "xref": "x",
        "y0": 0,
        "y1": 1,
        "yref": "y domain",
        "line": {"color": "slategray", "dash": "dot", "width": 1},
    }


def marked(figure: go.Figure, start: pd.Timestamp | None = None) -> go.Figure:
    """Mark MARKERS (those from `start` on) with dotted vertical lines, and a triangle at the
    top of each whose hover shows what changed."""
    found = MARKERS.get()
    shown = [m for m in (found() if callable(found) else found) if start is None or m.at >= start]
    if not shown:
        return figure
    # The shapes add_vline would add, set at once: add_vline re-validates every shape so far
    # and looks for empty subplots on each call (quadratic; 0.1–0.4 s per chart of a week's
    # markers, most of a page run's time for the demo's Overview).
    figure.layout.shapes = (*figure.layout.shapes, *(vline(m.at) for m in shown))
    figure.add_trace(
        go.Scatter(
            x=[m.at for m in shown],
            y=[1.0] * len(shown),
            yaxis="y2",
            mode="markers",
            name=CHANGES,
            text=[m.text for m in shown],
            customdata=[m.kind for m in shown],
            hovertemplate="%{text}<extra></extra>",
            marker={"symbol": "triangle-down", "size": 10, "color": "slategray"},
            showlegend=False,
        )
    )
    figure.update_layout(
        yaxis2={"overlaying": "y", "range": [0, 1.04], "visible": False, "fixedrange": True}
    )
    return figure


def lines(
    frame: pd.DataFrame,
    y: str,
    title: str,
    color: str = "replica",
    percent: bool = False,
    unit: str = "",
    y_title: str | None = None,
    *,
    worse: Worse = "higher",
    chosen: Sequence[str] = (),
) -> go.Figure:
    """One line per `color` value of column `y` over time; the y axis is `y_title` (the
    title by default) with `unit` ("%" when `percent`: values are shares, shown as %).

    Up to FLEET_THRESHOLD series, each is drawn (only those in `chosen`, when any are).
    Above it, the fleet's distribution is drawn instead (fleet_figure): a browser draws a
    few traces, not one per replica; `worse` says which way the number is bad."""
    if color in frame and frame[color].nunique() > FLEET_THRESHOLD:
        figure = fleet_figure(frame, y, title, color, worse=worse, chosen=chosen)
    else:
        if chosen and color in frame:
            frame = frame[frame[color].isin(chosen)]
        figure = px.line(frame, x="time", y=y, color=color, title=title)
    times = frame["time"] if "time" in frame and len(frame) else None
    return _dressed(figure, times, y_title or title, "%" if percent else unit, percent)


def fleet_lines(
    fleet: Fleet,
    y: str,
    title: str,
    color: str = "replica",
    percent: bool = False,
    unit: str = "",
    y_title: str | None = None,
    *,
    worse: Worse = "higher",
    chosen: Sequence[str] = (),
) -> go.Figure:
    """lines() at fleet size from a distribution already computed (by the database:
    kneepoint/store/fleet_series.py): the same figure, axes and markers, drawn from `fleet`
    instead of every series' rows."""
    figure = drawn_fleet(fleet, y, title, color, worse=worse, chosen=chosen)
    times = pd.concat([fleet.spread["time"], fleet.rows["time"]], ignore_index=True)
    return _dressed(
        figure, times if len(times) else None, y_title or title, "%" if percent else unit, percent
    )


def _dressed(
    figure: go.Figure, times: pd.Series | None, y_title: str, unit: str, percent: bool
) -> go.Figure:
    """A time series' layout, y axis, shared x range and the page's markers."""
    figure.update_layout(**LAYOUT, legend_title_text="", yaxis_title=axis_title(y_title, unit))
    if percent:
        figure.update_yaxes(tickformat=".0%", rangemode="tozero")
    over_time(figure, times)
    return marked(figure, None if times is None else pd.Timestamp(times.min()))


def fleet_figure(
    frame: pd.DataFrame,
    y: str,
    title: str,
    color: str = "replica",
    *,
    worse: Worse = "higher",
    chosen: Sequence[str] = (),
) -> go.Figure:
    """The fleet's distribution of `y` over time (distribution: median and the bad-side
    tail), its WORST series named ("worst: replica-17"), and the series in `chosen` (the
    sidebar's, at most CHOSEN_LIMIT) as their own lines: a bounded number of traces at any
    fleet size. The title says how many series it sums up."""
    named = worst(frame, y, color, worse)
    own = set(named) | set(chosen)
    fleet = Fleet(
        size=frame.loc[pd.to_numeric(frame[y], errors="coerce").notna(), color].nunique(),
        spread=distribution(frame, y, color, worse),
        worst=named,
        rows=frame.loc[frame[color].isin(own), ["time", color, y]],
    )
    return drawn_fleet(fleet, y, title, color, worse=worse, chosen=chosen)


def drawn_fleet(
    fleet: Fleet,
    y: str,
    title: str,
    color: str = "replica",
    *,
    worse: Worse = "higher",
    chosen: Sequence[str] = (),
) -> go.Figure:
    """fleet_figure's traces from a Fleet: median, tail, the worst named, the chosen (at
    most CHOSEN_LIMIT, not already named) as their own lines."""
    noun = {"replica": "replicas", "gpu": "GPUs"}.get(color, f"{color}s")
    figure = go.Figure()
    figure.update_layout(title=f"{title}: fleet of {fleet.size:,} {noun}")
    spread = fleet.spread
    tail = tail_name(worse)
    figure.add_trace(
        go.Scatter(
            x=spread["time"], y=spread[MEDIAN], name=MEDIAN, mode="lines",
            line={"color": "#1f77b4", "width": 2},
        )
    )  # fmt: skip
    figure.add_trace(
        go.Scatter(
            x=spread["time"], y=spread[tail], name=tail, mode="lines",
            line={"color": "#1f77b4", "width": 1, "dash": "dash"},
        )
    )  # fmt: skip
    named = list(fleet.worst)
    own = [c for c in dict.fromkeys(chosen) if c not in named][:CHOSEN_LIMIT]
    reds = ("#b2182b", "#d6604d", "#f4a582")
    frame = fleet.rows
    for index, name in enumerate([*named, *own]):
        rows = frame[frame[color] == name].sort_values("time")
        is_worst = index < len(named)
        figure.add_trace(
            go.Scatter(
                x=rows["time"],
                y=rows[y],
                name=f"{WORST_PREFIX}{name}" if is_worst else name,
                mode="lines",
                line={"color": reds[index % len(reds)], "width": 1} if is_worst else {"width": 2},
            )
        )
    return figure


def events(figure: go.Figure, starts: list[pd.Timestamp], label: str) -> go.Figure:
    """Mark event start times (drops, storms) with vertical lines."""
    for start in starts:
        figure.add_vline(x=start, line_dash="dot", line_color="firebrick")
    if starts:
        figure.add_annotation(x=starts[0], y=1, yref="paper", text=label, showarrow=False)
    return figure


def bars(
    labels: list[str],
    values: list[float],
    title: str,
    percent: bool = False,
    x_title: str = "",
    y_title: str | None = None,
    unit: str = "",
) -> go.Figure:
    """One bar per label; axis titles as in lines()."""
    figure = go.Figure(go.Bar(x=labels, y=values, name=y_title or title))
    figure.update_layout(
        **LAYOUT,
        title=title,
        xaxis_title=x_title,
        yaxis_title=axis_title(y_title or title, "%" if percent else unit),
    )
    if percent:
        figure.update_yaxes(tickformat=".0%", range=[0, 1])
    return figure


def file_stem(figure: go.Figure) -> str:
    """The chart's title as a file name: "kneepoint-kv-cache-occupancy"."""
    title = figure.layout.title.text or "chart"
    slug = re.sub(r"[^a-z0-9]+", "-", re.sub(r"<[^>]*>", " ", title).lower()).strip("-")
    return f"kneepoint-{slug[:60].rstrip('-') or 'chart'}"


def config(figure: go.Figure) -> dict[str, Any]:
    """Plotly's config for st.plotly_chart: the modebar's camera saves a PNG named after the
    chart (at twice the size on screen), no Plotly logo, no selection tools."""
    return {
        "toImageButtonOptions": {"format": "png", "filename": file_stem(figure), "scale": 2},
        "displaylogo": False,
        "modeBarButtonsToRemove": ["select2d", "lasso2d"],
    }


def data_frame(figure: go.Figure) -> pd.DataFrame:
    """The figure's data, one row per point: the series, then x and y under their axes'
    titles (a trace on the right axis gets that axis's column), in the axis's unit (a share
    drawn as % is written in %). The timeline's markers are not data; lines drawn as shapes
    (a knee, an SLO) are in the chart only."""
    parts = []
    layout = figure.layout
    for trace in figure.data:
        if trace.name == CHANGES or trace.x is None or trace.y is None:
            continue
        x_axis = layout[_axis_key("x", trace.xaxis)]
        y_axis = layout[_axis_key("y", trace.yaxis)]
        x_name = x_axis.title.text or "x"
        y_name = y_axis.title.text or "y"
        y = pd.Series(list(trace.y), dtype="object")
        if (y_axis.tickformat or "").endswith("%"):  # shares drawn as %: the file says 43, not 0.43
            y = pd.to_numeric(y, errors="coerce") * 100
        parts.append(pd.DataFrame({"series": trace.name or "", x_name: list(trace.x), y_name: y}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["series"])


def data_csv(figure: go.Figure) -> str:
    out = io.StringIO()
    data_frame(figure).to_csv(out, index=False, date_format="%Y-%m-%dT%H:%M:%SZ")  # times: UTC
    return out.getvalue()


def _axis_key(letter: str, reference: str | None) -> str:
    """ "y2" → "yaxis2", None or "y" → "yaxis"."""
    suffix = (reference or letter)[1:]
    return f"{letter}axis{suffix}"
