"""alert states and history

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 13:55:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("fingerprint", sa.String(length=32), nullable=False),
        sa.Column("rule", sa.String(length=200), nullable=False),
        sa.Column("replica", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("pending_since", sa.Float(), nullable=True),
        sa.Column("fired_at", sa.Float(), nullable=True),
        sa.Column("resolved_at", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("fingerprint"),
    )
    op.create_table(
        "alert_history",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=32), nullable=False),
        sa.Column("rule", sa.String(length=200), nullable=False),
        sa.Column("replica", sa.String(length=200), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("before", sa.String(length=16), nullable=True),
        sa.Column("after", sa.String(length=16), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("alert_history") as batch:
        batch.create_index("ix_alert_history_fingerprint", ["fingerprint"])
        batch.create_index("ix_alert_history_ts", ["ts"])


def downgrade() -> None:
    op.drop_table("alert_history")
    op.drop_table("alerts")
