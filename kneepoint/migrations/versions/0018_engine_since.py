"""when each replica target's current engine was first seen (targets.engine_since), so an
alert whose metric a newly detected engine does not expose follows its rule's `no_data`
for the rule's `for` instead of resolving at once (alerts/lifecycle.py)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_TARGETS = sa.table(
    "targets",
    sa.column("id", sa.Integer),
    sa.column("engine", sa.String),
    sa.column("engine_since", sa.Float),
)
_CONFIGS = sa.table(
    "target_configs",
    sa.column("target_id", sa.Integer),
    sa.column("ts", sa.Float),
    sa.column("config", sa.Text),
)


def upgrade() -> None:
    with op.batch_alter_table("targets") as batch:
        batch.add_column(sa.Column("engine_since", sa.Float(), nullable=True))
    # Backfilled from the configuration history (target_configs, one row each time a
    # replica's configuration changed, engine included): the first row of the newest run of
    # rows with the target's current engine. Without such a row it stays NULL: not known,
    # which alert evaluation reads as long ago (an engine that has been the same all along).
    connection = op.get_bind()
    engines = {
        target_id: engine
        for target_id, engine in connection.execute(
            sa.select(_TARGETS.c.id, _TARGETS.c.engine).where(_TARGETS.c.engine.is_not(None))
        )
    }
    since: dict[int, float] = {}
    stopped: set[int] = set()
    rows = connection.execute(
        sa.select(_CONFIGS.c.target_id, _CONFIGS.c.ts, _CONFIGS.c.config).order_by(
            _CONFIGS.c.target_id, _CONFIGS.c.ts.desc()
        )
    )
    for target_id, ts, text in rows:  # newest first per target
        if target_id not in engines or target_id in stopped:
            continue
        try:
            engine = json.loads(text).get("engine")
        except (ValueError, AttributeError):
            engine = None
        if engine == engines[target_id]:
            since[target_id] = float(ts)
        else:
            stopped.add(target_id)
    if since:
        connection.execute(
            sa.update(_TARGETS)
            .where(_TARGETS.c.id == sa.bindparam("target_id"))
            .values(engine_since=sa.bindparam("since")),
            [{"target_id": t, "since": s} for t, s in since.items()],
        )


def downgrade() -> None:
    with op.batch_alter_table("targets") as batch:
        batch.drop_column("engine_since")
