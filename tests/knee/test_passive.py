"""The passive knee from production rows, worked out by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kneepoint.knee.passive import ladder_bin, production_curve
from kneepoint.samples import Histogram

BOUNDS = (0.1, 0.5, math.inf)


def hist(le_01: float, le_05: float, total: float, seconds: float) -> Histogram:
    return Histogram(BOUNDS, (le_01, le_05, total), seconds)


def test_intervals_bin_by_concurrency_with_time_weighted_throughput_and_p99() -> None:
    rows = pd.DataFrame(
        {
            "ts": [0.0, 10.0, 20.0, 30.0, 40.0],
            "requests_running": [1.0, 1.0, 4.0, 4.0, 0.0],
            "generation_tokens": [0.0, 300.0, 700.0, 1100.0, 1150.0],
        }
    )
    ttft = [
        hist(0, 0, 0, 0),
        hist(5, 5, 5, 0.2),  # 5 fast first tokens at concurrency 1
        hist(5, 5, 5, 0.2),
        hist(5, 15, 15, 3.0),  # 10 between 0.1 s and 0.5 s at concurrency 4
        hist(5, 15, 15, 3.0),
    ]
    curve = production_curve(rows, ttft)
    by_bin = {p.concurrency: p for p in curve.points}
    # Interval means: 1 → bin 1; 2.5 → bin 2; 4 → bin 4; (4 + 0) / 2 = 2 → bin 2.
    assert sorted(by_bin) == [1, 2, 4]
    assert by_bin[1].output_tokens_per_second == pytest.approx(300 / 10)
    assert by_bin[2].output_tokens_per_second == pytest.approx((400 + 50) / 20)
    assert by_bin[4].output_tokens_per_second == pytest.approx(400 / 10)
    assert by_bin[2].seconds == 20
    # Bin 1: all 5 in the first bucket: p99 = 0.1 × 0.99 (PromQL interpolation from 0).
    assert by_bin[1].ttft_p99_seconds == pytest.approx(0.1 * 0.99)
    # Bin 4: 10 in (0.1, 0.5]: rank 9.9 → 0.1 + 0.4 × 9.9 / 10.
    assert by_bin[4].ttft_p99_seconds == pytest.approx(0.1 + 0.4 * 0.99)
    assert by_bin[2].ttft_p99_seconds is None  # no first token happened there
    assert curve.peak_concurrency == 4
    assert curve.headroom(32) == 28
    assert curve.headroom(None) is None


def test_a_counter_reset_counts_the_new_value_and_idle_time_is_left_out() -> None:
    rows = pd.DataFrame(
        {
            "ts": [0.0, 10.0, 20.0, 30.0],
            "requests_running": [0.0, 0.0, 8.0, 8.0],
            "generation_tokens": [5000.0, 5000.0, 200.0, 1000.0],  # restart before ts 20
            "requests_running_peak": [0.0, 0.0, 8.0, 11.0],  # a rollup kept a higher peak
        }
    )
    curve = production_curve(rows, [None] * 4)
    assert [p.concurrency for p in curve.points] == [4, 8]
    assert curve.points[0].output_tokens_per_second == pytest.approx(200 / 10)
    assert curve.points[1].output_tokens_per_second == pytest.approx(800 / 10)
    assert curve.peak_concurrency == 11


def test_ladder_bins() -> None:
    assert [ladder_bin(c) for c in (0, 0.4, 0.6, 1, 1.4, 1.5, 3, 5.9, 6, 100)] == [
        None,
        None,
        1,
        1,
        1,
        2,
        4,
        8,
        8,
        128,
    ]
