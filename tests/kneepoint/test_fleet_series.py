"""Fleet charts computed by the database (kneepoint/store/fleet_series.py) give the numbers
dashboards/charts.py computes in pandas from every replica's series (distribution, worst,
the drawn series' rows), on SQLite and PostgreSQL, over 1 h (samples), 24 h (5-minute
summaries) and 7 days (hourly), from a seeded store with gaps, counter resets, a replica
missing in some buckets, a late and a stale one, a counter missing at some rows, and two
replicas with the same values (ties in the ranks and the worst); and they read few rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import Table, insert, select
from sqlalchemy.orm import Session

from kneepoint import distribution
from kneepoint.config import Retention
from kneepoint.distribution import MEDIAN, Worse, tail_name
from kneepoint.series import COLUMNS as SERIES_COLUMNS
from kneepoint.series import gpu_series, replica_series, resample
from kneepoint.store import fleet_series, queries
from kneepoint.store.db import open_store
from kneepoint.store.models import Base, GpuRow
from kneepoint.store.rollup import rollup
from kneepoint.store.writer import ensure_targets
from kneepoint.views import _bucket as coarse_rule
from tests.postgres import running_postgres

DAY, HOUR = 86400.0, 3600.0
NOW = 1_700_000_100.0  # on a 5-minute boundary
SPAN = 7.5 * DAY
SCRAPE = 15.0
NAMES = [f"r{i:02d}" for i in range(12)]  # over distribution.FLEET_THRESHOLD
RANGES = [
    (NOW - HOUR, NOW),
    (NOW - DAY, NOW),
    (NOW - 7 * DAY, NOW),
    (NOW - HOUR - 1234.5, NOW - 1234.5),  # ends off the grid
]
METRICS: list[tuple[str, Worse]] = [
    ("kv_cache_occupancy", "higher"),
    ("requests_waiting", "higher"),  # whole numbers: ties in every bucket
    ("generation_tokens_per_second", "lower"),
    ("preemptions_per_second", "higher"),
    ("spec_acceptance", "lower"),
]

RESAMPLED: list[tuple[str, Worse]] = [
    ("hit_rate", "lower"),
    ("computed_prompt_tokens_per_second", "higher"),
]


def _rows(name: str, target_id: int, index: int) -> list[dict[str, Any]]:
    """A replica's samples: every 5 minutes, every minute in the newest 26 h, every 15 s
    in the newest 2 h, each replica at its own offset; counters whole and growing at a
    rate of their own."""
    rows: list[dict[str, Any]] = []
    counters = dict.fromkeys(
        ("generation", "preemptions", "accepted", "draft", "hits", "queries", "compute"), 0.0
    )
    # r06 is r05's twin (the same values at the same times): ties.
    twin = 5 if name == "r06" else index
    level = 12 if twin == 5 else twin
    step, grid = 0, NOW - SPAN
    while True:
        step += 1
        grid += 300.0 if grid < NOW - 26 * HOUR else 60.0 if grid < NOW - 2 * HOUR else SCRAPE
        # Off the grid by multiples of 1/4 s, but the first replica, whose spacing
        # distribution.bucket_width reads: the scrape interval, as the database assumes.
        ts = grid + twin + (step % 4) * 0.25 * (index > 0)
        if ts > NOW:
            break
        age = NOW - ts
        if name == "r08" and age < 2 * DAY:  # stale: gone two days ago
            break
        if name == "r07" and age > 20 * HOUR:  # late: came 20 hours ago
            continue
        if name == "r04" and (
            600 < age < 1500 or 5 * HOUR < age < 7 * HOUR or 3 * DAY < age < 3 * DAY + 3 * HOUR
        ):
            continue  # gaps: missing in whole buckets of every range
        if name == "r03" and any(abs(age - at) < 8 for at in (4 * DAY, 12 * HOUR, 1800.0)):
            counters = dict.fromkeys(counters, 0.0)  # a restart: every counter from zero
        counters["generation"] += 30 + twin * 3 + step % 7
        counters["preemptions"] += step % (20 + twin) == 0
        counters["draft"] += 0 if step % 9 == 0 else 40
        counters["queries"] += 0 if step % 13 == 0 else 50
        counters["hits"] += 0 if step % 13 == 0 else (step * 3 + twin) % 51
        counters["compute"] += 20 + (step * twin) % 300
        counters["accepted"] += 0 if step % 9 == 0 else (step + twin) % 41
        row: dict[str, Any] = {
            "target_id": target_id,
            "ts": ts,
            # The twins the fullest: the first two worst, tied, ranked by name.
            "kv_cache_usage": ((step * 13 + twin * 7) % 100) / 100 * (0.3 + level / 20),
            "requests_running": float((step + twin) % 17),
            "requests_waiting": float((step + twin) % 5),
            "generation_tokens": counters["generation"],
            "preemptions": counters["preemptions"],
            "spec_decode_draft_tokens": counters["draft"],
            "prefix_cache_queries": counters["queries"],
            "prefix_cache_hits": counters["hits"],
            "prompt_tokens_local_compute": counters["compute"],
            # A counter missing at some rows only (a partial scrape).
            "spec_decode_accepted_tokens": None
            if name == "r07" and step % 11 == 0
            else counters["accepted"],
        }
        rows.append(row)
    return rows


def _gpu_rows(gpu_id: int, index: int) -> list[dict[str, Any]]:
    return [
        {
            "gpu_id": gpu_id,
            "ts": NOW - HOUR + step * SCRAPE + index,
            "utilization": float((step * 7 + index * 3) % 100),
            "power_watts": 100.0 + (step + index) % 13,
        }
        for step in range(240)
        if not (index == 2 and 40 < step < 80)  # a gap
    ]


def _seed(url: str) -> None:
    sessions = open_store(url)
    with sessions.begin() as session:
        targets = [(n, "vllm", f"http://{n}/metrics") for n in NAMES]
        targets += [(f"node-{k}", "dcgm", f"http://node-{k}/metrics") for k in range(10)]
        ids = ensure_targets(session, targets)
        for index, name in enumerate(NAMES):
            session.execute(insert(queries.REPLICA_SAMPLES), _rows(name, ids[name], index))
        for k in range(10):
            gpu = cast(Table, GpuRow.__table__)
            gpu_id = session.execute(
                insert(gpu)
                .values(target_id=ids[f"node-{k}"], host=f"node-{k}", gpu_index=k % 2, uuid=f"u{k}")
                .returning(gpu.c.id)
            ).scalar_one()
            session.execute(insert(queries.GPU_SAMPLES), _gpu_rows(gpu_id, k))
    with sessions.begin() as session:
        rollup(session, NOW, Retention())  # the summary tiers, as the collector's job writes


@pytest.fixture(scope="module")
def sqlite(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{Path(tmp_path_factory.mktemp('fleet')) / 'store.db'}"
    _seed(url)
    return url


@pytest.fixture(scope="module")
def postgres(sqlite: str) -> Iterator[str]:
    """The seeded store copied into a throwaway PostgreSQL."""
    with running_postgres() as fresh:
        url = fresh()
        source, target = open_store(sqlite), open_store(url)
        with source() as a, target.begin() as b:
            for table in Base.metadata.sorted_tables:
                rows = [dict(r) for r in a.execute(select(table)).mappings()]
                if rows:
                    b.execute(table.insert(), rows)
        yield url


@pytest.fixture
def rows_read(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The sizes of the results read into Python through the one read path (on SQLite
    read_bulk reads through read_frame too)."""
    sizes: list[int] = []
    original = queries.read_frame

    def counted(session: Session, query: Any) -> pd.DataFrame:
        frame = original(session, query)
        sizes.append(len(frame))
        return frame

    monkeypatch.setattr(queries, "read_frame", counted)
    yield sizes


def _every_series(session: Session, start: float, end: float) -> pd.DataFrame:
    """app/data.series before: every replica's series, as pages charted them."""
    names = {row.id: name for name, row in queries.targets(session).items()}
    frame = queries.replica_frame(session, start, end, columns=SERIES_COLUMNS)
    return replica_series(frame, names)


def _same_fleet(
    fleet: distribution.Fleet, series: pd.DataFrame, column: str, color: str, worse: Worse
) -> None:
    expected = distribution.distribution(series, column, color, worse)
    tail = tail_name(worse)
    assert len(expected) > 3
    assert list(fleet.spread["time"]) == list(expected["time"])
    np.testing.assert_allclose(fleet.spread[MEDIAN], expected[MEDIAN], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fleet.spread[tail], expected[tail], rtol=1e-9, atol=1e-12)
    assert fleet.worst == distribution.worst(series, column, color, worse)
    assert fleet.size == series.dropna(subset=[column])[color].nunique()
    drawn = series[series[color].isin(fleet.worst)].sort_values([color, "time"])
    got = fleet.rows.sort_values([color, "time"])
    assert list(got["time"]) == list(drawn["time"])
    np.testing.assert_array_equal(got[column].to_numpy(float), drawn[column].to_numpy(float))


def _compare(url: str) -> None:
    sessions = open_store(url)
    with sessions() as session:
        for start, end in RANGES:
            series = _every_series(session, start, end)
            for column, worse in METRICS:
                fleet = fleet_series.replica_fleet(session, start, end, column, SCRAPE, worse)
                _same_fleet(fleet, series, column, "replica", worse)
            # The Prefix cache page's: each replica's series resampled first (views.py).
            rule = coarse_rule(end - start)
            coarse = resample(series, rule)
            every = int(pd.Timedelta(rule).total_seconds())
            for column, worse in RESAMPLED:
                fleet = fleet_series.replica_fleet(
                    session, start, end, column, SCRAPE, worse, resample=every
                )
                _same_fleet(fleet, coarse, column, "replica", worse)


def test_the_databases_fleet_charts_are_pandas_on_every_series(sqlite: str) -> None:
    _compare(sqlite)


@pytest.mark.real
def test_on_postgresql_the_fleet_charts_are_pandas_on_every_series(postgres: str) -> None:
    _compare(postgres)


def test_the_seeded_cases_are_in_the_ranges(sqlite: str) -> None:
    """The store has what the comparison claims: tied series, a counter reset, a replica
    missing in buckets where the others are."""
    with open_store(sqlite)() as session:
        frame = queries.replica_frame(session, NOW - HOUR, NOW, columns=SERIES_COLUMNS)
        series = _every_series(session, NOW - HOUR, NOW)
    twins = series[series.replica.isin(["r05", "r06"])].groupby("replica")
    assert twins["kv_cache_occupancy"].mean().nunique() == 1
    assert distribution.worst(series, "kv_cache_occupancy", "replica")[:2] == ["r05", "r06"]
    names = {row: name for name, row in zip(NAMES, sorted(frame.target_id.unique()), strict=False)}
    falls = frame.groupby("target_id").generation_tokens.diff() < 0
    assert {names[t] for t in frame.target_id[falls]} == {"r03"}
    per_bucket = series.assign(b=series.time.dt.floor("15s")).groupby("b").replica.nunique()
    assert per_bucket.min() < per_bucket.max()  # r04 missing in some buckets


def test_gpu_fleet_charts_are_pandas_on_every_gpu(sqlite: str) -> None:
    with open_store(sqlite)() as session:
        frame = queries.gpu_frame(session, NOW - HOUR, NOW)
        every = gpu_series(frame)
        gauges: list[tuple[str, Worse]] = [("utilization", "higher"), ("power_watts", "lower")]
        for column, worse in gauges:
            fleet = fleet_series.gpu_fleet(session, NOW - HOUR, NOW, column, SCRAPE, worse)
            _same_fleet(fleet, every, column, "gpu", worse)


def test_chosen_series_rows_come_with_the_worst(sqlite: str) -> None:
    with open_store(sqlite)() as session:
        fleet = fleet_series.replica_fleet(
            session, NOW - HOUR, NOW, "kv_cache_occupancy", SCRAPE, chosen=("r00",)
        )
        series = _every_series(session, NOW - HOUR, NOW)
    assert set(fleet.rows.replica) == {*fleet.worst, "r00"}
    mine = series[series.replica == "r00"]
    assert list(fleet.rows[fleet.rows.replica == "r00"].time) == list(mine.time)


@pytest.mark.parametrize(("start", "end"), RANGES[:3])
def test_a_fleet_chart_reads_buckets_means_and_the_drawn_rows_only(
    sqlite: str, rows_read: list[int], start: float, end: float
) -> None:
    with open_store(sqlite)() as session:
        fleet = fleet_series.replica_fleet(session, start, end, "kv_cache_occupancy", SCRAPE)
        read = sum(rows_read)
        rows_read.clear()
        every = len(_every_series(session, start, end))
    # One row per bucket and per series, then the worst three series' own rows (and where
    # a summary row starts one, the samples before it that replica_frame reads in its place).
    assert 0 <= read - (len(fleet.spread) + fleet.size + len(fleet.rows)) <= 3 * 20
    assert len(fleet.spread) <= distribution.MAX_POINTS + 1
    assert read < every / 2


def test_the_store_draws_nothing() -> None:
    """The kernel's fleet aggregation imports no drawing library (the distribution's
    definitions live in kneepoint/distribution.py, the chart module only draws them)."""
    import subprocess
    import sys

    probe = "import sys, kneepoint.store.fleet_series; print('plotly' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
