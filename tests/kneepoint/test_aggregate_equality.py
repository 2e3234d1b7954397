"""The database aggregates (queries.fleet_intervals, queries.counter_windows), the weekly
review's one read and the timeline's pre-filters give exactly the numbers the direct
computation gives (the code before them, kept here as reference functions), on a seeded
SQLite store of a week: gaps, counter resets, a stale replica, a late one, a stalled one,
a counter missing at some rows, two engines, summary tiers written by the real rollup.
And they read few rows: counted where rows come into Python (queries.read_frame/read_bulk).

Counters are whole numbers and sample times multiples of 1/4 s, as scraped counters and
times are close to: sums of them are exact in any order, so the database's sums and
pandas' are compared with ==."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from kneepoint import timeline
from kneepoint.config import Config, Retention
from kneepoint.derived import details
from kneepoint.series import COLUMNS as SERIES_COLUMNS
from kneepoint.series import replica_series, resample
from kneepoint.status import build_status, hit_rates
from kneepoint.store import queries
from kneepoint.store.db import open_store
from kneepoint.store.rollup import rollup
from kneepoint.store.writer import ensure_targets
from kneepoint.views import _fleet_intervals, build_view
from review import weekly

DAY, HOUR = 86400.0, 3600.0
NOW = 1_700_000_100.0  # on a 5-minute boundary: a storm fills its intervals
SPAN = 7.5 * DAY
REPLICAS = {  # name -> engine
    "a-resets": "vllm",
    "b-gaps": "vllm",
    "c-stale": "vllm",
    "d-late": "vllm",
    "e-stalled": "vllm",
    "f-sglang": "sglang",
}


def _rows(name: str, target_id: int, index: int) -> list[dict[str, Any]]:
    """A replica's samples: every 2 minutes, every 30 s in the newest 26 h; times off the
    grid by multiples of 1/4 s; counters whole, growing at a rate of its own."""
    rows: list[dict[str, Any]] = []
    ts, counters = (
        NOW - SPAN,
        dict.fromkeys(("hits", "queries", "prompt", "generation", "compute", "preemptions"), 0.0),
    )
    step, grid = 0, NOW - SPAN
    while True:
        step += 1
        grid += 120.0 if grid < NOW - 26 * HOUR else 30.0
        ts = grid + (step % 4) * 0.25
        if ts > NOW:
            break
        age = NOW - ts
        if name == "c-stale" and age < 2 * DAY:
            break
        if name == "d-late" and age > 20 * HOUR:
            continue
        if name == "b-gaps" and (3 * DAY < age < 3 * DAY + 3 * HOUR or 5 * HOUR < age < 7 * HOUR):
            continue
        if name == "a-resets" and any(abs(age - at) < 20 for at in (4 * DAY, 12 * HOUR, 1800.0)):
            counters = dict.fromkeys(counters, 0.0)  # a restart: every counter from zero
        stalled = name == "e-stalled" and age < 1200
        queries_ = 0 if stalled else 40 + (step * 7 + index) % 23
        # The fleet's hit rate slides for an hour 3 days ago and 10 h ago; prompts storm
        # for 20 minutes 2 days ago and 6 h ago.
        slide = 3 * DAY - HOUR < age < 3 * DAY or 10 * HOUR - HOUR < age < 10 * HOUR
        storm = 2 * DAY - 1200 < age < 2 * DAY or 6 * HOUR - 1200 < age < 6 * HOUR
        counters["queries"] += queries_
        counters["hits"] += queries_ // (8 if slide else 1.25)
        counters["prompt"] += queries_ * 3
        counters["compute"] += 0 if stalled else (4000 if storm else 20) + (step % 5)
        counters["generation"] += 0 if stalled else 30 + index
        counters["preemptions"] += step % 97 == 0
        row: dict[str, Any] = {
            "target_id": target_id,
            "ts": ts,
            "kv_cache_usage": ((step * 13 + index) % 100) / 100,
            "requests_running": float((step + index) % 17) + (3.0 if stalled else 0.0),
            "requests_waiting": float(step % 5),
            "prompt_tokens": counters["prompt"],
            "generation_tokens": counters["generation"],
            "prompt_tokens_local_compute": counters["compute"],
            "preemptions": counters["preemptions"],
            "request_prompt_tokens_sum": counters["prompt"],
            "request_prompt_tokens_count": counters["generation"] // 10,
        }
        if REPLICAS[name] == "vllm":
            row["prefix_cache_queries"] = counters["queries"]
            # A counter missing at some rows only (a partial scrape).
            missing = name == "b-gaps" and step % 50 == 0
            row["prefix_cache_hits"] = None if missing else counters["hits"]
        else:
            row["prefix_cache_hit_rate_gauge"] = 0.5 + (step % 10) / 100
        rows.append(row)
    return rows


def _config(url: str) -> Config:
    targets = [
        {"name": name, "kind": kind, "url": f"http://{name}/metrics"}
        for name, kind in REPLICAS.items()
    ]
    return Config.model_validate({"database": url, "targets": targets})


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[sessionmaker[Session], Config]:
    url = f"sqlite:///{Path(tmp_path_factory.mktemp('aggregate')) / 'store.db'}"
    sessions = open_store(url)
    with sessions.begin() as session:
        ids = ensure_targets(session, [(n, k, f"http://{n}/metrics") for n, k in REPLICAS.items()])
        for index, name in enumerate(REPLICAS):
            session.execute(insert(queries.REPLICA_SAMPLES), _rows(name, ids[name], index))
    with sessions.begin() as session:
        rollup(session, NOW, Retention())  # the summary tiers, as the collector's job writes
    return sessions, _config(url)


@pytest.fixture
def rows_read(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The sizes of every result read into Python through the one read path (on SQLite
    read_bulk reads through read_frame too)."""
    sizes: list[int] = []
    original = queries.read_frame

    def counted(session: Session, query: Any) -> pd.DataFrame:
        frame = original(session, query)
        sizes.append(len(frame))
        return frame

    monkeypatch.setattr(queries, "read_frame", counted)
    yield sizes


# --- reference computations: the code as it was (4f6a22f) -------------------------------


def reference_fleet(session: Session, start: float, end: float) -> pd.DataFrame:
    """views.build_view's week of fleet intervals before: every replica's 5-minute rows."""
    names = {row.id: name for name, row in queries.targets(session).items()}
    fine = queries.replica_frame(session, start, end, columns=SERIES_COLUMNS, coarsest=300)
    return _fleet_intervals(resample(replica_series(fine, names), "5min"))


def reference_p95_and_cap(view: Any, name: str) -> tuple[float | None, float | None]:
    occupancy = view.series.loc[view.series.replica == name, "kv_cache_occupancy"].dropna()
    running = view.series.loc[view.series.replica == name, "requests_running"].dropna()
    return (
        float(occupancy.quantile(0.95)) if len(occupancy) else None,
        float((running >= 0.95 * running.max()).mean())
        if len(running) and running.max() > 0
        else None,
    )


def _detected(fleet: pd.DataFrame) -> tuple[list[Any], list[Any]]:
    return details.hit_rate_drops(fleet), details.prefill_storms(fleet)


# --- equality ---------------------------------------------------------------------------


@pytest.mark.parametrize("days", [7.0, 3.0])
def test_a_long_views_fleet_intervals_summed_in_sql_are_the_direct_ones(
    store: tuple[sessionmaker[Session], Config], days: float
) -> None:
    sessions, config = store
    with sessions() as session:
        expected = reference_fleet(session, NOW - days * DAY, NOW)
        view = build_view(session, config, NOW, days * DAY)
    drops, storms = _detected(expected)
    assert drops and storms  # the seeded slides and storms are found at all
    assert view.events == {"hit_rate_drops": drops, "prefill_storms": storms}


def test_the_fleet_intervals_numbers_are_the_direct_ones(
    store: tuple[sessionmaker[Session], Config],
) -> None:
    from kneepoint.views import EVENT_INCREASES, _fleet_ratios

    sessions, _ = store
    with sessions() as session:
        expected = reference_fleet(session, NOW - 7 * DAY, NOW)
        sums, replicas = queries.fleet_intervals(
            session, NOW - 7 * DAY, NOW, 300, EVENT_INCREASES, coarsest=300
        )
    got = _fleet_ratios(sums, replicas)
    assert replicas == len(REPLICAS)
    for column in ("hit_rate", "computed_prompt_tokens_per_second"):
        want = expected.set_index("time")[column].dropna()
        have = got.set_index("time")[column].dropna()
        assert len(want) > 1900
        pd.testing.assert_series_equal(have, want, check_exact=True, check_freq=False)


@pytest.mark.parametrize("window", [3600.0, 1800.0, 300.0])
def test_the_hit_rate_baseline_is_build_status_own(
    store: tuple[sessionmaker[Session], Config], window: float
) -> None:
    sessions, config = store
    with sessions() as session:
        status = build_status(session, config, NOW, window)
        rates = hit_rates(session, config, NOW, window)
    expected = [
        {"name": r["name"], "prefix_cache_hit_rate": r["prefix_cache_hit_rate"]}
        for r in status["replicas"]
    ]
    assert rates["replicas"] == expected
    assert rates["fleet"]["prefix_cache_hit_rate"] == status["fleet"]["prefix_cache_hit_rate"]
    known = [r for r in expected if r["prefix_cache_hit_rate"] is not None]
    assert len(known) >= 4  # resets, gaps, the gauge-only engine: numbers, not all None


def test_the_timeline_walks_only_replicas_with_an_event_and_finds_the_same_events(
    store: tuple[sessionmaker[Session], Config], monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions, config = store
    walked: list[str] = []
    restarts = timeline.restarts

    def counted(replica: str, *args: Any) -> list[timeline.Event]:
        walked.append(replica)
        return restarts(replica, *args)

    monkeypatch.setattr(timeline, "restarts", counted)
    with sessions() as session:
        found = timeline.events(session, config, NOW - DAY, NOW)
    assert walked == ["a-resets"]  # the one replica whose counters fell
    # The direct walk: every replica through every detector.
    monkeypatch.setattr(timeline, "_may_restart", lambda frame: set(frame.target_id))
    monkeypatch.setattr(timeline, "_may_drop", lambda i: set(i.replica.astype(str)))
    monkeypatch.setattr(timeline, "_may_storm", lambda i: set(i.replica.astype(str)))
    with sessions() as session:
        expected = timeline.events(session, config, NOW - DAY, NOW)
    assert len(walked) == 1 + len(REPLICAS) - 1  # c-stale has no rows in the day
    assert found == expected
    assert {"restart", "hit_rate_drop", "prefill_storm"} <= {e.kind for e in found}


def test_the_weekly_reviews_rows_and_intervals_are_the_per_replica_ones(
    store: tuple[sessionmaker[Session], Config], monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions, config = store
    monkeypatch.setattr(weekly, "slo_reports", lambda *args: [])  # no SLOs configured
    with sessions() as session:
        period = weekly.period(session, config, NOW, 7 * DAY)
        for name, row in queries.targets(session).items():
            expected = weekly.intervals(session, row.id, NOW - 7 * DAY, NOW)
            got = period.intervals[name]
            assert len(got) == len(expected)
            if len(expected):
                pd.testing.assert_frame_equal(got, expected, check_exact=True)
            p95, cap = reference_p95_and_cap(period.view, name)
            assert period.replicas[name]["p95_kv_occupancy"] == p95
            assert period.replicas[name]["running_at_cap_share"] == cap
    assert sum(len(v) for v in period.intervals.values()) > 500


# --- rows read --------------------------------------------------------------------------


def test_a_weeks_view_reads_one_row_per_fleet_interval_not_every_replicas(
    store: tuple[sessionmaker[Session], Config], rows_read: list[int]
) -> None:
    sessions, config = store
    with sessions() as session:
        build_view(session, config, NOW, 7 * DAY)
    # No read larger than the 2,016 fleet intervals (every replica's 5-minute rows were
    # one read of 2,016 a replica), and in all well under them.
    assert max(rows_read) <= 2016 + 1
    assert sum(rows_read) < 2016 * len(REPLICAS) / 2


def test_the_hit_rate_baseline_reads_a_row_per_replica(
    store: tuple[sessionmaker[Session], Config], rows_read: list[int]
) -> None:
    sessions, config = store
    with sessions() as session:
        hit_rates(session, config, NOW, HOUR)
    # One row per replica, and the hour's rows of the one with a counter missing at some
    # rows (120 at 30 s); every replica's hour was 120 rows each.
    assert sum(rows_read) <= len(REPLICAS) + 121


def test_the_weekly_review_reads_its_intervals_in_one_query(
    store: tuple[sessionmaker[Session], Config], monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions, config = store
    monkeypatch.setattr(weekly, "slo_reports", lambda *args: [])
    calls: list[Any] = []
    original = queries.replica_frame

    def counted(*args: Any, **kwargs: Any) -> pd.DataFrame:
        calls.append(kwargs.get("columns"))
        return original(*args, **kwargs)

    monkeypatch.setattr(queries, "replica_frame", counted)
    with sessions() as session:
        weekly.period(session, config, NOW, 7 * DAY)
    assert sum(1 for c in calls if c is not None and "hist_itl" in c) == 1
