"""the engine's step counter per replica (vLLM: iteration_tokens_total's count), for stalled
engines whose scrapes answer while their steps stand still

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01 19:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

COLUMN = "engine_steps"  # samples.REPLICA_COUNTERS


def upgrade() -> None:
    # In the samples and their summary tiers (a summary row keeps counters exact).
    for table in ("replica_samples", "replica_rollups"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column(COLUMN, sa.Float(), nullable=True))


def downgrade() -> None:
    for table in ("replica_samples", "replica_rollups"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column(COLUMN)
