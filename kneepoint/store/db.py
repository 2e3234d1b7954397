"""The one engine and session factory: SQLite in WAL mode by default, any SQLAlchemy URL."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
BUSY_TIMEOUT_MS = 10_000


def make_engine(url: str) -> Engine:
    """Create an engine; SQLite gets WAL so the collector writes while the app reads."""
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _pragmas(connection, _record) -> None:  # type: ignore[no-untyped-def]
        cursor = connection.cursor()
        if url not in ("sqlite://", "sqlite:///:memory:"):
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


def alembic_config(engine: Engine) -> AlembicConfig:
    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return config


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision."""
    config = alembic_config(engine)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def open_store(url: str) -> sessionmaker[Session]:
    """Engine + migrations + session factory: what every reader and writer starts from."""
    engine = make_engine(url)
    migrate(engine)
    # Histogram layouts rarely change: their ids are cached across sessions, and forgotten on
    # any rollback, which may have undone the row a cached id points to.
    factory = sessionmaker(engine, expire_on_commit=False, info={"histogram_layouts": {}})
    event.listen(
        factory,
        "after_soft_rollback",
        lambda session, _previous: session.info["histogram_layouts"].clear(),
    )
    return factory
