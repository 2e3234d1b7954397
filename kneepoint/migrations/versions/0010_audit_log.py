"""the audit trail: every mutation, sign-in and refusal, who, when, what and from where

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(320), nullable=False),
        sa.Column("role", sa.String(20), nullable=True),
        sa.Column("via", sa.String(20), nullable=False),
        sa.Column("address", sa.String(64), nullable=True),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("outcome", sa.String(20), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("before", sa.Text(), nullable=True),
        sa.Column("after", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
    )
    op.create_index("ix_audit_log_ts", "audit_log", ["ts"])


def downgrade() -> None:
    op.drop_index("ix_audit_log_ts", "audit_log")
    op.drop_table("audit_log")
