"""each replica target's engine (vllm, sglang, llamacpp, tgi, trtllm) and what it cannot give;
the engine's own speculative-decoding gauges; alert_history.note (why an alert ended without
a value)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

SPEC_GAUGES = ("spec_decode_acceptance_length_gauge", "spec_decode_acceptance_rate_gauge")


def upgrade() -> None:
    with op.batch_alter_table("targets") as batch:
        batch.add_column(sa.Column("engine", sa.String(16), nullable=True))
        # JSON {quantity: reason} of the latest sample (kneepoint/samples.py QUANTITIES).
        batch.add_column(sa.Column("unavailable", sa.Text(), nullable=True))
    # The engine's own speculative-decoding figures (samples.REPLICA_GAUGES), in the samples
    # and their summary tiers.
    for table in ("replica_samples", "replica_rollups"):
        with op.batch_alter_table(table) as batch:
            for column in SPEC_GAUGES:
                batch.add_column(sa.Column(column, sa.Float(), nullable=True))
    with op.batch_alter_table("alert_history") as batch:
        batch.add_column(sa.Column("note", sa.Text(), nullable=True))
    # Every replica stored before engines other than vLLM were read was a vLLM.
    op.execute("UPDATE targets SET engine = 'vllm' WHERE kind = 'vllm'")


def downgrade() -> None:
    with op.batch_alter_table("alert_history") as batch:
        batch.drop_column("note")
    for table in ("replica_samples", "replica_rollups"):
        with op.batch_alter_table(table) as batch:
            for column in SPEC_GAUGES:
                batch.drop_column(column)
    with op.batch_alter_table("targets") as batch:
        batch.drop_column("unavailable")
        batch.drop_column("engine")
