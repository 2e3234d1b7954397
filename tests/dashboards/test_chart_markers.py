"""The timeline's markers on a time-series chart: the same dotted lines figure.add_vline draws,
set in one step (add_vline re-validated every shape so far on each call: a week of markers
was most of the demo's Overview run)."""

from __future__ import annotations

import json

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import pytest
from plotly.graph_objs.layout import Shape

from dashboards.charts import MARKERS, WINDOW, Marker, lines, marked

START = pd.Timestamp("2026-12-01T00:00:00Z")


def frame(replicas: int = 3, points: int = 120) -> pd.DataFrame:
    times = pd.date_range(START, periods=points, freq="1min")
    return pd.concat(
        [
            pd.DataFrame(
                {"time": times, "value": [float(i * (r + 1)) for i in range(points)]}
            ).assign(replica=f"replica-{r}")
            for r in range(replicas)
        ],
        ignore_index=True,
    )


def markers(count: int) -> tuple[Marker, ...]:
    return tuple(
        Marker(START + pd.Timedelta(minutes=3 * i + 1), "restart", f"restart {i}")
        for i in range(count)
    )


def by_add_vline(figure: go.Figure, shown: tuple[Marker, ...]) -> go.Figure:
    """What marked() drew before (8b7a7b6): one add_vline per marker, then the hover trace."""
    for m in shown:
        figure.add_vline(x=m.at, line_dash="dot", line_width=1, line_color="slategray")
    figure.add_trace(
        go.Scatter(
            x=[m.at for m in shown],
            y=[1.0] * len(shown),
            yaxis="y2",
            mode="markers",
            name="changes",
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


def with_markers(figure: go.Figure, shown: tuple[Marker, ...]) -> go.Figure:
    token = MARKERS.set(shown)
    try:
        return marked(figure)
    finally:
        MARKERS.reset(token)


def spec(figure: go.Figure) -> object:
    return json.loads(figure.to_json())


@pytest.mark.parametrize(
    "make",
    [
        lambda: px.line(frame(), x="time", y="value", color="replica"),  # a small fleet's chart
        lambda: go.Figure(go.Scatter(x=frame(1)["time"], y=frame(1)["value"])),  # fleet_figure
        go.Figure,  # no data yet
    ],
    ids=["px-line", "scatter", "empty"],
)
def test_markers_draw_exactly_what_add_vline_drew(make: object) -> None:
    assert callable(make)
    shown = markers(12)
    drawn = with_markers(make(), shown)
    old = make()
    old.add_shape(type="rect", x0=0, x1=1, y0=0, y1=1)  # a shape already there is kept
    new = make()
    new.add_shape(type="rect", x0=0, x1=1, y0=0, y1=1)
    assert spec(with_markers(new, shown)) == spec(by_add_vline(old, shown))
    assert len(drawn.layout.shapes) == len(shown)
    # The hover trace names each change, one marker per change.
    hover = next(t for t in drawn.data if t.name == "changes")
    assert hover.text == tuple(m.text for m in shown)


def test_a_chart_s_markers_cost_one_shape_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Marking N changes builds about N shapes, not N²/2 (add_vline rebuilt every shape so
    far on each call: 60 markers made 1,830 shapes)."""
    built = []
    original = Shape.__init__

    def counted(self: Shape, *args: object, **kwargs: object) -> None:
        built.append(1)
        original(self, *args, **kwargs)

    shown = markers(60)
    monkeypatch.setattr(Shape, "__init__", counted)
    window = WINDOW.set((START, START + pd.Timedelta(hours=4)))
    token = MARKERS.set(shown)
    try:
        figure = lines(frame(points=240), "value", "Value", unit="x")
    finally:
        MARKERS.reset(token)
        WINDOW.reset(window)
    assert len(figure.layout.shapes) == len(shown)
    assert len(built) <= 2 * len(shown), len(built)
