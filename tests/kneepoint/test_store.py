from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import inspect, select, text

from collectors.dcgm import parse_dcgm
from collectors.vllm import parse_vllm
from kneepoint.config import Retention
from kneepoint.counters import increase
from kneepoint.samples import Histogram, ReplicaSample
from kneepoint.store import queries
from kneepoint.store.codec import decode_histogram, encode_histogram
from kneepoint.store.db import open_store
from kneepoint.store.models import HOUR, MINUTE, RAW, ReplicaSampleRow
from kneepoint.store.rollup import rollup
from kneepoint.store.writer import ensure_targets, record_gpus, record_replica
from tests.conftest import DCGM_T4, VLLM_032, read

BASE = parse_vllm(read(VLLM_032))
DAY = 86400.0


def sample(generated: float, running: float = 1.0, usage: float = 0.5) -> ReplicaSample:
    copied = copy.deepcopy(BASE)
    copied.counters["generation_tokens"] = generated
    copied.gauges["requests_running"] = running
    copied.gauges["kv_cache_usage"] = usage
    return copied


@pytest.fixture
def sessions(fresh_url):  # type: ignore[no-untyped-def]
    return open_store(fresh_url())


def write(sessions, points: list[tuple[float, ReplicaSample]]) -> int:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        target = ensure_targets(session, [("r", "vllm", "http://x/metrics")])["r"]
        for ts, point in points:
            record_replica(session, target, ts, point)
    return target


def raw_increase_since(points: list[tuple[float, ReplicaSample]], start: float) -> float | None:
    """What increase() over the raw samples from `start` on says: rollups must agree."""
    return increase([p.counters["generation_tokens"] for ts, p in points if ts >= start])


def frame(sessions):  # type: ignore[no-untyped-def]
    with sessions() as session:
        return queries.replica_frame(session, 0, 1e12, coarsest=RAW)


def test_migrations_create_every_table_and_sqlite_runs_in_wal_mode(sessions) -> None:  # type: ignore[no-untyped-def]
    engine = sessions.kw["bind"]
    tables = set(inspect(engine).get_table_names())
    assert {
        "targets",
        "replica_samples",
        "gpu_samples",
        "gpus",
        "scrape_errors",
        "histogram_layouts",
        "job_health",
        "alembic_version",
    } <= tables
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA busy_timeout")).scalar() >= 5000


def test_a_replica_sample_reads_back_exactly(sessions) -> None:  # type: ignore[no-untyped-def]
    write(sessions, [(100.0, BASE)])
    row = frame(sessions).iloc[0]
    for name, value in BASE.counters.items():
        assert (row[name] if value is not None else None) == value or (
            value is None and row[name] != row[name]
        )  # NaN for SQL NULL
    with sessions() as session:
        layouts = queries.histogram_layouts(session)
    [ttft] = queries.histograms(frame(sessions)["hist_ttft"], layouts)
    assert ttft == BASE.histograms["ttft"]


def test_gpu_readings_keep_their_identity(sessions) -> None:  # type: ignore[no-untyped-def]
    gpus = parse_dcgm(read(DCGM_T4), default_host="node")
    with sessions.begin() as session:
        target = ensure_targets(session, [("node", "dcgm", "http://x/m")])["node"]
        record_gpus(session, target, 100.0, gpus)
    with sessions() as session:
        gpu = queries.gpu_frame(session, 0, 1e12).iloc[0]
    assert (gpu["host"], gpu["gpu_index"], gpu["model"]) == ("cp-bm14r7", 0, "Tesla T4")
    assert gpu["gr_engine_active"] == pytest.approx(0.156205)
    assert gpu["energy_mj"] == 15152422938


histograms = st.lists(st.integers(0, 10**9), min_size=1, max_size=30).map(
    lambda deltas: Histogram(
        (*tuple(float(i) for i in range(len(deltas) - 1)), float("inf")),
        tuple(float(sum(deltas[: i + 1])) for i in range(len(deltas))),
        float(sum(deltas)) * 0.37,
    )
)


@given(histograms)
def test_histogram_encoding_round_trips(histogram: Histogram) -> None:
    encoded = encode_histogram(7, histogram)
    assert decode_histogram(encoded, {7: histogram.bounds}) == histogram


def test_rollup_thins_a_day_to_one_row_per_minute_and_keeps_increase_exact(sessions) -> None:  # type: ignore[no-untyped-def]
    # A day at 15 s with an engine restart at noon.
    points = []
    total = 0.0
    for step in range(5760):
        total = total + 40 if step != 2880 else 7.0
        points.append((step * 15.0, sample(total, running=step % 7, usage=(step % 10) / 10)))
    write(sessions, points)
    with sessions.begin() as session:
        result = rollup(session, now=3 * DAY, retention=Retention())
    after = frame(sessions)
    assert set(after.resolution) == {MINUTE}
    assert 1440 <= len(after) <= 1442  # one per minute, plus the sample before the restart
    assert result.thinned == 5760 - len(after)
    assert increase(list(after.generation_tokens)) == raw_increase_since(points, after.ts.iloc[0])
    # Gauges: the minute's mean and peak.
    first = after.iloc[0]
    assert first.requests_running == pytest.approx(sum(s % 7 for s in range(4)) / 4)
    assert first.requests_running_peak == 3
    assert first.kv_cache_usage_peak == pytest.approx(0.3)


def test_rollup_goes_on_to_hours_and_then_forgets(sessions) -> None:  # type: ignore[no-untyped-def]
    write(sessions, [(step * 15.0, sample(step * 10.0)) for step in range(480)])  # two hours
    retention = Retention(raw=3600, minute=2 * 3600, hour=10 * 3600)
    with sessions.begin() as session:
        rollup(session, now=5 * 3600, retention=retention)
    after = frame(sessions)
    assert list(after.resolution) == [HOUR, HOUR]
    assert increase(list(after.generation_tokens)) == (479 - 239) * 10.0
    with sessions.begin() as session:
        rollup(session, now=20 * 3600, retention=retention)
    assert frame(sessions).empty


def test_rollup_leaves_recent_rows_raw_and_is_idempotent(sessions) -> None:  # type: ignore[no-untyped-def]
    write(sessions, [(DAY + step * 15.0, sample(step)) for step in range(40)])
    for _ in range(2):
        with sessions.begin() as session:
            rollup(session, now=DAY + 600, retention=Retention())
        assert set(frame(sessions).resolution) == {RAW}
        assert len(frame(sessions)) == 40


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.booleans()), min_size=2, max_size=120))
def test_rollup_never_changes_a_counter_s_increase(fresh_url, steps) -> None:  # type: ignore[no-untyped-def]
    sessions = open_store(fresh_url())
    value, points = 0.0, []
    for index, (delta, restart) in enumerate(steps):
        value = float(delta) if restart else value + delta
        points.append((index * 7.0, sample(value)))
    write(sessions, points)
    with sessions.begin() as session:
        rollup(session, now=1e6, retention=Retention(raw=1, minute=2, hour=1e9))
    after = frame(sessions)
    # Between any two kept samples the increase is exact (before the first kept sample of a
    # series, finer than one bucket, there is nothing left to measure from).
    assert increase(list(after.generation_tokens)) == raw_increase_since(points, after.ts.iloc[0])


def test_target_rows_keep_the_replica_s_cache_configuration(sessions) -> None:  # type: ignore[no-untyped-def]
    write(sessions, [(1.0, BASE)])
    with sessions() as session:
        target = queries.targets(session)["r"]
        assert session.scalars(select(ReplicaSampleRow)).one().engines == 1
    assert (target.block_size, target.num_gpu_blocks, target.capacity_tokens) == (
        128,
        16384,
        2097152,
    )
    assert target.generation == "v1" and target.up is True


def test_the_app_reads_while_the_collector_writes(fresh_url) -> None:  # type: ignore[no-untyped-def]
    """WAL and the busy timeout: a reader and a writer on one file never see 'locked'."""
    import threading

    url = fresh_url()
    writer_sessions, reader_sessions = open_store(url), open_store(url)
    target = write(writer_sessions, [(0.0, BASE)])
    errors: list[BaseException] = []
    done = threading.Event()

    def collector() -> None:
        try:
            for step in range(1, 200):
                with writer_sessions.begin() as session:
                    record_replica(session, target, step * 15.0, sample(step * 10.0))
        except BaseException as error:  # the test reports it below
            errors.append(error)
        finally:
            done.set()

    thread = threading.Thread(target=collector)
    thread.start()
    reads = 0
    while not done.is_set():
        with reader_sessions() as session:
            queries.replica_frame(session, 0, 1e9)
        reads += 1
    thread.join()
    assert not errors
    assert reads > 0
    assert len(frame(reader_sessions)) == 200


def test_the_migrations_build_exactly_the_models_schema(fresh_url) -> None:  # type: ignore[no-untyped-def]
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from kneepoint.store.db import make_engine, migrate
    from kneepoint.store.models import Base

    engine = make_engine(fresh_url())
    migrate(engine)
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
