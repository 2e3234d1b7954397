"""the API server's request counters (all, and 5xx) per replica, for availability SLOs

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 13:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

COUNTERS = ("http_requests", "http_requests_5xx")


def upgrade() -> None:
    # In the samples and their summary tiers (samples.REPLICA_COUNTERS).
    for table in ("replica_samples", "replica_rollups"):
        with op.batch_alter_table(table) as batch:
            for column in COUNTERS:
                batch.add_column(sa.Column(column, sa.Float(), nullable=True))


def downgrade() -> None:
    for table in ("replica_samples", "replica_rollups"):
        with op.batch_alter_table(table) as batch:
            for column in COUNTERS:
                batch.drop_column(column)
