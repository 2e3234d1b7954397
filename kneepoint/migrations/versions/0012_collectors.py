"""collector membership: each running collector's row, beaten every few seconds, for the
split of the targets and the leader of several collectors on one database
(collectors/cluster.py)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "collectors",
        sa.Column("id", sa.String(length=120), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("last_seen_at", sa.Float(), nullable=False),
        # When it last became the leader (None: never); who leads now is who holds the lock.
        sa.Column("leader_since", sa.Float(), nullable=True),
        # How many targets it held at its last round (None: no round yet).
        sa.Column("targets", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("collectors")
