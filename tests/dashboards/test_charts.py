"""Every figure builder: a title, axis titles with their unit, one hover for a time series'
lines, the page's time range, a PNG name, the data as CSV; the Knee chart per run's peak."""

from __future__ import annotations

import io
import re
import time

import pandas as pd
import plotly.graph_objects as go
import pytest

from dashboards import charts
from dashboards.charts import CHANGES, MARKERS, WINDOW, Marker, bars, lines
from dashboards.forecast import headroom
from dashboards.knee import SHARE, THROUGHPUT, knee_chart, normalize
from dashboards.overview import TITLES, replica_lines
from kneepoint.forecast import DAY, trend
from kneepoint.knee import tables
from kneepoint.knee.detect import assess
from kneepoint.knee.runs import Point, Run

UNIT = re.compile(r"\S.* \(.+\)$")  # "KV-cache occupancy (%)", "time (UTC)"


def series(minutes: int = 30, start: float | None = None) -> pd.DataFrame:
    start = time.time() - minutes * 60 if start is None else start
    rows = []
    for replica, scale in (("a", 1.0), ("b", 3.0)):
        for step in range(minutes):
            rows.append(
                {
                    "replica": replica,
                    "time": pd.Timestamp(start + step * 60, unit="s", tz="UTC"),
                    "kv_cache_occupancy": (step % 10) / 10,
                    "requests_running": step * scale,
                    "requests_waiting": step % 3,
                    "prompt_tokens_per_second": 100.0 * scale,
                    "generation_tokens_per_second": 50.0 * step * scale,
                    "preemptions_per_second": 0.0,
                }
            )
    return pd.DataFrame(rows)


def point(concurrency: int, throughput: float) -> Point:
    return Point(concurrency, throughput, ttft_p99_seconds=0.02 * concurrency)


def runs() -> list[Run]:
    """A big and a small replica's sweeps: the small one's throughput is a tenth."""
    big = {1: 60.0, 2: 118, 4: 230, 8: 440, 16: 800, 32: 1300, 64: 1420, 128: 1450}
    return [
        Run(
            label,
            "m",
            "vllm-bench",
            tuple(Point(c, t * k, ttft_p99_seconds=0.02 * c) for c, t in big.items()),
        )
        for label, k in (("big", 1.0), ("small", 0.1))
    ]


def knee_inputs() -> tuple[pd.DataFrame, pd.DataFrame]:
    assessed = [assess(run) for run in runs()]
    return tables.curves(assessed, "ttft_p99_seconds"), tables.markers(assessed)


def figures() -> dict[str, go.Figure]:
    frame = series()
    today = time.time() // DAY * DAY
    days = [today - n * DAY for n in range(10, 0, -1)]
    curves, markers = knee_inputs()
    built = {
        f"overview {column}": replica_lines(frame, column) for column in TITLES if column in frame
    }
    built |= {
        "lines percent": lines(frame, "kv_cache_occupancy", "KV-cache occupancy", percent=True),
        "lines unit": lines(frame, "requests_running", "Running", unit="seqs", y_title="running"),
        "bars": bars(
            ["position 0", "position 1"],
            [0.8, 0.5],
            "Acceptance",
            percent=True,
            x_title="draft position (token)",
        ),
        "headroom": headroom(trend("a", days, [10.0 + i for i in range(len(days))], 64)),
        "knee shared": knee_chart(curves, markers),
        "knee normalized": knee_chart(curves, markers, normalized=True),
    }
    return built


@pytest.mark.parametrize("name", list(figures()))
def test_every_figure_has_a_title_and_axis_titles_with_units(name: str) -> None:
    figure = figures()[name]
    layout = figure.layout
    assert layout.title.text, f"{name}: no title"
    for axis in ("xaxis", "yaxis"):
        title = layout[axis].title.text
        assert title and UNIT.match(title), f"{name}: {axis} title {title!r} has no (unit)"
    if any(trace.yaxis == "y2" and trace.name != CHANGES for trace in figure.data):
        assert UNIT.match(layout.yaxis2.title.text or ""), f"{name}: right axis has no unit"
    assert layout.hovermode == "x unified" or name == "bars", f"{name}: hover per line"


def test_a_share_reads_as_percent_on_its_axis_and_in_its_csv() -> None:
    frame = series()
    figure = lines(frame, "kv_cache_occupancy", "KV-cache occupancy", percent=True)
    assert figure.layout.yaxis.title.text.endswith("(%)")
    assert figure.layout.yaxis.tickformat.endswith("%")
    written = pd.read_csv(io.StringIO(charts.data_csv(figure)))
    assert list(written.columns) == ["series", "time (UTC)", "KV-cache occupancy (%)"]
    assert sorted(written["series"].unique()) == sorted(frame["replica"].unique())
    assert written["KV-cache occupancy (%)"].tolist() == pytest.approx(
        (frame["kv_cache_occupancy"] * 100).tolist()
    )


def test_the_csv_leaves_out_the_timeline_markers_and_names_the_right_axis() -> None:
    frame = series()
    token = MARKERS.set((Marker(pd.Timestamp(frame["time"].iloc[5]), "restart", "restart on a"),))
    try:
        figure = lines(frame, "requests_running", "Running", unit="seqs")
    finally:
        MARKERS.reset(token)
    assert CHANGES in [trace.name for trace in figure.data]
    assert CHANGES not in set(charts.data_frame(figure)["series"])
    curves, markers = knee_inputs()
    knee = charts.data_frame(knee_chart(curves, markers))
    latency = knee.dropna(subset=["TTFT p99 (s)"])
    assert set(latency["series"]) == {"big: TTFT p99", "small: TTFT p99"}
    assert latency["throughput (output tok/s)"].isna().all()


def test_the_png_is_named_after_the_chart() -> None:
    figure = lines(series(), "requests_running", "Running sequences", unit="seqs")
    options = charts.config(figure)["toImageButtonOptions"]
    assert options["format"] == "png"
    assert options["filename"] == charts.file_stem(figure)
    assert "running-sequences" in options["filename"]


def test_time_series_share_the_page_s_window() -> None:
    """Two charts whose data start and end at different times span the page's range."""
    now = time.time()
    early = series(10, start=now - 3600)
    late = series(10, start=now - 900)
    start = pd.Timestamp(now - 4000, unit="s", tz="UTC")
    end = pd.Timestamp(now, unit="s", tz="UTC")
    token = WINDOW.set((start, end))
    try:
        ranges = [
            tuple(
                pd.Timestamp(x)
                for x in lines(f, "requests_running", "R", unit="seqs").layout.xaxis.range
            )
            for f in (early, late)
        ]
    finally:
        WINDOW.reset(token)
    assert ranges[0] == ranges[1] == (start, end)
    # Data past the window (a fragment's later run) widens it rather than being cut off.
    token = WINDOW.set((start, pd.Timestamp(now - 1200, unit="s", tz="UTC")))
    try:
        reach = lines(late, "requests_running", "R", unit="seqs").layout.xaxis.range[1]
    finally:
        WINDOW.reset(token)
    assert pd.Timestamp(reach) == late["time"].max()


def test_normalized_runs_peak_at_100_percent_each() -> None:
    curves, markers = knee_inputs()
    shared, marked = normalize(curves, markers)
    for run, rows in shared.groupby("run"):
        assert rows[SHARE].max() == pytest.approx(1.0), run
        assert rows[SHARE].tolist() == pytest.approx(
            (rows[THROUGHPUT] / rows[THROUGHPUT].max()).tolist()
        )
    figure = knee_chart(curves, markers, normalized=True)
    peaks = {t.name: max(t.y) for t in figure.data if t.name.endswith("% of peak")}
    assert set(peaks) == {"big: % of peak", "small: % of peak"}
    assert all(p == pytest.approx(1.0) for p in peaks.values())
    # On the shared axis the small run stays under a tenth of the big one's peak; here its
    # knee marker sits as high as the big run's does.
    knees = marked[marked["kind"] == "knee"].set_index("run")[SHARE]
    assert knees["small"] == pytest.approx(knees["big"])
    top = {t.name: max(t.y) for t in knee_chart(curves, markers).data if t.name.endswith("tok/s")}
    assert top["small: tok/s"] < 0.2 * top["big: tok/s"]
