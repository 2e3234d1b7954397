"""prepared state: results the HA leader computes once and every page reads (prepared), the
SLO reports first (kneepoint/store/prepared_rows.py, alerts/slo_prepared.py)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05 13:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Empty at first: the leader's next evaluation writes the SLO reports of its minute.
    op.create_table(
        "prepared",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("as_of", sa.Float(), nullable=False),
        sa.Column("written_at", sa.Float(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.UniqueConstraint("kind", "key", "as_of", name="uq_prepared_kind_key_as_of"),
    )


def downgrade() -> None:
    op.drop_table("prepared")
