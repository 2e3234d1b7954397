"""At fleet size a page's per-replica window numbers come from the database's few rows per
replica (kneepoint/store/window_rows.py: edge rows and peaks), not every replica's rows of
the range: the View and the status are equal to the rows path's (views.build_view with
`series=True`, status.build_status with `aggregate=False`), on SQLite and PostgreSQL, over
5 minutes, 1 h (samples), 24 h (5-minute summaries), 7 days (hourly) and a range ending off
the grid, from a seeded store with counter and histogram resets, gaps, a counter missing
at some rows, a stale, a late, a stalled replica, one with a single sample in the hour, two
engines, per-position counts and saturated stretches. And a page view at fleet size reads
a bounded number of rows.

Counters are whole numbers and times multiples of 1/4 s, as scraped counters and times are
close to: sums of them are exact in any order, so numbers are compared with ==."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import insert, update
from sqlalchemy.orm import Session, sessionmaker

from kneepoint import distribution, status
from kneepoint.config import Config, Retention
from kneepoint.derived.saturation import SUB_WINDOWS
from kneepoint.samples import Histogram
from kneepoint.status import build_status, fleet_window
from kneepoint.store import queries
from kneepoint.store.codec import encode_bounds, encode_floats, encode_histogram
from kneepoint.store.db import open_store
from kneepoint.store.models import HistogramLayoutRow, TargetRow
from kneepoint.store.rollup import rollup
from kneepoint.store.writer import ensure_targets
from kneepoint.views import build_view

DAY, HOUR = 86400.0, 3600.0
NOW = 1_700_000_100.0  # on a 5-minute boundary
SPAN = 7.5 * DAY
REPLICAS = {  # name -> engine
    "a-resets": "vllm",
    "b-gaps": "vllm",
    "c-stale": "vllm",
    "d-late": "vllm",
    "e-stalled": "vllm",
    "f-sglang": "sglang",
    "g-one": "vllm",
    **{f"p{i}": "vllm" for i in range(7)},  # plain ones: most of a fleet
}
WINDOWS = [
    (NOW, 300.0),
    (NOW, HOUR),
    (NOW, DAY),
    (NOW, 7 * DAY),
    (NOW - 1234.5, 2 * HOUR),  # ends off the grid
]
BOUNDS = (0.1, 0.5, 2.0, float("inf"))


def _rows(name: str, target_id: int, index: int) -> list[dict[str, Any]]:
    """A replica's samples: every 5 minutes, every 30 s in the newest 26 h; times off the
    grid by multiples of 1/4 s; counters and histogram counts whole."""
    rows: list[dict[str, Any]] = []
    counters = dict.fromkeys(
        ("hits", "queries", "prompt", "generation", "compute", "preemptions", "requests"), 0.0
    )
    buckets, total, positions = [0.0, 0.0, 0.0], 0.0, [0.0, 0.0]
    step, grid = 0, NOW - SPAN
    while True:
        step += 1
        grid += 300.0 if grid < NOW - 26 * HOUR else 30.0
        ts = grid + (step % 4) * 0.25
        if ts > NOW:
            break
        age = NOW - ts
        if name == "c-stale" and age < 2 * DAY:
            break
        if name == "d-late" and age > 20 * HOUR:
            continue
        if name == "g-one" and HOUR - 200 > age > 40:
            continue  # in the newest hour only its last sample, and one just before it
        if name == "b-gaps" and (3 * DAY < age < 3 * DAY + 3 * HOUR or 5 * HOUR < age < 7 * HOUR):
            continue
        if name == "a-resets" and any(abs(age - at) < 20 for at in (4 * DAY, 12 * HOUR, 1800.0)):
            # A restart: every counter and histogram from zero.
            counters = dict.fromkeys(counters, 0.0)
            buckets, total, positions = [0.0, 0.0, 0.0], 0.0, [0.0, 0.0]
        if name == "b-gaps" and 1485 <= age < 1515:
            # A restart right after a row missing a counter: the fall is across the gap.
            counters = dict.fromkeys(counters, 0.0)
        if name == "a-resets" and abs(age - 2 * HOUR) < 20:
            counters["preemptions"] = 0.0  # one counter alone falls
        stalled = name == "e-stalled" and age < 1200
        queries_ = 0 if stalled else 40 + (step * 7 + index) % 23
        # The fleet's hit rate slides for an hour 10 h ago; prompts storm for 20 minutes
        # 6 h ago and 20 minutes ago (events on 5-minute intervals).
        slide = 10 * HOUR - HOUR < age < 10 * HOUR
        storm = 6 * HOUR - 1200 < age < 6 * HOUR or 1200 < age < 2400
        counters["queries"] += queries_
        counters["hits"] += queries_ // (8 if slide else 1.25)
        counters["prompt"] += queries_ * 3
        counters["compute"] += 0 if stalled else (4000 if storm else 20) + (step % 5)
        counters["generation"] += 0 if stalled else 30 + index
        counters["preemptions"] += step % 97 == 0
        counters["requests"] += 0 if stalled else 2
        kv = ((step * 13 + index) % 100) / 100
        row: dict[str, Any] = {
            "target_id": target_id,
            "ts": ts,
            "kv_cache_usage": kv,
            "kv_cache_usage_peak": min(1.0, kv + 0.05) if step % 3 else None,
            "requests_running": float((step + index) % 17) + (3.0 if stalled else 0.0),
            "requests_waiting": float(step % 5),
            "requests_waiting_peak": float(step % 5 + 2) if step % 7 == 0 else None,
            "prompt_tokens": counters["prompt"],
            "generation_tokens": counters["generation"],
            "prompt_tokens_local_compute": counters["compute"],
            "preemptions": counters["preemptions"],
            "requests_finished_stop": counters["requests"],
            "request_prompt_tokens_sum": counters["prompt"],
            "request_prompt_tokens_count": counters["requests"],
        }
        if REPLICAS[name] == "vllm":
            row["prefix_cache_queries"] = counters["queries"]
            # A counter missing at some rows only (a partial scrape).
            missing = name == "b-gaps" and (step % 50 == 0 or 1515 <= age < 1545)
            row["prefix_cache_hits"] = None if missing else counters["hits"]
            if not stalled:
                buckets = [b + (step + k + index) % 3 for k, b in enumerate(buckets)]
                total += 0.25 * (step % 9)
                positions = [positions[0] + 3, positions[1] + step % 2]
            cumulative = (buckets[0], buckets[0] + buckets[1], sum(buckets))
            row["hist_ttft"] = (1, Histogram(BOUNDS, (*cumulative, sum(buckets)), total))
            row["hist_queue"] = (1, Histogram(BOUNDS, (0.0, *cumulative), total / 2))
            row["spec_decode_drafts"] = positions[0]
            row["spec_decode_draft_tokens"] = positions[0] * 2
            row["spec_decode_accepted_tokens"] = positions[0] + positions[1]
            row["accepted_per_position"] = encode_floats(positions)
        else:
            row["prefix_cache_hit_rate_gauge"] = 0.5 + (step % 10) / 100
        rows.append(row)
    return rows


def _encoded(rows: list[dict[str, Any]], layout: int) -> list[dict[str, Any]]:
    for row in rows:
        for key in ("hist_ttft", "hist_queue"):
            if key in row:
                row[key] = encode_histogram(layout, row[key][1])
    return rows


def _config(url: str) -> Config:
    targets = [
        {"name": name, "kind": kind, "url": f"http://{name}/metrics"}
        for name, kind in REPLICAS.items()
    ]
    return Config.model_validate({"database": url, "targets": targets})


def _seed(url: str) -> None:
    sessions = open_store(url)
    with sessions.begin() as session:
        session.add(HistogramLayoutRow(id=1, bounds=encode_bounds(BOUNDS)))
        ids = ensure_targets(session, [(n, k, f"http://{n}/metrics") for n, k in REPLICAS.items()])
        for index, name in enumerate(REPLICAS):
            rows = _encoded(_rows(name, ids[name], index), 1)
            # The target's own row as the collector leaves it: scraped at its last sample.
            session.execute(
                update(TargetRow)
                .where(TargetRow.id == ids[name])
                .values(
                    last_scrape_at=rows[-1]["ts"],
                    last_success_at=rows[-1]["ts"],
                    up=True,
                    engine=REPLICAS[name],
                    generation="v1" if REPLICAS[name] == "vllm" else None,
                )
            )
            # Every row with every column: executemany takes the first row's keys.
            keys = sorted({key for row in rows for key in row})
            session.execute(
                insert(queries.REPLICA_SAMPLES), [{k: row.get(k) for k in keys} for row in rows]
            )
    with sessions.begin() as session:
        rollup(session, NOW, Retention())  # the summary tiers, as the collector's job writes


@pytest.fixture(scope="module")
def store(
    fresh_url: Callable[[], str],
) -> tuple[sessionmaker[Session], Config]:
    url = fresh_url()
    _seed(url)
    return open_store(url), _config(url)


def same(a: Any, b: Any, path: str = "") -> None:
    """a == b, where NaN equals NaN (pandas' max of nothing known), with the path of the
    first difference."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        assert len(a) == len(b), path
        for number, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{number}]")
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        assert math.isnan(b), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.mark.parametrize(("now", "window"), WINDOWS)
def test_the_views_numbers_from_the_databases_rows_are_the_rows_paths(
    store: tuple[sessionmaker[Session], Config], now: float, window: float
) -> None:
    sessions, config = store
    with sessions() as session:
        expected = build_view(session, config, now, window, series=True)
        got = build_view(session, config, now, window, series=False)
    same(got.status, expected.status, "status")
    same(got.rows, expected.rows, "rows")
    assert got.events == expected.events
    # No GPU lines at fleet size (their numbers are compared in test_gpu_sql.py).
    assert got.gpus.empty and got.charts_from_database
    assert got.series.empty and got.coarse.empty  # no chart points without charts
    # The seeded cases are there at all: numbers, not all None.
    replicas = {r["name"]: r for r in expected.status["replicas"]}
    if window >= HOUR and now == NOW:
        assert replicas["e-stalled"]["stalled"] is True
        assert expected.rows["a-resets"]["queue_seconds"]
        assert replicas["a-resets"]["ttft_seconds"]
        assert replicas["a-resets"]["spec_decode_per_position_acceptance"]
        assert expected.rows["p1"]["time_saturated"]
        assert replicas["b-gaps"]["prefix_cache_hit_rate"] is not None
    if window >= DAY:
        assert replicas["c-stale"]["stale"] is True
        assert expected.events["hit_rate_drops"] and expected.events["prefill_storms"]
    if window == HOUR and now == NOW:
        assert expected.events["prefill_storms"]


@pytest.mark.parametrize(("now", "window"), WINDOWS)
def test_the_status_and_evaluations_view_from_the_databases_rows_are_the_rows_paths(
    store: tuple[sessionmaker[Session], Config],
    monkeypatch: pytest.MonkeyPatch,
    now: float,
    window: float,
) -> None:
    sessions, config = store
    with sessions() as session:
        expected = build_status(session, config, now, window, aggregate=False)
        got = build_status(session, config, now, window, aggregate=True)
        rules = build_view(session, config, now, window, pages=False, series=True)
        monkeypatch.setattr(distribution, "FLEET_THRESHOLD", 2)
        at_scale = build_view(session, config, now, window, pages=False)
        fleet = fleet_window(session, config, now, window)
        monkeypatch.setattr(distribution, "FLEET_THRESHOLD", 1000)
        fleet_rows = fleet_window(session, config, now, window)
    same(got, expected, "status")
    same(at_scale.status, rules.status, "evaluation's status")
    same(at_scale.rows, rules.rows, "evaluation's rows")
    same(fleet.__dict__, fleet_rows.__dict__, "fleet window")


@pytest.mark.parametrize(("now", "window"), WINDOWS)
def test_the_saturation_verdict_from_the_databases_sums_is_the_rows_one(
    store: tuple[sessionmaker[Session], Config], now: float, window: float
) -> None:
    """At fleet size the database reduces each replica's series to the verdict's statistics
    (store/saturation_sql.py): the same verdicts, reasons, evidence and values as the
    statistics of the rows themselves, over samples and summary tiers alike."""
    sessions, config = store
    with sessions() as session:
        expected = build_status(session, config, now, window, aggregate=False)
        got = build_status(session, config, now, window, aggregate=True)

    def verdicts(status: Any) -> dict[str, Any]:
        return {r["name"]: r["saturation"] for r in status["replicas"]}

    assert verdicts(got) == verdicts(expected)
    # Beneath the verdicts, the statistics themselves: the same from either source.
    with sessions() as session:
        ids = {row.id: name for name, row in queries.targets(session).items()}
        layouts = queries.histogram_layouts(session)
        frame = queries.replica_frame(session, now - window, now, columns=queries.LIGHT_COLUMNS)
        rows = status._saturations(session, frame, now - window, now, layouts, ids)
        sql = status._saturations_sql(session, now - window, now, layouts, ids)
    assert rows.keys() == sql.keys() and rows
    for target, loads in rows.items():
        for name, value in asdict(loads.stats).items():
            other = getattr(sql[target].stats, name)
            assert value == pytest.approx(other, rel=1e-12, abs=1e-9), (ids[target], name)
        assert loads.ttft_parts == sql[target].ttft_parts, ids[target]
    # The series reasons are judged at fleet size, not left out.
    judged = [v for v in verdicts(got).values() if v["saturated"] is not None]
    assert judged and all("queue_growing" not in v["unjudged"] for v in judged)
    assert all("kv_full" not in v["unjudged"] for v in judged)
    reasons = {r["reason"] for v in judged for r in v["reasons"]}
    if window >= DAY:  # the seeded queues stand over the long windows
        assert "queue_growing" in reasons
    if window == 300.0:  # and TTFT climbs with the load in the last minutes
        assert "ttft_rising" in reasons


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[int], list[Any]]]:
    """The sizes of every result read into Python through the one read path (on SQLite
    read_bulk reads through read_frame), and the targets each replica_frame call asked for
    (None: all)."""
    sizes: list[int] = []
    frames: list[Any] = []
    read_frame, read_bulk, replica_frame = (
        queries.read_frame,
        queries.read_bulk,
        queries.replica_frame,
    )

    def counted(session: Session, query: Any) -> pd.DataFrame:
        frame = read_frame(session, query)
        sizes.append(len(frame))
        return frame

    def bulk(session: Session, query: Any) -> pd.DataFrame:
        if session.get_bind().dialect.name != "postgresql":
            return read_bulk(session, query)  # through read_frame: counted there
        frame = read_bulk(session, query)
        sizes.append(len(frame))
        return frame

    def asked(session: Session, *args: Any, **kwargs: Any) -> pd.DataFrame:
        frames.append(kwargs.get("target_ids", args[2] if len(args) > 2 else None))
        return replica_frame(session, *args, **kwargs)

    monkeypatch.setattr(queries, "read_frame", counted)
    monkeypatch.setattr(queries, "read_bulk", bulk)
    monkeypatch.setattr(queries, "replica_frame", asked)
    yield sizes, frames


@pytest.mark.parametrize("window", [HOUR, DAY])
def test_a_page_view_at_fleet_size_reads_a_few_rows_per_replica(
    store: tuple[sessionmaker[Session], Config],
    reads: tuple[list[int], list[Any]],
    monkeypatch: pytest.MonkeyPatch,
    window: float,
) -> None:
    sessions, config = store
    sizes, frames = reads
    monkeypatch.setattr(distribution, "FLEET_THRESHOLD", 2)
    with sessions() as session:
        ids = {name: row.id for name, row in queries.targets(session).items()}
        total = _rows_in_range(session, NOW - window, NOW, list(ids.values()))
        gaps = _rows_in_range(session, NOW - window, NOW, [ids["b-gaps"]])
        stalled = _rows_in_range(session, NOW - window, NOW, [ids["e-stalled"]])
        sizes.clear()
        frames.clear()
        build_view(session, config, NOW, window)
    # No replica_frame of every replica: only of the one whose last two rows may be stuck.
    assert None not in frames
    assert all(set(f) <= {ids["e-stalled"]} for f in frames), frames
    # Read: a few edge rows per replica, every row of the one with a counter missing at some
    # rows (b-gaps) and of the stalled one, the 5-minute fleet intervals, and small reads
    # (targets, layouts, runs) of a row or so per replica, and the saturation verdict's row
    # of statistics and SUB_WINDOWS + 1 rows for TTFT per replica (store/saturation_sql.py);
    # every replica's rows were `total`.
    verdict = (1 + SUB_WINDOWS + 1) * len(REPLICAS)
    bound = 6 * len(REPLICAS) + gaps + stalled + window / 300 + 2 * len(REPLICAS) + verdict
    assert sum(sizes) <= bound, (sizes, bound)
    assert sum(sizes) < total / 2


def _rows_in_range(session: Session, start: float, end: float, targets: list[int]) -> int:
    """How many rows replica_frame reads for these targets over the range."""
    return len(queries.replica_frame(session, start, end, targets, columns=("kv_cache_usage",)))
