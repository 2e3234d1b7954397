"""The saturation verdict (kneepoint/derived/saturation.py) on hand-made windows: each
reason alone, a light replica, and what cannot be judged."""

from __future__ import annotations

from kneepoint.derived import saturation
from kneepoint.derived.saturation import LoadPoint, verdict
from kneepoint.samples import Histogram

BOUNDS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, float("inf"))


def steps(per_bucket: dict[float, float]) -> Histogram:
    """A tokens-per-step histogram with these step counts per bucket (upper bound)."""
    counts, running = [], 0.0
    for bound in BOUNDS:
        running += per_bucket.get(bound, 0.0)
        counts.append(running)
    return Histogram(BOUNDS, tuple(counts), 0.0)


def series(kv: list[float], waiting: list[float], running: list[float]) -> list[LoadPoint]:
    return [
        LoadPoint(15.0 * i, k, w, r)
        for i, (k, w, r) in enumerate(zip(kv, waiting, running, strict=True))
    ]


def ttft(count: float, mean: float) -> Histogram:
    return Histogram((0.1, 1.0, float("inf")), (0.0, count, count), count * mean)


LIGHT = series([0.05] * 20, [0.0] * 20, [1.0, 0.0] * 10)


def reasons(result: saturation.Saturation) -> list[str]:
    return [r["reason"] for r in result["reasons"]]


def test_a_light_replica_is_not_saturated() -> None:
    decode = steps({1.0: 150, 16.0: 10})  # one short prompt, then one token a step
    parts = [ttft(5, 0.05)] * 4
    result = verdict(LIGHT, decode, None, parts, 0.0)
    assert result["saturated"] is False
    assert result["reasons"] == [] and result["unjudged"] == {}


def test_kv_full_needs_a_share_of_the_window_not_one_scrape() -> None:
    spike = series([0.2] * 19 + [0.97], [0.0] * 20, [1.0] * 20)
    assert verdict(spike)["saturated"] is False
    # A third of the window above 90 %: 7 of 20 samples, each weighing its share of time.
    full = series([0.5] * 13 + [0.95] * 7, [0.0] * 20, [1.0] * 20)
    result = verdict(full)
    assert reasons(result) == ["kv_full"]
    assert 0.25 <= result["reasons"][0]["value"] <= 7 / 19
    assert "peak 95%" in result["reasons"][0]["evidence"]


def test_a_standing_queue_is_saturation_and_a_spike_is_not() -> None:
    # Requests wait in 3 of 20 samples: a burst that drained.
    burst = series([0.3] * 20, [0.0] * 8 + [4.0, 6.0, 2.0] + [0.0] * 9, [2.0] * 20)
    assert "queue_growing" not in reasons(verdict(burst))
    standing = series([0.3] * 20, [1.0, 2.0] * 10, [2.0] * 20)  # never drains
    result = verdict(standing)
    assert reasons(result) == ["queue_growing"]
    assert result["reasons"][0]["value"] == 1.0
    draining = series([0.3] * 20, [float(20 - i) for i in range(20)], [2.0] * 20)
    assert "queue_growing" not in reasons(verdict(draining))  # present but falling
    # Standing at 2-3 with its fit dipping by less than a request: still not draining.
    noisy = series([0.3] * 20, [3.0, 2.0] * 8 + [2.0] * 4, [2.0] * 20)
    result = verdict(noisy)
    assert reasons(result) == ["queue_growing"]
    assert "fitted trend -0." in result["reasons"][0]["evidence"]
    # Falling by two requests over the window: draining.
    ebbing = series([0.3] * 20, [3.0] * 10 + [1.0] * 10, [2.0] * 20)
    assert "queue_growing" not in reasons(verdict(ebbing))


def test_a_queue_building_late_in_the_window_is_growing() -> None:
    building = series([0.3] * 20, [0.0] * 14 + [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2.0] * 20)
    result = verdict(building)
    assert reasons(result) == ["queue_growing"]
    assert "+" in result["reasons"][0]["evidence"]


def test_token_budget_full_against_a_configured_budget() -> None:
    prefill = steps({1.0: 40, 1024.0: 10, 2048.0: 60})  # 60 of 110 steps in (1024, 2048]
    result = verdict(LIGHT, prefill, 2048)
    assert reasons(result) == ["token_budget_full"]
    assert abs(result["reasons"][0]["value"] - 60 / 110) < 1e-9
    assert "configured" in result["reasons"][0]["evidence"]
    # The same steps against a budget of 8192: none is near it.
    assert verdict(LIGHT, prefill, 8192)["saturated"] is False


def test_an_inferred_budget_needs_requests_to_have_waited() -> None:
    alike = steps({256.0: 30})  # every step the same size: maybe full, maybe just alike
    assert verdict(LIGHT, alike)["saturated"] is False
    queued = series([0.1] * 20, [0.0] * 19 + [1.0], [2.0] * 20)
    result = verdict(queued, alike)
    assert reasons(result) == ["token_budget_full"]
    assert "inferred" in result["reasons"][0]["evidence"]


def test_ttft_rising_with_load() -> None:
    load = series([0.1] * 20, [0.0] * 10 + [2.0] * 5 + [6.0] * 5, [1.0] * 5 + [2.0] * 15)
    # Sub-windows of 71.25 s: mean loads 1, 2, ~3.6, 8; TTFT follows.
    rising = [ttft(10, 0.1), ttft(10, 0.2), ttft(10, 0.5), ttft(10, 1.6)]
    result = verdict(load, ttft_parts=rising)
    assert "ttft_rising" in reasons(result)
    found = next(r for r in result["reasons"] if r["reason"] == "ttft_rising")
    assert abs(found["value"] - 16.0) < 1e-9
    flat = [ttft(10, 0.1)] * 4
    assert "ttft_rising" not in reasons(verdict(load, ttft_parts=flat))
    # TTFT rising while load falls is not this reason.
    assert "ttft_rising" not in reasons(verdict(load, ttft_parts=rising[::-1]))


def test_load_shedding_is_any_refused_request() -> None:
    result = verdict(LIGHT, rejections=3.0)
    assert reasons(result) == ["load_shedding"] and result["reasons"][0]["value"] == 3.0
    assert verdict(LIGHT, rejections=0.0)["saturated"] is False


def test_what_cannot_be_judged_is_said_and_never_saturated() -> None:
    result = verdict([])
    assert result["saturated"] is None
    assert set(result["unjudged"]) == set(saturation.REASONS)
    assert result["unknown"] is not None and "admission" in result["unknown"]
    # KV is not exposed (llama.cpp): the other reasons still decide.
    no_kv = [LoadPoint(p.ts, None, p.waiting, p.running) for p in LIGHT]
    partial = verdict(no_kv, rejections=0.0)
    assert partial["saturated"] is False and "kv_full" in partial["unjudged"]


def test_labels_for_a_table_cell() -> None:
    assert saturation.labels(verdict([])) is None
    assert saturation.labels(verdict(LIGHT, rejections=0.0)) == "no"
    assert saturation.labels(verdict(LIGHT, rejections=2.0)) == "load shedding"
