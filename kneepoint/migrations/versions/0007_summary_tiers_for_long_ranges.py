"""summary tiers for long ranges

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29 15:35:26.321620
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rollup_progress",
        sa.Column("table_name", sa.String(length=64), nullable=False),
        sa.Column("resolution", sa.Integer(), nullable=False),
        sa.Column("until", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("table_name", "resolution"),
    )
    op.create_table(
        "replica_rollups",
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("resolution", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("saturated_seconds", sa.Float(), nullable=True),
        sa.Column("ends_saturated", sa.Boolean(), nullable=True),
        sa.Column("engines", sa.Integer(), nullable=True),
        sa.Column("kv_cache_usage", sa.Float(), nullable=True),
        sa.Column("kv_cache_usage_mean", sa.Float(), nullable=True),
        sa.Column("kv_cache_usage_peak", sa.Float(), nullable=True),
        sa.Column("requests_running", sa.Float(), nullable=True),
        sa.Column("requests_running_peak", sa.Float(), nullable=True),
        sa.Column("requests_waiting", sa.Float(), nullable=True),
        sa.Column("requests_waiting_peak", sa.Float(), nullable=True),
        sa.Column("requests_waiting_capacity", sa.Float(), nullable=True),
        sa.Column("requests_swapped", sa.Float(), nullable=True),
        sa.Column("prefix_cache_hit_rate_gauge", sa.Float(), nullable=True),
        sa.Column("accepted_per_position", sa.Text(), nullable=True),
        sa.Column("preemptions", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.Float(), nullable=True),
        sa.Column("generation_tokens", sa.Float(), nullable=True),
        sa.Column("prefix_cache_queries", sa.Float(), nullable=True),
        sa.Column("prefix_cache_hits", sa.Float(), nullable=True),
        sa.Column("prompt_tokens_local_compute", sa.Float(), nullable=True),
        sa.Column("prompt_tokens_local_cache_hit", sa.Float(), nullable=True),
        sa.Column("prompt_tokens_external", sa.Float(), nullable=True),
        sa.Column("requests_finished_stop", sa.Float(), nullable=True),
        sa.Column("requests_finished_length", sa.Float(), nullable=True),
        sa.Column("requests_finished_abort", sa.Float(), nullable=True),
        sa.Column("requests_finished_error", sa.Float(), nullable=True),
        sa.Column("requests_finished_repetition", sa.Float(), nullable=True),
        sa.Column("request_prompt_tokens_sum", sa.Float(), nullable=True),
        sa.Column("request_prompt_tokens_count", sa.Float(), nullable=True),
        sa.Column("request_generation_tokens_sum", sa.Float(), nullable=True),
        sa.Column("request_generation_tokens_count", sa.Float(), nullable=True),
        sa.Column("spec_decode_drafts", sa.Float(), nullable=True),
        sa.Column("spec_decode_draft_tokens", sa.Float(), nullable=True),
        sa.Column("spec_decode_accepted_tokens", sa.Float(), nullable=True),
        sa.Column("hist_ttft", sa.Text(), nullable=True),
        sa.Column("hist_itl", sa.Text(), nullable=True),
        sa.Column("hist_e2e", sa.Text(), nullable=True),
        sa.Column("hist_queue", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["target_id"],
            ["targets.id"],
        ),
        sa.PrimaryKeyConstraint("target_id", "resolution", "ts"),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "gpu_rollups",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("resolution", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("energy_mj", sa.Float(), nullable=True),
        sa.Column("xid_error", sa.Float(), nullable=True),
        sa.Column("utilization", sa.Float(), nullable=True),
        sa.Column("gr_engine_active", sa.Float(), nullable=True),
        sa.Column("sm_active", sa.Float(), nullable=True),
        sa.Column("tensor_active", sa.Float(), nullable=True),
        sa.Column("dram_active", sa.Float(), nullable=True),
        sa.Column("power_watts", sa.Float(), nullable=True),
        sa.Column("temperature_c", sa.Float(), nullable=True),
        sa.Column("memory_temperature_c", sa.Float(), nullable=True),
        sa.Column("fb_used_mib", sa.Float(), nullable=True),
        sa.Column("fb_free_mib", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["gpu_id"],
            ["gpus.id"],
        ),
        sa.PrimaryKeyConstraint("gpu_id", "resolution", "ts"),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("gpu_rollups")
    op.drop_table("replica_rollups")
    op.drop_table("rollup_progress")
