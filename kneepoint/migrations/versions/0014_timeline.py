"""the timeline: each replica's configuration when it changed, annotations posted from
outside, and dcgm-exporter's clock-event reasons per GPU sample (kneepoint/timeline.py)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 13:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "target_configs",
        sa.Column("target_id", sa.Integer(), sa.ForeignKey("targets.id"), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("target_id", "ts"),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "annotations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("replica", sa.String(200), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("author", sa.String(320), nullable=False),
    )
    op.create_index("ix_annotations_ts", "annotations", ["ts"])
    for table in ("gpu_samples", "gpu_rollups"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("clock_events", sa.Float(), nullable=True))


def downgrade() -> None:
    for table in ("gpu_rollups", "gpu_samples"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("clock_events")
    op.drop_index("ix_annotations_ts", "annotations")
    op.drop_table("annotations")
    op.drop_table("target_configs")
