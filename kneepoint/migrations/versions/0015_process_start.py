"""the API server process's start time per replica, for the timeline's restarts

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 14:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

COLUMN = "process_start_time"  # samples.REPLICA_LAST_GAUGES


def upgrade() -> None:
    # In the samples and their summary tiers (a summary row keeps its bucket's last).
    for table in ("replica_samples", "replica_rollups"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column(COLUMN, sa.Float(), nullable=True))


def downgrade() -> None:
    for table in ("replica_samples", "replica_rollups"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column(COLUMN)
