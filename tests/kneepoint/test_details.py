"""Page numbers beyond the status contract, with values worked out by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from kneepoint.derived import details


def test_slots_left_at_the_live_mean_context() -> None:
    # 100,000 tokens of cache at 40 % hold 40,000 tokens for 8 sequences: 5,000 each;
    # the cache fits 20 such sequences, 12 more than run now.
    assert details.sequence_slots(100_000, 0.4, 8) == (5000, 20, 12)
    assert details.sequence_slots(100_000, 0.4, 0) == (None, None, None)
    assert details.sequence_slots(None, 0.4, 8) == (None, None, None)


def test_time_saturated_weights_each_sample_by_how_long_it_held() -> None:
    times = pd.Series([0.0, 10.0, 40.0, 50.0])
    occupancy = pd.Series([0.95, 0.5, 0.92, 0.1])
    # 0.95 held 10 s, 0.5 held 30 s, 0.92 held 10 s: 20 of 50 s above 0.9.
    assert details.time_saturated(times, occupancy) == pytest.approx(20 / 50)
    assert details.time_saturated(times[:1], occupancy[:1]) is None


def test_a_slide_from_90_to_60_percent_is_a_drop_with_its_start_time() -> None:
    times = pd.date_range("2026-11-29 08:00", periods=24, freq="5min", tz="UTC")
    rates = [0.9] * 16 + [0.55] * 8
    drops = details.hit_rate_drops(pd.DataFrame({"time": times, "hit_rate": rates}))
    assert [d.start for d in drops] == [times[16]]
    assert drops[0].value == 0.55 and drops[0].baseline == pytest.approx(0.9)
    steady = details.hit_rate_drops(pd.DataFrame({"time": times, "hit_rate": [0.9] * 24}))
    assert steady == []


def test_a_burst_of_computed_prompt_tokens_is_a_prefill_storm() -> None:
    times = pd.date_range("2026-11-29 09:00", periods=20, freq="5min", tz="UTC")
    values = [1000.0] * 12 + [9000.0, 7000.0] + [1000.0] * 6
    storms = details.prefill_storms(
        pd.DataFrame({"time": times, "computed_prompt_tokens_per_second": values})
    )
    assert [s.start for s in storms] == [times[12]]


def test_divergence_is_the_spread_of_replica_hit_rates() -> None:
    assert details.divergence({"a": 0.9, "b": 0.55, "c": None}) == pytest.approx(0.35)
    assert details.divergence({"a": 0.9}) is None


def test_energy_and_idle_hours() -> None:
    kwh, per_million = details.energy(7.2e6, 2_000_000)  # 7.2 MJ for 2M tokens
    assert kwh == 2.0 and per_million == 3.6e6
    assert details.energy(None, 5) == (None, None)
    assert details.idle_gpu_hours(0.25, 7200, 2) == 3.0  # 75 % idle × 2 h × 2 GPUs
