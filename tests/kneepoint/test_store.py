from __future__ import annotations

import copy
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config as AlembicConfig
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event, inspect, select, text

from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import parse_vllm
from kneepoint.config import Retention
from kneepoint.counters import increase
from kneepoint.samples import Histogram, ReplicaSample
from kneepoint.store import queries
from kneepoint.store.codec import decode_histogram, encode_histogram
from kneepoint.store.db import alembic_config, open_store
from kneepoint.store.models import HOUR, MINUTE, RAW, ReplicaSampleRow
from kneepoint.store.rollup import rollup, rollup_in_slices
from kneepoint.store.writer import (
    ensure_targets,
    record_gpus,
    record_replica,
    record_replica_history,
)
from tests.conftest import DCGM_T4, ROOT, VLLM_032, read

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


# --- Rollups in slices -------------------------------------------------------------------

TWELVE_HOURS = [(step * 15.0, step) for step in range(12 * 240)]
SHORT = Retention(raw=3600, minute=4 * 3600, hour=10 * 3600)


def seed_two_replicas(sessions) -> None:  # type: ignore[no-untyped-def]
    """Twelve hours of two replicas at 15 s, each with an engine restart."""
    with sessions.begin() as session:
        ids = ensure_targets(session, [(n, "vllm", f"http://{n}/m") for n in ("a", "b")])
        for name, target in ids.items():
            restart = 1000 if name == "a" else 2500
            history = [
                (ts, sample(step * 40.0 if step < restart else (step - restart) * 3.0, step % 5))
                for ts, step in TWELVE_HOURS
            ]
            record_replica_history(session, target, history)


def dump(sessions) -> dict[str, list[tuple[object, ...]]]:  # type: ignore[no-untyped-def]
    with sessions() as session:
        return {
            table: sorted(tuple(row) for row in session.execute(text(f"SELECT * FROM {table}")))
            for table in ("replica_samples", "replica_rollups", "rollup_progress")
        }


def test_a_rollup_in_slices_leaves_the_store_exactly_as_one_transaction_does(fresh_url) -> None:  # type: ignore[no-untyped-def]
    whole, sliced = open_store(fresh_url()), open_store(fresh_url())
    for sessions in (whole, sliced):
        seed_two_replicas(sessions)
    with whole.begin() as session:
        expected = rollup(session, now=12 * 3600.0, retention=SHORT)
    result = rollup_in_slices(sliced, now=12 * 3600.0, retention=SHORT)
    assert result == expected
    assert result.thinned > 0 and result.expired > 0 and result.summarized > 0
    assert dump(sliced) == dump(whole)


def test_a_large_rollup_commits_bounded_slices_and_a_writer_gets_in_between_them(
    tmp_path: Path,
) -> None:
    """SQLite's write lock is the rollup's for one slice at a time: every commit lets another
    connection write at once (busy timeout 0: it would fail on the lock), and no slice
    writes more than a bounded number of rows, however much there is to do."""
    import sqlite3

    url = f"sqlite:///{tmp_path / 'k.db'}"  # SQLite's single write lock is what this is about
    sessions = open_store(url)
    seed_two_replicas(sessions)
    engine = sessions.kw["bind"]
    written, per_commit = [0], []

    @event.listens_for(engine, "after_cursor_execute")
    def count(_conn, cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            written[0] += max(cursor.rowcount, 0)

    other = sqlite3.connect(engine.url.database, timeout=0, isolation_level=None)
    other.execute("PRAGMA busy_timeout=0")
    between: list[int] = []

    @event.listens_for(sessions, "after_commit")
    def another_writer(_session) -> None:  # type: ignore[no-untyped-def]
        per_commit.append(written[0])
        written[0] = 0
        other.execute(  # raises "database is locked" if the rollup still held the lock
            "INSERT INTO job_health (job_id, runs, failures) VALUES (?, 0, 0)",
            (f"writer-{len(between)}",),
        )
        between.append(len(per_commit))

    result = rollup_in_slices(sessions, now=12 * 3600.0, retention=SHORT)
    assert len(between) == len(per_commit) > 50  # a write got in after every slice
    total = sum(per_commit)
    assert total > 5000, per_commit  # a large rollup (rows thinned, summarized, expired)…
    assert max(per_commit) <= 500, per_commit  # …in slices of a bounded size
    assert result.thinned > 0
    assert other.execute("SELECT count(*) FROM job_health").fetchone() == (len(between),)


# --- Retention of the logs -----------------------------------------------------------------


def test_retention_prunes_settled_notifications_old_history_ended_silences_and_errors(
    fresh_url,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    from kneepoint.store import rollup as rollups
    from kneepoint.store.models import (
        AlertHistoryRow,
        NotificationRow,
        ScrapeErrorRow,
        SilenceRow,
    )

    monkeypatch.setattr(rollups, "DELETE_BATCH", 7)  # several batches per log
    sessions = open_store(fresh_url())
    now = 400 * DAY
    old, recent = now - 100 * DAY, now - DAY
    with sessions.begin() as session:
        target = ensure_targets(session, [("r", "vllm", "http://x/metrics")])["r"]
        for index in range(20):
            for state in ("sent", "failed", "expired", "pending"):
                for created in (old, recent):
                    session.add(
                        NotificationRow(
                            channel="c",
                            fingerprint="f",
                            notice="{}",
                            state=state,
                            attempts=0,
                            next_attempt_at=created,
                            created_at=created + index,
                        )
                    )
            for ts in (old, recent):
                session.add(
                    AlertHistoryRow(
                        fingerprint="f", rule="x", replica="r", ts=ts + index, after="firing"
                    )
                )
                session.add(ScrapeErrorRow(target_id=target, ts=ts + index, error="e"))
            for ends in (old, recent, now + DAY):
                session.add(
                    SilenceRow(
                        matchers="{}",
                        starts_at=ends - 3600,
                        ends_at=ends + index,
                        author="a",
                        comment="",
                        created_at=ends - 3600,
                    )
                )
    result = rollup_in_slices(sessions, now, Retention())
    with sessions() as session:
        # Settled notifications go after 30 days; one still pending stays, however old.
        kept = session.execute(select(NotificationRow.state, NotificationRow.created_at)).all()
        assert {(s, c < recent) for s, c in kept} == {
            ("sent", False),
            ("failed", False),
            ("expired", False),
            ("pending", False),
            ("pending", True),
        }
        assert len(kept) == 5 * 20
        assert min(session.scalars(select(AlertHistoryRow.ts))) >= recent  # 90 days
        assert min(session.scalars(select(ScrapeErrorRow.ts))) >= recent  # 7 days
        ends = set(session.scalars(select(SilenceRow.ends_at)))
        assert min(ends) >= recent and len(ends) == 40  # ended 30 days ago: gone
    assert result.pruned == 3 * 20 + 20 + 20 + 20


# --- Bounded reads ---------------------------------------------------------------------------


def test_the_delivery_log_and_alert_history_read_at_most_a_page_newest_first(sessions) -> None:  # type: ignore[no-untyped-def]
    from kneepoint.store.models import AlertHistoryRow, NotificationRow

    with sessions.begin() as session:
        for index in range(queries.PAGE_ROWS + 50):
            session.add(
                NotificationRow(
                    channel="c",
                    fingerprint="f",
                    notice="{}",
                    state="sent",
                    attempts=1,
                    next_attempt_at=index,
                    created_at=float(index),
                )
            )
            session.add(
                AlertHistoryRow(fingerprint="f", rule="x", replica="", ts=index, after="firing")
            )
    with sessions() as session:
        log = queries.notifications(session, 0, 1e9)
        history = queries.alert_history(session, 0, 1e9)
    assert len(log) == len(history) == queries.PAGE_ROWS
    assert log.created_at.iloc[0] == queries.PAGE_ROWS + 49  # the newest
    assert history.ts.iloc[-1] == 50  # the oldest of the newest page


# --- Migrations: one command runs them, every other process checks ---------------------------


def config_for(folder, url: str):  # type: ignore[no-untyped-def]
    path = folder / "kneepoint.yaml"
    path.write_text(f"database: '{url}'\n")
    return path


def test_processes_do_not_migrate_they_say_what_to_run_and_exit_2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from kneepoint.cli import app
    from kneepoint.store.db import current_revision, head_revision, make_engine

    database = tmp_path / "k.db"
    config = config_for(tmp_path, f"sqlite:///{database}")
    hint = f"run `kneepoint migrate --config {config}`"
    for args in (["status"], ["health"], ["collect", "--once"], ["alerts", "list"]):
        result = CliRunner().invoke(app, [*args, "--config", str(config)])
        assert result.exit_code == 2, (args, result.output)
        assert f"database file {database} does not exist: {hint}" in result.output
        assert not database.exists()  # nothing created on the way
    # A database one migration behind: still exit 2, naming both revisions.
    engine = make_engine(f"sqlite:///{database}")
    alembic = alembic_config(engine)
    with engine.begin() as connection:
        alembic.attributes["connection"] = connection
        command.upgrade(alembic, _previous(head_revision()))
    behind = current_revision(engine)
    result = CliRunner().invoke(app, ["status", "--config", str(config)])
    assert result.exit_code == 2
    assert f"is at schema revision {behind} and this kneepoint needs {head_revision()}" in (
        result.output
    )
    assert hint in result.output
    assert current_revision(engine) == behind  # status left it as it was
    migrated = CliRunner().invoke(app, ["migrate", "--config", str(config)])
    assert migrated.exit_code == 0, migrated.output
    assert f"migrated from {behind} to schema revision {head_revision()}" in migrated.output
    again = CliRunner().invoke(app, ["migrate", "--config", str(config)])
    assert f"already at schema revision {head_revision()}" in again.output
    assert CliRunner().invoke(app, ["status", "--json", "--config", str(config)]).exit_code == 0


def _previous(revision: str) -> str:
    from alembic.script import ScriptDirectory

    from kneepoint.store.db import MIGRATIONS

    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS))
    down = ScriptDirectory.from_config(config).get_revision(revision).down_revision
    assert isinstance(down, str)
    return down


def test_two_migrations_at_once_both_succeed_and_build_the_schema_once(fresh_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """On PostgreSQL an advisory lock, on SQLite the write lock: the second waits, then
    finds the schema at head."""
    from kneepoint.store.db import current_revision, head_revision, make_engine

    url = fresh_url()
    config = config_for(tmp_path, url)
    command_line = [sys.executable, "-m", "kneepoint.cli", "migrate", "--config", str(config)]
    both = [
        subprocess.Popen(command_line, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    said = [process.communicate(timeout=120) for process in both]
    assert [process.returncode for process in both] == [0, 0], said
    outputs = sorted(out for out, _ in said)
    head = head_revision()
    assert outputs == [
        f"database {_shown(url)}: already at schema revision {head}\n",
        f"database {_shown(url)}: migrated from empty to schema revision {head}\n",
    ]
    assert current_revision(make_engine(url)) == head


def _shown(url: str) -> str:
    from kneepoint.cliutil import shown_url

    return shown_url(url)


def test_the_app_says_what_to_run_when_the_database_is_not_migrated(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from streamlit.testing.v1 import AppTest

    # The package first: AppTest puts the page's folder (app/screens, with alerts.py) first on
    # sys.path, where `import alerts` would find the Alerts page instead (as tests/app does).
    import alerts.evaluate  # noqa: F401

    config = config_for(tmp_path, f"sqlite:///{tmp_path / 'k.db'}")
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    page = AppTest.from_file(str(ROOT / "app" / "screens" / "health.py"), default_timeout=60)
    page.run()
    [error] = page.error
    assert "does not exist: run `kneepoint migrate --config" in error.value
    assert not (tmp_path / "k.db").exists()


def test_connect_store_refuses_a_missing_file_without_creating_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kneepoint.store.db import SchemaError, connect_store

    with pytest.raises(SchemaError, match="does not exist"):
        connect_store(f"sqlite:///{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()


def test_an_unreachable_server_is_exit_1_and_the_password_is_never_shown(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from kneepoint.cli import app
    from tests.conftest import free_port

    url = f"postgresql+psycopg://kneepoint:s3cret-pw@127.0.0.1:{free_port()}/kneepoint"
    config = config_for(tmp_path, url)
    for args in (["migrate"], ["status"], ["health"]):
        result = CliRunner().invoke(app, [*args, "--config", str(config)])
        assert result.exit_code == 1, result.output  # not a schema matter: not exit 2
        # The user info is masked whole (kneepoint/secrets.py redact_url).
        assert "postgresql+psycopg://***@127.0.0.1:" in result.output
        assert "Connection refused" in result.output
        assert "s3cret-pw" not in result.output


_SHARED_LOCK_PROBE = """
import fcntl, os, sys
descriptor = os.open(sys.argv[1], os.O_RDWR)
try:  # SQLite's shared-lock range of the database file (PENDING_BYTE + 2, 510 bytes)
    fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB, 510, 0x40000002, 0)
    print("free")
except OSError:
    print("held")
"""


def test_opening_a_connection_keeps_the_locks_of_the_process_s_other_connections(
    tmp_path: Path,
) -> None:
    """An open WAL connection holds a shared lock on the database file, which tells another
    process closing its last connection not to checkpoint and delete the WAL under it.
    Closing any descriptor of the file drops every POSIX lock the process holds on it: when
    opening a connection read the file's header with open(), the demo's database was
    corrupted ('database disk image is malformed'). Here a second connection is opened while
    the first is idle; another process must still find the first one's shared lock."""
    from kneepoint.store.db import make_engine

    database = tmp_path / "k.db"
    url = f"sqlite:///{database}"

    def lock_on_the_file() -> str:
        probe = [sys.executable, "-c", _SHARED_LOCK_PROBE, str(database)]
        return subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()

    first = make_engine(url)
    with first.connect() as reading:
        reading.exec_driver_sql("SELECT count(*) FROM sqlite_master").all()
        assert lock_on_the_file() == "held"  # the probe can see the lock
        for _ in range(3):
            with make_engine(url).connect() as another:
                another.exec_driver_sql("SELECT 1").all()
        assert lock_on_the_file() == "held"


def _connect_at_the_barrier(url: str, barrier, errors) -> None:  # type: ignore[no-untyped-def]
    from kneepoint.store.db import make_engine

    engine = make_engine(url)
    barrier.wait()
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("CREATE TABLE IF NOT EXISTS seen (pid INTEGER)")
            connection.exec_driver_sql(f"INSERT INTO seen VALUES ({os.getpid()})")
            connection.commit()
    except Exception as error:  # reported to the parent, which fails
        errors.put(repr(error))


def test_processes_opening_one_new_sqlite_file_at_once_all_connect(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A new file is switched to WAL once, before any connection opens it. Switched by each
    connection as it opened, several processes at once made SQLite refuse some with
    'database is locked' (the busy timeout not consulted; `kneepoint migrate` twice at once
    failed so in CI, and retrying still failed 2 of 200 rounds), and a connection that had
    opened the empty file in rollback mode could fail its first write with 'disk I/O error'.
    Thirty rounds of three processes, each writing a row; every file ends in WAL with all
    three rows."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    for round_number in range(30):
        url = f"sqlite:///{tmp_path / f'round-{round_number}.db'}"
        barrier, errors = context.Barrier(3), context.Queue()
        processes = [
            context.Process(target=_connect_at_the_barrier, args=(url, barrier, errors))
            for _ in range(3)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=120)
        assert [process.exitcode for process in processes] == [0, 0, 0]
        assert errors.empty(), f"round {round_number}: {errors.get()}"
        with sqlite3.connect(tmp_path / f"round-{round_number}.db") as check:
            assert check.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert check.execute("SELECT count(*) FROM seen").fetchone()[0] == 3
