"""vLLM 0.32's new families per replica: load shedding, the model's FLOPs and bytes, cached
prompt tokens by tier, a KV connector's lookups, prefill actually computed, the multimodal
cache, corrupted requests, KV offload; the sleep level, LoRA adapters and the offload tier's
occupancy; tokens per engine step; and the latest scrape's LoRA adapters on the target

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05 19:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

# samples.REPLICA_COUNTERS and REPLICA_GAUGES added with this revision.
FLOATS = (
    "admission_rejections",
    "estimated_flops",
    "estimated_read_bytes",
    "estimated_write_bytes",
    "prompt_tokens_cached_device",
    "prompt_tokens_cached_host",
    "prompt_tokens_cached_p2p",
    "prompt_tokens_cached_disk",
    "prompt_tokens_cached_external",
    "external_prefix_cache_queries",
    "external_prefix_cache_hits",
    "prefill_kv_computed_tokens_sum",
    "prefill_kv_computed_tokens_count",
    "mm_cache_queries",
    "mm_cache_hits",
    "corrupted_requests",
    "kv_offload_load_bytes",
    "kv_offload_store_bytes",
    "sleep_level",
    "lora_adapters_running",
    "lora_adapters_waiting",
    "kv_offload_usage",
)
TEXTS = ("hist_iteration_tokens",)  # samples.LOAD_HISTOGRAMS


def upgrade() -> None:
    # In the samples and their summary tiers (a summary row keeps counters exact).
    for table in ("replica_samples", "replica_rollups"):
        with op.batch_alter_table(table) as batch:
            for column in FLOATS:
                batch.add_column(sa.Column(column, sa.Float(), nullable=True))
            for column in TEXTS:
                batch.add_column(sa.Column(column, sa.Text(), nullable=True))
    with op.batch_alter_table("targets") as batch:
        batch.add_column(sa.Column("lora_adapters", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("targets") as batch:
        batch.drop_column("lora_adapters")
    for table in ("replica_samples", "replica_rollups"):
        with op.batch_alter_table(table) as batch:
            for column in (*FLOATS, *TEXTS):
                batch.drop_column(column)
