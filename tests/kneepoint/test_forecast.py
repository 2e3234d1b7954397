"""The headroom forecast: daily peaks of running + waiting against the knee, a trend, and a
date only when the trend supports one."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pandas as pd

from collectors.engines.vllm import parse_vllm
from kneepoint import forecast
from kneepoint.config import load_config
from kneepoint.forecast import DAY, MIN_DAYS, daily_peaks, trend
from kneepoint.knee.runs import Point, Run
from kneepoint.store.db import connect_store
from kneepoint.store.runs import save_run
from kneepoint.store.writer import ensure_targets, record_replica
from tests.conftest import VLLM_032, migrated, read

START = 1_780_000_000.0 // DAY * DAY  # a UTC midnight


def ladder(base: float, growth: float, days: int, noise: float = 0.0, seed: int = 1) -> list:
    rng = random.Random(seed)
    return [base + growth * i + rng.gauss(0.0, noise) for i in range(days)]


def days_of(count: int) -> list[float]:
    return [START + i * DAY for i in range(count)]


def test_growing_peaks_give_a_date_with_a_range_around_the_true_crossing() -> None:
    base, growth, knee = 10.0, 1.5, 48
    peaks = ladder(base, growth, 21, noise=1.0)
    result = trend("a", days_of(21), peaks, knee)
    assert result.verdict == forecast.CROSSES, result.note
    assert result.crossing is not None and result.earliest is not None and result.latest
    true_crossing = START + (knee - base) / growth * DAY
    assert result.earliest <= true_crossing <= result.latest
    assert result.earliest < result.crossing < result.latest
    assert result.crossing > START + 20 * DAY  # after the last day, not in the past
    assert result.slope_per_day is not None and abs(result.slope_per_day - growth) < 0.5
    assert forecast._date(result.crossing) in result.note


def test_noisier_growth_widens_the_range_and_much_noise_gives_no_date() -> None:
    base, growth, knee = 10.0, 1.5, 48
    calm = trend("a", days_of(21), ladder(base, growth, 21, noise=0.5), knee)
    rough = trend("a", days_of(21), ladder(base, growth, 21, noise=4.0), knee)
    assert calm.verdict == rough.verdict == forecast.CROSSES
    assert calm.latest and calm.earliest and rough.latest and rough.earliest
    assert rough.latest - rough.earliest > calm.latest - calm.earliest
    # Noise far larger than the growth: the slope is not significant, so no date.
    noisy = trend("a", days_of(8), ladder(base, 0.3, 8, noise=15.0, seed=3), knee)
    assert noisy.verdict in (forecast.FLAT, forecast.FALLING), noisy.note
    assert noisy.crossing is None and noisy.earliest is None and noisy.latest is None


def test_flat_peaks_give_no_date() -> None:
    result = trend("a", days_of(14), ladder(20.0, 0.0, 14, noise=1.0), 32)
    assert result.verdict == forecast.FLAT, result.note
    assert result.crossing is None
    exactly_flat = trend("a", days_of(14), [20.0] * 14, 32)
    assert exactly_flat.verdict == forecast.FLAT and exactly_flat.crossing is None


def test_falling_peaks_give_no_date() -> None:
    result = trend("a", days_of(14), ladder(30.0, -1.0, 14, noise=0.5), 32)
    assert result.verdict == forecast.FALLING, result.note
    assert result.slope_per_day is not None and result.slope_per_day < 0
    assert result.crossing is None


def test_too_few_days_give_no_date_even_when_growing_fast() -> None:
    count = MIN_DAYS - 1
    result = trend("a", days_of(count), ladder(10.0, 5.0, count), 64)
    assert result.verdict == forecast.TOO_FEW_DAYS
    assert result.crossing is None and result.slope_per_day is None
    assert str(count) in result.note


def test_past_the_knee_and_no_knee_give_no_date() -> None:
    peaks = ladder(10.0, 2.0, 14)
    past = trend("a", days_of(14), peaks, int(peaks[-1]))
    assert past.verdict == forecast.PAST and past.crossing is None
    assert past.headroom is not None and past.headroom <= 0
    no_knee = trend("a", days_of(14), peaks, None)
    assert no_knee.verdict == forecast.NO_KNEE and no_knee.crossing is None
    assert no_knee.slope_per_day is not None and no_knee.slope_per_day > 0


def test_daily_peaks_add_waiting_and_skip_thin_days_and_today() -> None:
    rows = []
    for day in range(3):
        hours = 24 if day != 1 else forecast.MIN_HOURS - 1  # day 1 is mostly missing
        for hour in range(hours):
            rows.append(
                {
                    "ts": START + day * DAY + hour * 3600,
                    "requests_running": 5.0 + hour % 4,
                    "requests_waiting": float(day),
                }
            )
    rows.append({"ts": START + 2 * DAY + 23.5 * 3600, "requests_running": 50.0})
    frame = pd.DataFrame(rows)
    days, peaks = daily_peaks(frame, START + 2 * DAY + 12 * 3600)  # day 2 is today
    assert days == [START]
    assert peaks == [max(r["requests_running"] for r in rows[:24]) + 0.0]
    days, peaks = daily_peaks(frame, START + 3 * DAY)
    assert days == [START, START + 2 * DAY]
    assert peaks[1] == 50.0  # waiting missing on that row: running alone
    assert peaks[0] < max(5.0 + h % 4 for h in range(24)) + 2  # day 0 waits 0


def test_the_loader_reads_stored_history_and_the_knee_of_a_stored_run(tmp_path: Path) -> None:
    config_file = tmp_path / "kneepoint.yaml"
    config_file.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        "targets:\n"
        "  - {name: replica-a, kind: vllm, url: 'http://127.0.0.1:9/a'}\n"
        "  - {name: gpu-node, kind: dcgm, url: 'http://127.0.0.1:9/g'}\n"
    )
    migrated(config_file)
    config = load_config(config_file)
    sessions = connect_store(config.database)
    base, growth, knee, count = 8.0, 2.0, 48, 10
    sample = parse_vllm(read(VLLM_032))
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for day in range(count):
            for hour in range(24):
                row = copy.deepcopy(sample)
                busy = hour == 14  # the day's peak hour
                row.gauges["requests_running"] = (base + growth * day - 3) if busy else 2.0
                row.gauges["requests_waiting"] = 3.0 if busy else 0.0
                record_replica(session, ids["replica-a"], START + day * DAY + hour * 3600, row)
        points = tuple(
            Point(c, 40.0 * min(c, knee) + 0.01 * c) for c in (1, 4, 16, knee, 2 * knee, 4 * knee)
        )
        save_run(session, Run("replica-a-sweep", "m", "sweep", points), START)
    with sessions() as session:
        result = forecast.forecasts(session, config, START + count * DAY + 3600)
    assert [f.replica for f in result] == ["replica-a"]  # the GPU node has no forecast
    (one,) = result
    assert one.knee == knee
    assert list(one.peaks) == [base + growth * d for d in range(count)]
    assert one.verdict == forecast.CROSSES, one.note
    assert one.crossing is not None
    assert abs(one.crossing - (START + (knee - base) / growth * DAY)) < 60
