"""SLO running sums per target and 5-minute bucket (slo_sums, slo_sum_progress): what a
burn-rate round adds up instead of reading days of rows (kneepoint/store/slo_sums.py)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-09 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Empty at first: the collector's evaluation writes the buckets from the samples kept.
    op.create_table(
        "slo_sums",
        sa.Column("target_id", sa.Integer(), sa.ForeignKey("targets.id"), primary_key=True),
        sa.Column("bucket", sa.Float(), primary_key=True),
        sa.Column("first_ts", sa.Float(), nullable=False),
        sa.Column("last_ts", sa.Float(), nullable=False),
        sa.Column("sig", sa.Text(), nullable=False),
        sa.Column("inner_break", sa.Boolean(), nullable=False),
        sa.Column("entry_break", sa.Boolean(), nullable=False),
        sa.Column("breaks", sa.Integer(), nullable=False),
        sa.Column("sums", sa.Text(), nullable=False),
        sa.Column("inner", sa.Text(), nullable=False),
        sa.Column("last", sa.Text(), nullable=False),
    )
    op.create_table(
        "slo_sum_progress",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("until", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("slo_sum_progress")
    op.drop_table("slo_sums")
