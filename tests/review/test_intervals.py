"""The weekly review's admission-cap evidence per stored interval (`weekly._intervals`) read
from plain lists gives exactly what the per-row `.iloc` reading gave (kept here as the
reference): resets, missing values, no requests, a histogram layout change, integer columns."""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest

from kneepoint.derived.latency import histogram_quantile, window_histogram
from kneepoint.samples import Histogram
from kneepoint.store import queries
from kneepoint.store.codec import encode_histogram
from review import weekly

LAYOUTS = {1: (0.01, 0.05, 0.1, math.inf), 2: (0.02, 0.1, math.inf)}


def reference(frame: pd.DataFrame) -> pd.DataFrame:
    """The code before lists: one `.iloc` per value per row."""
    if len(frame) < 2:
        return pd.DataFrame(columns=["ts", "mean_prompt_tokens", "itl_p99_seconds"])
    itl = queries.histograms(frame.hist_itl, LAYOUTS)
    rows = []
    for index in range(1, len(frame)):
        count = (
            frame.request_prompt_tokens_count.iloc[index]
            - frame.request_prompt_tokens_count.iloc[index - 1]
        )
        tokens = (
            frame.request_prompt_tokens_sum.iloc[index]
            - frame.request_prompt_tokens_sum.iloc[index - 1]
        )
        histogram = window_histogram([itl[index - 1], itl[index]])
        rows.append(
            {
                "ts": float(frame.ts.iloc[index]),
                "mean_prompt_tokens": tokens / count
                if count and count > 0 and tokens >= 0
                else None,
                "itl_p99_seconds": histogram_quantile(0.99, histogram),
            }
        )
    return pd.DataFrame(rows)


def replica_rows(seed: int, n: int, integers: bool) -> pd.DataFrame:
    rng = random.Random(seed)
    count, tokens, buckets, layout = 0.0, 0.0, [0.0, 0.0, 0.0, 0.0], 1
    rows = []
    for i in range(n):
        if rng.random() < 0.08:  # a restart: every counter from zero
            count, tokens, buckets = 0.0, 0.0, [0.0] * len(LAYOUTS[layout])
        if rng.random() < 0.03:  # the engine's buckets changed
            layout = 2 if layout == 1 else 1
            buckets = [0.0] * len(LAYOUTS[layout])
        new = rng.choice([0, 0, 1, 5, 40])
        count += new
        tokens += new * rng.choice([100, 2000, 7000])
        for _ in range(new * 3):
            buckets[rng.randrange(len(buckets))] += 1
        cumulative = [sum(buckets[: k + 1]) for k in range(len(buckets))]
        shape = Histogram(LAYOUTS[layout], tuple(cumulative), cumulative[-1])
        hist = encode_histogram(layout, shape)
        missing = rng.random() < 0.05
        rows.append(
            {
                "ts": 1_000.0 + 15 * i,
                "hist_itl": None if rng.random() < 0.05 else hist,
                "request_prompt_tokens_sum": None if missing else tokens,
                "request_prompt_tokens_count": None if missing else count,
            }
        )
    frame = pd.DataFrame(rows)
    if integers:  # as a column with no missing value may come back from the database
        frame = frame.dropna(subset=["request_prompt_tokens_count"]).reset_index(drop=True)
        for column in ("request_prompt_tokens_sum", "request_prompt_tokens_count"):
            frame[column] = frame[column].astype("int64")
    return frame


@pytest.mark.parametrize("integers", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_intervals_equal_the_per_row_reading(seed: int, integers: bool) -> None:
    frame = replica_rows(seed, 120, integers)
    found = weekly._intervals(frame, LAYOUTS)
    expected = reference(frame)
    pd.testing.assert_frame_equal(found, expected)
    assert found.mean_prompt_tokens.notna().any() and found.itl_p99_seconds.notna().any()


@pytest.mark.parametrize("n", [0, 1, 2])
def test_intervals_of_too_few_rows(n: int) -> None:
    frame = replica_rows(7, n, False)
    pd.testing.assert_frame_equal(weekly._intervals(frame, LAYOUTS), reference(frame))
