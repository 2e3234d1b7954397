"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 09:53:04.142380
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "histogram_layouts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("bounds", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("bounds"),
    )
    op.create_table(
        "job_health",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("last_run_at", sa.Float(), nullable=True),
        sa.Column("last_success_at", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_table(
        "targets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("up", sa.Boolean(), nullable=True),
        sa.Column("last_scrape_at", sa.Float(), nullable=True),
        sa.Column("last_success_at", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("generation", sa.String(length=16), nullable=True),
        sa.Column("engines", sa.Integer(), nullable=True),
        sa.Column("model_names", sa.Text(), nullable=True),
        sa.Column("cache_dtype", sa.String(length=32), nullable=True),
        sa.Column("block_size", sa.Integer(), nullable=True),
        sa.Column("num_gpu_blocks", sa.Integer(), nullable=True),
        sa.Column("capacity_tokens", sa.Integer(), nullable=True),
        sa.Column("prefix_caching", sa.Boolean(), nullable=True),
        sa.Column("gpu_memory_utilization", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "gpus",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=64), nullable=True),
        sa.Column("model", sa.String(length=100), nullable=True),
        sa.Column("pod", sa.String(length=200), nullable=True),
        sa.Column("namespace", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(
            ["target_id"],
            ["targets.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("target_id", "host", "gpu_index"),
    )
    op.create_table(
        "replica_samples",
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("resolution", sa.Integer(), nullable=False),
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
        sa.PrimaryKeyConstraint("target_id", "ts"),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "scrape_errors",
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["target_id"],
            ["targets.id"],
        ),
        sa.PrimaryKeyConstraint("target_id", "ts"),
    )
    with op.batch_alter_table("scrape_errors", schema=None) as batch_op:
        batch_op.create_index("ix_scrape_errors_ts", ["ts"], unique=False)

    op.create_table(
        "gpu_samples",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("resolution", sa.Integer(), nullable=False),
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
        sa.PrimaryKeyConstraint("gpu_id", "ts"),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("gpu_samples")
    with op.batch_alter_table("scrape_errors", schema=None) as batch_op:
        batch_op.drop_index("ix_scrape_errors_ts")

    op.drop_table("scrape_errors")
    op.drop_table("replica_samples")
    op.drop_table("gpus")
    op.drop_table("targets")
    op.drop_table("job_health")
    op.drop_table("histogram_layouts")
