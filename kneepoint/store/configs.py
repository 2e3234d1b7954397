"""Each replica's configuration kept as it changes (table target_configs): the row a scrape
adds only when its configuration differs from the newest one stored for the replica.

`targets` holds only the latest configuration; the timeline (kneepoint/timeline.py) needs
when it changed. One conditional INSERT … SELECT per stored scrape, written in the round's
batch (store/writer.py): the database compares with the newest row (a primary-key lookup),
so the writer reads nothing.
"""

from __future__ import annotations

import json

from sqlalchemy import Float, Integer, Table, Text, bindparam, cast, func, insert, literal, select
from sqlalchemy.sql.expression import Insert

from kneepoint.samples import ReplicaSample
from kneepoint.store.models import TargetConfigRow

CONFIGS: Table = TargetConfigRow.__table__  # type: ignore[assignment]


def config_text(sample: ReplicaSample) -> str:
    """What the timeline compares: the engine and its generation, the model names and the KV
    cache's configuration (`cache_config_info`'s labels), as JSON with sorted keys."""
    cache = sample.cache
    return json.dumps(
        {
            "engine": sample.engine,
            "generation": sample.generation,
            "model_names": sorted(sample.model_names),
            "block_size": cache.block_size,
            "num_gpu_blocks": cache.num_gpu_blocks,
            "cache_dtype": cache.cache_dtype,
            "prefix_caching": cache.enable_prefix_caching,
            "gpu_memory_utilization": cache.gpu_memory_utilization,
        },
        sort_keys=True,
    )


def _statement() -> Insert:
    target = bindparam("target_id", type_=Integer)
    config = bindparam("config", type_=Text)
    newest = (
        select(CONFIGS.c.config)
        .where(CONFIGS.c.target_id == target)
        .order_by(CONFIGS.c.ts.desc())
        .limit(1)
        .scalar_subquery()
    )
    changed = select(
        cast(target, Integer),
        cast(bindparam("ts", type_=Float), Float),
        cast(config, Text),
    ).where(func.coalesce(newest, literal("")) != config)
    return insert(CONFIGS).from_select(["target_id", "ts", "config"], changed)


ADD_IF_CHANGED = _statement()


def changes(target_id: int, samples: list[tuple[float, ReplicaSample]]) -> list[dict[str, object]]:
    """The parameters of ADD_IF_CHANGED for `samples` (oldest first): the first sample of
    each run of one configuration (the database drops the first when it equals the stored
    newest)."""
    rows: list[dict[str, object]] = []
    last = None
    for ts, sample in samples:
        text = config_text(sample)
        if text != last:
            rows.append({"target_id": target_id, "ts": ts, "config": text})
            last = text
    return rows
