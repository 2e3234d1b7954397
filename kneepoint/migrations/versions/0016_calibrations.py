"""calibrated what-if profiles: a replica's fitted step-time model and its fit quality
(kneepoint/whatif/store.py)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01 16:05:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "calibrations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("replica", sa.String(200), nullable=False),
        sa.Column("run_label", sa.String(200), nullable=True),
        sa.Column("fitted_at", sa.Float(), nullable=False),
        sa.Column("shape", sa.Text(), nullable=False),
        sa.Column("coefficients", sa.Text(), nullable=False),
        sa.Column("errors", sa.Text(), nullable=False),
        sa.Column("trusted", sa.Boolean(), nullable=False),
        sa.Column("notes", sa.Text(), nullable=False),
    )
    op.create_index("ix_calibrations_replica", "calibrations", ["replica", "fitted_at"])


def downgrade() -> None:
    op.drop_index("ix_calibrations_replica", "calibrations")
    op.drop_table("calibrations")
