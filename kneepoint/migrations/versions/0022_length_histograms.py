"""each finished request's prompt and output lengths per replica (vLLM's request_prompt_tokens
and request_generation_tokens histograms), which the what-if replays bucket by bucket

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05 22:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

TEXTS = ("hist_prompt_length", "hist_output_length")  # samples.LOAD_HISTOGRAMS


def upgrade() -> None:
    # In the samples and their summary tiers (a summary row keeps its bucket's last).
    for table in ("replica_samples", "replica_rollups"):
        with op.batch_alter_table(table) as batch:
            for column in TEXTS:
                batch.add_column(sa.Column(column, sa.Text(), nullable=True))


def downgrade() -> None:
    for table in ("replica_samples", "replica_rollups"):
        with op.batch_alter_table(table) as batch:
            for column in TEXTS:
                batch.drop_column(column)
