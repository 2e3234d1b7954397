"""app/plots.py: a chart is drawn in SVG, never WebGL (software WebGL without a GPU is slow)."""

from __future__ import annotations

import json

import pandas as pd
import plotly.express as px
from streamlit.testing.v1 import AppTest

from app.plots import in_svg


def many_points() -> pd.DataFrame:
    """4 replicas × 321 points: above the 1,000 at which plotly.express draws in WebGL."""
    return pd.DataFrame(
        {
            "time": list(range(321)) * 4,
            "value": [float(i % 17) for i in range(321 * 4)],
            "replica": [name for name in "abcd" for _ in range(321)],
        }
    )


def test_webgl_lines_become_the_same_svg_lines() -> None:
    figure = px.line(many_points(), x="time", y="value", color="replica", title="KV")
    assert {trace.type for trace in figure.data} == {"scattergl"}
    drawn = in_svg(figure)
    assert [trace.type for trace in drawn.data] == ["scatter"] * 4
    # Everything else the browser gets is the same: points, names, colours, layout.
    sent, shown = json.loads(figure.to_json()), json.loads(drawn.to_json())
    for trace in sent["data"]:
        trace["type"] = "scatter"
    assert shown == sent
    assert {trace.type for trace in figure.data} == {"scattergl"}  # the page's figure kept


def test_a_page_s_chart_reaches_the_browser_in_svg() -> None:
    def page() -> None:
        import plotly.express as px

        from app.plots import chart
        from tests.app.test_plots import many_points

        chart(px.line(many_points(), x="time", y="value", color="replica", title="KV"))

    app = AppTest.from_function(page).run()
    assert not app.exception, [e.value for e in app.exception]
    (shown,) = app.get("plotly_chart")
    assert [trace["type"] for trace in json.loads(shown.proto.spec)["data"]] == ["scatter"] * 4
