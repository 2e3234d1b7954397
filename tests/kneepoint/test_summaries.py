"""Summary tiers: a long range reads 5-minute and hourly rows, and its numbers stay those
of the samples (counters, histograms at the edges, peaks, time saturated)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from itertools import pairwise

import pandas as pd
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import parse_vllm
from kneepoint.config import Retention
from kneepoint.derived.details import time_saturated
from kneepoint.derived.window import frame_windows
from kneepoint.samples import Histogram, ReplicaSample
from kneepoint.store import queries
from kneepoint.store.db import open_store
from kneepoint.store.models import RAW, ReplicaRollupRow
from kneepoint.store.rollup import REPLICA_SHAPE, rollup, summarize
from kneepoint.store.writer import ensure_targets, record_gpus, record_replica
from tests.conftest import DCGM_T4, VLLM_032, read

BASE = parse_vllm(read(VLLM_032))
Fresh = Callable[[], str]  # the fresh_url fixture (conftest): an empty store of each kind
HOUR = 3600.0


def series(seed: int, hours: float, restart_at: int | None) -> list[tuple[float, ReplicaSample]]:
    """A replica scraped every 15 s: counters and a TTFT histogram growing at varying rates,
    KV occupancy swinging through saturation, and an engine restart."""
    points = []
    tokens, ttft = 0.0, BASE.histograms["ttft"]
    assert ttft is not None
    for step in range(int(hours * 240)):
        if step == restart_at:
            tokens, ttft = 0.0, Histogram(ttft.bounds, tuple(0.0 for _ in ttft.counts), 0.0)
        tokens += (step * 7 + seed) % 53
        grown = tuple(c + i * ((step + seed) % 3) for i, c in enumerate(ttft.counts))
        ttft = Histogram(ttft.bounds, grown, ttft.total + 0.25)
        sample = copy.deepcopy(BASE)
        sample.counters["generation_tokens"] = tokens
        sample.counters["prompt_tokens"] = tokens * 3
        sample.histograms["ttft"] = ttft
        sample.gauges["kv_cache_usage"] = ((step * 13 + seed) % 100) / 100
        sample.gauges["requests_running"] = float((step + seed) % 17)
        points.append((1_000_000.0 + step * 15.0, sample))
    return points


def store_of(url: str, points: list[tuple[float, ReplicaSample]]) -> sessionmaker[Session]:
    sessions = open_store(url)
    with sessions.begin() as session:
        target = ensure_targets(session, [("r", "vllm", "http://x/metrics")])["r"]
        for ts, point in points:
            record_replica(session, target, ts, point)
    return sessions


def numbers(session: Session, start: float, end: float, coarsest: int) -> dict[str, object]:
    """What a page computes over [start, end] from the rows read with `coarsest`."""
    frame = queries.replica_frame(
        session, start, end, columns=queries.LIGHT_COLUMNS, coarsest=coarsest
    )
    layouts = queries.histogram_layouts(session)
    (window,) = frame_windows(
        frame, layouts, lambda keys: queries.replica_rows_at(session, keys)
    ).values()
    ttft = window.histograms["ttft"]
    return {
        "rows": len(frame),
        "seconds": window.seconds,
        "deltas": window.deltas,
        "ttft": (ttft.counts, ttft.total) if ttft else None,
        "saturated": time_saturated(
            frame.ts,
            frame.kv_cache_usage.astype(float),
            frame.get("saturated_seconds"),
            frame.get("ends_saturated"),
        ),
        "peak_kv": float(frame.kv_cache_usage_peak.fillna(frame.kv_cache_usage).max()),
        "peak_running": float(frame.requests_running_peak.fillna(frame.requests_running).max()),
    }


def assert_same(summarized: dict[str, object], raw: dict[str, object]) -> None:
    for key in ("seconds", "ttft", "peak_kv", "peak_running"):
        assert summarized[key] == raw[key], key
    deltas, expected = summarized["deltas"], raw["deltas"]
    assert isinstance(deltas, dict) and isinstance(expected, dict)
    assert {k for k, v in deltas.items() if v is None} == {
        k for k, v in expected.items() if v is None
    }
    known = {k: v for k, v in expected.items() if v is not None}
    assert {k: deltas[k] for k in known} == pytest.approx(known, rel=1e-12)
    assert summarized["saturated"] == pytest.approx(raw["saturated"], rel=1e-12)


def test_a_long_range_reads_summary_rows_and_gets_the_samples_numbers(fresh_url: Fresh) -> None:
    points = series(seed=3, hours=30, restart_at=240 * 11 + 37)
    sessions = store_of(fresh_url(), points)
    end = points[-1][0]
    with sessions.begin() as session:
        result = rollup(session, end + 120, Retention())
    assert result.summarized > 0 and result.thinned == 0
    with sessions() as session:
        start = points[0][0] + 1234.0
        raw = numbers(session, start, end, RAW)
        hourly = numbers(session, start, end, queries.coarsest_for(end - start))
        five_minutes = numbers(session, start, end, 300)
    assert queries.coarsest_for(end - start) == 300  # 30 hours: a 15-minute chart
    assert_same(five_minutes, raw)
    assert_same(hourly, raw)
    assert raw["deltas"]["generation_tokens"] > 0 and 0 < raw["saturated"] < 1  # type: ignore[index,operator]
    # The point of it: far fewer rows (edges raw, whole buckets summarized).
    assert five_minutes["rows"] < raw["rows"] / 10  # type: ignore[operator]


# Each example writes hours of samples: shrinking a failure would take many minutes.
@settings(max_examples=12, deadline=None, phases=(Phase.explicit, Phase.generate))
# A range whose first whole bucket begins before its first sample (found by this test).
@example(seed=566, restart=None, edges=(0.2071547, 0.8078447), coarsest=3600, settle=247.6)
# A range that starts exactly on an hour: no finer rows before the first hourly one.
@example(seed=1, restart=100, edges=(4400 / 19785, 0.9), coarsest=3600, settle=0.0)
@given(
    seed=st.integers(0, 1000),
    restart=st.one_of(st.none(), st.integers(1, 240 * 5)),
    edges=st.tuples(st.floats(0, 0.45), st.floats(0.55, 1.0)),
    coarsest=st.sampled_from([300, 3600]),
    settle=st.floats(0, 2 * HOUR),
)
def test_any_range_through_the_tiers_equals_the_samples(
    fresh_url: Fresh,
    seed: int,
    restart: int | None,
    edges: tuple[float, float],
    coarsest: int,
    settle: float,
) -> None:
    points = series(seed, hours=5.5, restart_at=restart)
    sessions = store_of(fresh_url(), points)
    first, last = points[0][0], points[-1][0]
    # Summaries written up to some time inside the data: the rest is read from the samples.
    with sessions.begin() as session:
        summarize(session, REPLICA_SHAPE, first + settle + 3 * HOUR)
    start = first + edges[0] * (last - first)
    end = first + edges[1] * (last - first)
    with sessions() as session:
        assert_same(numbers(session, start, end, coarsest), numbers(session, start, end, RAW))


def test_summaries_written_bit_by_bit_equal_those_written_at_once(fresh_url: Fresh) -> None:
    points = series(seed=5, hours=4, restart_at=500)
    once, steps = store_of(fresh_url(), points), store_of(fresh_url(), points)
    end = points[-1][0] + 300
    with once.begin() as session:
        summarize(session, REPLICA_SHAPE, end)
    for now in [*range(int(points[0][0]), int(end), 437), end]:
        with steps.begin() as session:
            summarize(session, REPLICA_SHAPE, float(now))

    def rows(sessions: sessionmaker[Session]) -> pd.DataFrame:
        with sessions() as session:
            query = select(ReplicaRollupRow.__table__).order_by("resolution", "ts")
            return pd.read_sql(query, session.connection())

    expected = rows(once)
    assert set(expected.resolution) == {300, 3600}
    pd.testing.assert_frame_equal(rows(steps), expected)


def test_summaries_expire_with_their_tier_s_retention(fresh_url: Fresh) -> None:
    points = series(seed=1, hours=3, restart_at=None)
    sessions = store_of(fresh_url(), points)
    end = points[-1][0]
    with sessions.begin() as session:
        rollup(session, end + 120, Retention())
        later = end + 40 * 86400  # past the 5-minute tier's 35 days, within the hour's 400
        rollup(session, later, Retention())
        kept = session.scalars(select(ReplicaRollupRow.resolution)).all()
    assert set(kept) == {3600}


def test_plan_covers_the_range_with_the_coarsest_whole_buckets() -> None:
    reach = {300: 86400.0, 3600: 82800.0}
    assert queries.plan(1000.0, 90000.0, reach, 3600) == [
        (1000.0, 1200, RAW),
        (1200, 3600, 300),
        (3600, 82800.0, 3600),
        (82800.0, 86400.0, 300),
        (86400.0, 90000.0, RAW),
    ]
    assert queries.plan(1000.0, 90000.0, reach, 300)[1:] == [
        (1200, 86400.0, 300),
        (86400.0, 90000.0, RAW),
    ]
    assert queries.plan(1000.0, 90000.0, {}, 3600) == [(1000.0, 90000.0, RAW)]
    assert queries.plan(1000.0, 1100.0, reach, 3600) == [(1000.0, 1100.0, RAW)]


@given(
    start=st.floats(0, 1e6),
    length=st.floats(0, 1e6),
    reach=st.dictionaries(st.sampled_from([300, 3600]), st.floats(0, 2e6)),
    coarsest=st.sampled_from([RAW, 300, 3600]),
)
def test_plan_pieces_are_contiguous_aligned_and_within_reach(
    start: float, length: float, reach: dict[int, float], coarsest: int
) -> None:
    end = start + length
    pieces = queries.plan(start, end, reach, coarsest)
    assert pieces[0][0] == start and pieces[-1][1] == end
    for (_, high, _), (low, _, _) in pairwise(pieces):
        assert high == low
    for low, high, resolution in pieces:
        assert resolution <= coarsest
        if resolution != RAW:
            assert low < high <= reach[resolution]
            assert math.remainder(low, resolution) == 0 and math.remainder(high, resolution) == 0


def test_gpu_readings_read_through_the_tiers_keep_energy_and_identity(fresh_url: Fresh) -> None:
    sessions = open_store(fresh_url())
    gpus = parse_dcgm(read(DCGM_T4), default_host="node")
    with sessions.begin() as session:
        target = ensure_targets(session, [("node", "dcgm", "http://x/m")])["node"]
        for step in range(240 * 4):
            for gpu in gpus:
                gpu.energy_mj = 1000.0 * step
                gpu.utilization = (step % 10) / 10
            record_gpus(session, target, 1_000_000.0 + step * 15.0, gpus)
    start, end = 1_000_000.0 + 100.0, 1_000_000.0 + 240 * 4 * 15.0
    with sessions.begin() as session:
        rollup(session, end + 120, Retention())
    with sessions() as session:
        raw = queries.gpu_frame(session, start, end, coarsest=RAW)
        tiered = queries.gpu_frame(session, start, end, coarsest=3600)
    assert len(tiered) < len(raw) / 10
    for frame in (raw, tiered):
        assert (
            frame.energy_mj.iloc[-1] - frame.energy_mj.iloc[0]
            == raw.energy_mj.iloc[-1] - raw.energy_mj.iloc[0]
        )
        assert (frame.host.iloc[0], frame.model.iloc[0]) == ("cp-bm14r7", "Tesla T4")
