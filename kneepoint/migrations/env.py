"""Alembic environment: migrate the connection kneepoint hands over, or the configured URL.

Either way the upgrade runs in one transaction that first takes the migration lock
(store/db.py: hold_migration_lock), so two migrations started at once run one after the
other and the second finds nothing to do."""

from __future__ import annotations

from alembic import context

from kneepoint.store.db import hold_migration_lock, make_engine
from kneepoint.store.models import Base

target_metadata = Base.metadata


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:  # store/db.py: migrate() took the lock already
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.config.get_main_option("sqlalchemy.url") or ""
    engine = make_engine(url)
    with engine.begin() as fresh:
        hold_migration_lock(fresh)
        context.configure(connection=fresh, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations()
