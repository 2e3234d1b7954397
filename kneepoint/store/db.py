"""The one engine and session factory: SQLite in WAL mode by default, any SQLAlchemy URL.

Migrations run in one place, `kneepoint migrate` (`migrate`), serialized by a lock so that two
at once are safe. Every other process opens the store with `connect_store`, which only checks
the schema and says what to run when it is behind. `open_store` migrates then opens: for a
database a process creates for itself (the demo, tests, benches).

A SQLite file is opened for reading and writing but never created by a process that only
connects, and each pooled connection is checked against the file at every checkout: when the
file was deleted, replaced or made read-only (or writable again) since the connection was
opened, the connection is dropped and a new one opened, so a fault surfaces as an error of
the round instead of writes into a deleted file or a read-only connection kept after the
fault cleared.
"""

from __future__ import annotations

import os
import sqlite3
import time
import zlib
from pathlib import Path
from typing import Any
from urllib.request import pathname2url

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, exc, make_url, text
from sqlalchemy.orm import Session, sessionmaker

from kneepoint.secrets import Secret, redact_url, reveal

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
BUSY_TIMEOUT_MS = 10_000
# A refused WAL switch is tried again by a new connection (see _switch_to_wal).
WAL_SWITCH_TRIES = 20
WAL_SWITCH_PAUSE = 0.01  # seconds: lets the switch that won finish
# The key of the PostgreSQL advisory lock that serializes `kneepoint migrate` runs.
MIGRATION_LOCK = zlib.crc32(b"kneepoint migrate")


def _jit_off(connection: Any, _record: Any) -> None:
    """PostgreSQL's JIT compilation off for every connection kneepoint opens. kneepoint's
    reads (unions of summary tiers with window functions) are estimated far above
    jit_above_cost at fleet size; compiling took 7.9 s of an 8.8 s stall-candidate query
    over 2 hours at 200 replicas (EXPLAIN ANALYZE; other queries not profiled). A session
    setting on connect, not a startup `options` parameter, which poolers such as PgBouncer
    refuse; `pg_settings` is filtered so a server without JIT is left as it is."""
    cursor = connection.cursor()
    cursor.execute("SELECT set_config('jit', 'off', false) FROM pg_settings WHERE name = 'jit'")
    cursor.close()
    connection.commit()


class SchemaError(RuntimeError):
    """The database is not at the schema this kneepoint needs; the message says how it is
    off, in words that never include a password."""


def make_engine(given: str | Secret, *, create: bool = True) -> Engine:
    """Create an engine; SQLite gets WAL so the collector writes while the app reads.

    A SQLite file that does not exist is created, unless `create` is False: then opening it
    fails with an error naming the file (connect_store: a process that only connects must
    not leave an empty database where the real one went missing). The busy timeout is
    `?timeout=SECONDS` in the URL, 10 s by default. The URL may be the config's Secret:
    revealed here, to connect, and nowhere else."""
    url = reveal(given)
    if not url.startswith("sqlite"):
        engine = create_engine(url, pool_pre_ping=True)
        event.listen(engine, "connect", _jit_off)
        return engine
    parsed = make_url(url)
    busy_ms = int(float(parsed.query.get("timeout", BUSY_TIMEOUT_MS / 1000)) * 1000)  # type: ignore[arg-type]
    memory = parsed.database in (None, "", ":memory:")
    file = None if memory else Path(os.path.abspath(str(parsed.database)))
    by_uri = not memory and parsed.query.get("uri") is not None
    engine = create_engine(url, connect_args={"timeout": busy_ms / 1000})

    @event.listens_for(engine, "connect")
    def _pragmas(connection, _record) -> None:  # type: ignore[no-untyped-def]
        cursor = connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
        if by_uri:  # a file by its path was switched before this connection opened it
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    if file is not None and not by_uri:
        _guard_file(engine, file, create, busy_ms)
    return engine


def _switch_to_wal(path: Path, busy_ms: int) -> None:
    """Put the file in WAL (kept in the file: every later connection finds it so) before any
    of this process's connections opens it, through short-lived connections of its own.

    Switched by each connection as it opened, a new file shared by several processes at
    once went wrong: SQLite refused some switches at once with "database is locked" (the
    busy timeout not consulted), and a connection that had opened the empty file in rollback
    mode while another switched it was refused at every later try (five within 0.2 ms).
    A fresh connection holds no lock and no stale view of the file, so each try is one: it
    reads the mode (a file already in WAL, every open but the first, costs only this) and
    switches if needed; refused, it is closed and a new one tries after a moment.

    Never open the database file itself here (say, to read its header or to flock it):
    closing any descriptor of a file drops every POSIX lock this process holds on it, the
    locks of its other SQLite connections included, and the file is then written by two
    connections at once (sqlite.org/howtocorrupt.html, 2.2). That corrupted the demo's
    database when this function read the header with open()."""
    uri = f"file:{pathname2url(str(path))}?mode=rwc"
    for tries_left in reversed(range(WAL_SWITCH_TRIES)):
        switcher = sqlite3.connect(uri, uri=True, timeout=busy_ms / 1000)
        try:
            mode = switcher.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                switcher.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or not tries_left:
                raise
        finally:
            switcher.close()
        time.sleep(WAL_SWITCH_PAUSE)


def _guard_file(engine: Engine, path: Path, create: bool, busy_ms: int) -> None:
    """Open `path` read-write (created only with `create`, switched to WAL first), or
    read-only when this process may not write it; drop a pooled connection whose file is
    gone, replaced, or changed between read-only and writable since it was opened."""

    @event.listens_for(engine, "do_connect")
    def _open(_dialect, _record, cargs, cparams) -> None:  # type: ignore[no-untyped-def]
        if not create and not path.exists():
            raise sqlite3.OperationalError(f"database file {path} does not exist")
        # A file this process may not write is opened read-only outright: asked for
        # read-write, SQLite may hand back a descriptor of this process's earlier
        # connections that was opened read-write, and keep writing to it.
        mode = "rwc" if create else ("rw" if os.access(path, os.W_OK) else "ro")
        if mode != "ro":
            _switch_to_wal(path, busy_ms)
        cargs[:] = [f"file:{pathname2url(str(path))}?mode={mode}"]
        cparams["uri"] = True

    @event.listens_for(engine, "connect")
    def _remember(_connection, record) -> None:  # type: ignore[no-untyped-def]
        record.info["file"] = _identity(path)

    @event.listens_for(engine, "checkout")
    def _still_same(_connection, record, _proxy) -> None:  # type: ignore[no-untyped-def]
        if record.info.get("file") != _identity(path):
            # The pool drops this connection and opens a new one, whose own error (no such
            # file, read-only) then reaches the caller.
            raise exc.DisconnectionError(f"database file {path} changed since it was opened")


def _identity(path: Path) -> tuple[int, int, bool] | None:
    """Which file `path` is (device, inode) and whether this process may write it."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, os.access(path, os.W_OK)


def sessions_for(engine: Engine) -> sessionmaker[Session]:
    """The session factory every reader and writer uses."""
    # Histogram layouts rarely change: their ids are cached across sessions, and forgotten on
    # any rollback, which may have undone the row a cached id points to.
    factory = sessionmaker(engine, expire_on_commit=False, info={"histogram_layouts": {}})
    event.listen(
        factory,
        "after_soft_rollback",
        lambda session, _previous: session.info["histogram_layouts"].clear(),
    )
    return factory


def alembic_config(engine: Engine) -> AlembicConfig:
    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option(
        "sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%")
    )
    return config


def head_revision() -> str:
    """The newest migration this kneepoint has."""
    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None: no kneepoint schema yet)."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def hold_migration_lock(connection: Connection) -> None:
    """Serialize migrations until `connection`'s transaction ends: a PostgreSQL advisory lock,
    SQLite's write lock. A second `kneepoint migrate` waits here, then finds the schema at
    head and has nothing to do."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
    elif connection.dialect.name == "sqlite":
        # pysqlite starts no transaction for DDL; this makes the whole upgrade one
        # transaction holding the write lock (pysqlite then commits it as usual).
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def migrate(engine: Engine) -> tuple[str | None, str | None]:
    """Bring the schema to the newest Alembic revision, in one transaction, under a lock.
    Returns the revision found once the lock was held, and the one reached."""
    config = alembic_config(engine)
    with engine.begin() as connection:
        hold_migration_lock(connection)
        before = MigrationContext.configure(connection).get_current_revision()
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        return before, MigrationContext.configure(connection).get_current_revision()


def check_schema(engine: Engine) -> None:
    """Raise SchemaError unless the database is at this kneepoint's newest revision."""
    where = shown(engine)
    head = head_revision()
    current = current_revision(engine)  # an unreachable server raises: not a schema matter
    if current == head:
        return
    if current is None:
        raise SchemaError(f"database {where} has no kneepoint schema yet")
    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS))
    known = {script.revision for script in ScriptDirectory.from_config(config).walk_revisions()}
    if current not in known:
        raise SchemaError(
            f"database {where} is at schema revision {current}, newer than this kneepoint "
            f"knows ({head}); upgrade kneepoint"
        )
    raise SchemaError(
        f"database {where} is at schema revision {current} and this kneepoint needs {head}"
    )


def shown(engine: Engine) -> str:
    """The engine's URL as it may be shown: user info and query values masked."""
    return redact_url(engine.url.render_as_string(hide_password=False))


def connect_store(url: str | Secret) -> sessionmaker[Session]:
    """Open an existing store without migrating it: raise SchemaError when the file is
    missing or the schema is not at head. What every long-running process starts from."""
    missing = _missing_file(url)
    if missing is not None:
        raise SchemaError(f"database file {missing} does not exist")
    engine = make_engine(url, create=False)
    try:
        check_schema(engine)
    except SchemaError:
        engine.dispose()
        raise
    return sessions_for(engine)


def _missing_file(given: str | Secret) -> Path | None:
    """The SQLite file `url` names, when it does not exist."""
    url = reveal(given)
    if not url.startswith("sqlite"):
        return None
    database = make_url(url).database
    if database in (None, "", ":memory:"):
        return None
    path = Path(os.path.abspath(str(database)))
    return None if path.exists() else path


def open_store(url: str | Secret) -> sessionmaker[Session]:
    """Create the database if needed, migrate it, and open it: for a database the caller
    owns alone (the demo, tests, benches); shared stores go through `kneepoint migrate`."""
    engine = make_engine(url)
    migrate(engine)
    return sessions_for(engine)
