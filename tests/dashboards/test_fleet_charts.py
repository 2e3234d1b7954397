"""Time-series charts at fleet size (dashboards/charts.py lines, fleet_figure): above
FLEET_THRESHOLD series a figure draws the fleet's median, its bad-side tail and the worst few
named, never one trace per replica; a small fleet's figure is one line per replica as before."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from app.tables import page_rows
from dashboards.charts import CHANGES, MARKERS, Marker, data_frame, lines
from dashboards.overview import replica_lines
from kneepoint.distribution import (
    CHOSEN_LIMIT,
    FLEET_THRESHOLD,
    MAX_POINTS,
    MEDIAN,
    WORST,
    distribution,
)

START = pd.Timestamp("2026-11-30 10:00", tz="UTC")
MOST_TRACES = 2 + WORST  # median, tail, the worst named


def fleet(replicas: int, points: int = 60, seed: int = 7, step: str = "1min") -> pd.DataFrame:
    """`replicas` series over `points` times (aligned), random values, each replica with its
    own level so the worst are well apart; a few values missing."""
    rng = np.random.default_rng(seed)
    names = [f"replica-{i}" for i in range(replicas)]
    times = pd.date_range(START, periods=points, freq=step)
    level = np.repeat(np.linspace(0.0, 1.0, replicas), points)
    values = level * 0.8 + rng.random(replicas * points) * 0.2
    frame = pd.DataFrame(
        {
            "replica": np.repeat(names, points),
            "time": np.tile(times, replicas),
            "kv_cache_occupancy": values,
            "generation_tokens_per_second": values * 1000,
        }
    )
    frame.loc[frame.sample(frac=0.01, random_state=seed).index, "kv_cache_occupancy"] = np.nan
    return frame


def trace(figure: go.Figure, name: str) -> Any:
    """The figure's one trace called `name`."""
    (found,) = [t for t in figure.data if t.name == name]
    return found


def test_a_thousand_replicas_draw_a_bounded_number_of_traces() -> None:
    frame = fleet(1000)
    figure = lines(frame, "kv_cache_occupancy", "KV-cache occupancy", percent=True)
    names = [t.name for t in figure.data]
    assert len(figure.data) <= MOST_TRACES, names
    assert names[:2] == [MEDIAN, "fleet p95"]
    assert "fleet of 1,000 replicas" in figure.layout.title.text
    # The axes and their units are those of a small fleet's chart.
    assert figure.layout.yaxis.title.text == "KV-cache occupancy (%)"
    assert figure.layout.xaxis.title.text == "time (UTC)"


def test_the_median_and_p95_are_pandas_quantiles_of_the_same_data() -> None:
    frame = fleet(1000)
    figure = lines(frame, "kv_cache_occupancy", "KV-cache occupancy", percent=True)
    by_time = frame.groupby("time")["kv_cache_occupancy"]
    expected_median = by_time.quantile(0.5)
    expected_p95 = by_time.quantile(0.95)
    median, p95 = trace(figure, MEDIAN), trace(figure, "fleet p95")
    assert list(pd.to_datetime(list(median.x), utc=True)) == list(expected_median.index)
    np.testing.assert_allclose(list(median.y), expected_median.to_numpy(), rtol=1e-12)
    np.testing.assert_allclose(list(p95.y), expected_p95.to_numpy(), rtol=1e-12)


def test_the_worst_replicas_are_named_by_the_metric_direction() -> None:
    frame = fleet(1000)
    means = frame.groupby("replica")["kv_cache_occupancy"].mean()
    high = lines(frame, "kv_cache_occupancy", "KV-cache occupancy", percent=True)
    assert [t.name for t in high.data[2:]] == [
        f"worst: {n}" for n in means.sort_values(ascending=False).index[:WORST]
    ]
    # Where low is bad (a hit rate, throughput) the tail is p5 and the worst are the lowest.
    low = lines(frame, "kv_cache_occupancy", "Hit rate", percent=True, worse="lower")
    assert [t.name for t in low.data] == [
        MEDIAN,
        "fleet p5",
        *(f"worst: {n}" for n in means.sort_values().index[:WORST]),
    ]
    np.testing.assert_allclose(
        list(trace(low, "fleet p5").y),
        frame.groupby("time")["kv_cache_occupancy"].quantile(0.05).to_numpy(),
    )
    # A named replica's line is its own data, point for point.
    worst = means.idxmax()
    own = frame[frame.replica == worst].sort_values("time")
    drawn = trace(high, f"worst: {worst}")
    np.testing.assert_array_equal(
        np.array(list(drawn.y), dtype=float), own["kv_cache_occupancy"].to_numpy()
    )


def test_replicas_chosen_in_the_sidebar_are_drawn_on_top_of_the_fleet() -> None:
    frame = fleet(1000)
    figure = lines(frame, "kv_cache_occupancy", "KV", chosen=("replica-17", "replica-400"))
    names = [t.name for t in figure.data]
    assert names[-2:] == ["replica-17", "replica-400"]
    assert len(figure.data) <= MOST_TRACES + 2
    # The median is still the whole fleet's, not the chosen ones'.
    np.testing.assert_allclose(
        list(trace(figure, MEDIAN).y),
        frame.groupby("time")["kv_cache_occupancy"].quantile(0.5).to_numpy(),
    )
    # Choosing the whole fleet draws CHOSEN_LIMIT of them, not a thousand lines.
    everyone = lines(frame, "kv_cache_occupancy", "KV", chosen=tuple(frame.replica.unique()))
    assert len(everyone.data) <= MOST_TRACES + CHOSEN_LIMIT


def test_markers_add_one_trace_whatever_the_fleet_size() -> None:
    frame = fleet(1000)
    token = MARKERS.set((Marker(START + pd.Timedelta("5min"), "deploy", "deploy: v2"),))
    try:
        figure = lines(frame, "kv_cache_occupancy", "KV")
    finally:
        MARKERS.reset(token)
    assert [t.name for t in figure.data].count(CHANGES) == 1
    assert len(figure.data) <= MOST_TRACES + 1


def test_four_replicas_are_drawn_one_line_each_as_before() -> None:
    frame = fleet(4)
    figure = lines(frame, "kv_cache_occupancy", "KV-cache occupancy", percent=True)
    assert sorted(t.name for t in figure.data) == [f"replica-{i}" for i in range(4)]
    assert figure.layout.title.text == "KV-cache occupancy"
    # Chosen replicas of a small fleet: only theirs, as the pages filtered before.
    one = lines(frame, "kv_cache_occupancy", "KV", chosen=("replica-2",))
    assert [t.name for t in one.data] == ["replica-2"]


def test_the_threshold_is_where_it_switches() -> None:
    at = lines(fleet(FLEET_THRESHOLD), "kv_cache_occupancy", "KV")
    assert len(at.data) == FLEET_THRESHOLD
    above = lines(fleet(FLEET_THRESHOLD + 1), "kv_cache_occupancy", "KV")
    assert trace(above, MEDIAN) is not None and len(above.data) == MOST_TRACES


def test_gpu_charts_sum_up_gpus_too() -> None:
    frame = fleet(64).rename(columns={"replica": "gpu"})
    frame["gpu"] = "node-" + frame["gpu"].str.removeprefix("replica-") + "/0"
    figure = lines(frame, "kv_cache_occupancy", "GPU busy", color="gpu", percent=True)
    assert len(figure.data) == MOST_TRACES
    assert "fleet of 64 GPUs" in figure.layout.title.text


def test_the_overview_draws_low_throughput_as_the_bad_tail() -> None:
    frame = fleet(300)
    figure = replica_lines(frame, "generation_tokens_per_second")
    assert [t.name for t in figure.data][:2] == [MEDIAN, "fleet p5"]
    assert len(figure.data) == MOST_TRACES
    occupancy = replica_lines(frame, "kv_cache_occupancy", chosen=("replica-3",))
    assert [t.name for t in occupancy.data][1] == "fleet p95"
    assert [t.name for t in occupancy.data][-1] == "replica-3"


def test_replicas_scraped_at_different_instants_share_a_bucket() -> None:
    """1,000 replicas each scraped at its own offset within 15 s: one point per scrape round
    for the fleet, not one per replica's instant (a median of one value is no median)."""
    frame = fleet(1000, points=40, step="15s")
    offsets = pd.to_timedelta(frame.replica.str.removeprefix("replica-").astype(int) % 15, "s")
    frame["time"] = frame["time"] + offsets
    spread = distribution(frame, "kv_cache_occupancy", "replica")
    assert len(spread) <= 41  # 40 rounds, the last replicas' reaching into one bucket more
    per_bucket = frame.assign(bucket=frame.time.dt.floor("15s")).groupby("bucket")
    median = per_bucket["kv_cache_occupancy"].quantile(0.5)
    np.testing.assert_allclose(spread[MEDIAN].to_numpy(), median.to_numpy())


def test_a_long_range_is_at_most_max_points_wide() -> None:
    frame = fleet(20, points=7 * 24 * 60)  # a week of minutes
    spread = distribution(frame, "kv_cache_occupancy", "replica")
    assert len(spread) <= MAX_POINTS


def test_the_csv_names_the_fleet_series() -> None:
    figure = lines(fleet(100), "kv_cache_occupancy", "KV-cache occupancy", percent=True)
    series = set(data_frame(figure)["series"])
    assert {MEDIAN, "fleet p95"} <= series
    assert len(series) == MOST_TRACES


@pytest.mark.parametrize(
    ("query", "number", "caption", "first_name"),
    [
        ("", 1, "rows 1–50 of 1,000", "replica-0"),
        ("", 20, "rows 951–1,000 of 1,000", "replica-950"),
        ("", 99, "rows 951–1,000 of 1,000", "replica-950"),  # past the end: the last page
        ("REPLICA-99", 1, "rows 1–11 of 11 matching “REPLICA-99” (1,000 in all)", "replica-99"),
        ("nobody", 1, "no rows match “nobody” (1,000 in all)", None),
    ],
)
def test_a_long_table_sends_a_page_of_rows(
    query: str, number: int, caption: str, first_name: str | None
) -> None:
    shown = pd.DataFrame(
        {"Replica": [f"replica-{i}" for i in range(1000)], "KV (%)": np.arange(1000.0)}
    )
    page = page_rows(shown, query=query, number=number, size=50)
    assert page.caption(query) == caption
    assert len(page.rows) <= 50
    assert (page.rows["Replica"].iloc[0] if len(page.rows) else None) == first_name
