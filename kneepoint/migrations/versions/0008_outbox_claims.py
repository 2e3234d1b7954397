"""outbox claims: a lease per notification, what a re-send may have doubled, the alerts a
row carries

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 05:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("notifications") as batch:
        batch.add_column(sa.Column("claimed_by", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("claimed_until", sa.Float(), nullable=True))
        batch.add_column(sa.Column("maybe_sent", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("resends", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("alert_keys", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("notifications") as batch:
        batch.drop_column("alert_keys")
        batch.drop_column("resends")
        batch.drop_column("maybe_sent")
        batch.drop_column("claimed_until")
        batch.drop_column("claimed_by")
