"""The load a stored window gives the replay, from buckets made up here (pure functions)."""

from __future__ import annotations

import numpy as np
import pytest

from kneepoint.whatif import WhatIfError, load_of
from kneepoint.whatif.history import Bucket, History, weighted_quantile
from kneepoint.whatif.replay import THINK_SECONDS

CAPACITY = 40_000


def bucket(rate: float, running: float, kv: float, e2e: float | None, hit: float) -> Bucket:
    return Bucket(
        start=0.0,
        seconds=900.0,
        requests_per_second=rate,
        prompt_tokens_mean=3000.0,
        output_tokens_mean=200.0,
        hit_rate=hit,
        generation_tokens_per_second=rate * 200.0,
        prompt_tokens_per_second=rate * 3000.0,
        computed_prompt_tokens_per_second=rate * 3000.0 * (1 - hit),
        preemptions=0.0,
        kv_cache_usage=kv,
        running=running,
        waiting=0.0,
        saturated_seconds=0.0,
        itl_mean_seconds=0.03,
        e2e_mean_seconds=e2e,
    )


def test_sessions_follow_littles_law_over_latency_and_think_time() -> None:
    history = History(
        "r", 0.0, 2700.0, [bucket(0.5, 2, 0.1, 4.0, 0.8), bucket(1.0, 5, 0.3, 6.0, 0.5)]
    )
    load = load_of(history)
    assert load.sessions_at(1.0) == pytest.approx(1.0 * (6.0 + THINK_SECONDS))
    assert load.sessions_at(0.5) == pytest.approx(0.5 * (4.0 + THINK_SECONDS))
    # The light-load hit rate is the lowest-rate third's: where the cache is least pressed.
    assert load.light == (0.5, 0.8)
    assert load.prompt_tokens_mean == pytest.approx(3000.0)


def test_the_common_prefix_is_what_running_requests_do_not_hold_twice() -> None:
    # b requests of 3100 tokens (prompt and half the output) sharing C = 600 hold
    # b·3100 − (b − 1)·600.
    common = 600.0
    held = [(b, (b * 3100.0 - (b - 1) * common) / CAPACITY) for b in (2.0, 4.0, 8.0)]
    history = History(
        "r", 0.0, 2700.0, [bucket(b / 4, b, kv, 5.0, 0.5) for b, kv in held], {}, CAPACITY
    )
    assert load_of(history).common_share == pytest.approx(common / 3000.0)


def test_without_e2e_latency_sessions_only_think_and_without_requests_nothing_replays() -> None:
    load = load_of(History("r", 0.0, 900.0, [bucket(1.0, 2, 0.1, None, 0.3)]))
    assert load.latency == ()
    assert load.sessions_at(1.0) == pytest.approx(THINK_SECONDS)
    with pytest.raises(WhatIfError, match="no request"):
        load_of(History("r", 0.0, 900.0, [bucket(0.0, 0, 0.0, None, 0.0)]))


def test_weighted_quantile_weighs_by_time() -> None:
    assert weighted_quantile([0.1, 0.9], [95.0, 5.0], 0.95) == 0.1
    assert weighted_quantile([0.1, 0.9], [94.0, 6.0], 0.95) == 0.9
    assert weighted_quantile([], [], 0.5) is None


def test_weighted_quantile_is_the_running_weight_over_the_sorted_pairs() -> None:
    """The numpy form against its definition, on ties, zero weights and a NaN."""

    def by_definition(values: list[float], weights: list[float], q: float) -> float | None:
        pairs = sorted((v, w) for v, w in zip(values, weights, strict=True) if w > 0 and v == v)
        total = sum(w for _, w in pairs)
        running = 0.0
        for value, weight in pairs:
            running += weight
            if running >= q * total - 1e-12:
                return value
        return pairs[-1][0] if pairs else None

    rng = np.random.default_rng(7)
    for _ in range(200):
        values = rng.integers(0, 20, size=50).astype(float) / 7  # ties
        weights = rng.choice([0.0, 0.1, 1.0, 3.7], size=50)
        values[3] = float("nan")
        for q in (0.0, 0.5, 0.95, 0.99, 1.0):
            expected = by_definition(values.tolist(), weights.tolist(), q)
            assert weighted_quantile(values, weights, q) == expected
            assert weighted_quantile(values.tolist(), weights.tolist(), q) == expected
