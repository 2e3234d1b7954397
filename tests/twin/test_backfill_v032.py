"""The demo's backfilled history has vLLM 0.32's new signals: a replica asleep for a stretch
(frozen counters, sleep level 1, an idle GPU), one that sheds only in its overload burst, its
CPU offload tier's hits, and the MFU estimates."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from kneepoint.config import load_config
from kneepoint.demo import write_config
from kneepoint.store import queries
from kneepoint.store.db import connect_store
from kneepoint.store.models import RAW
from kneepoint.twin.backfill import Overload, Sleep, backfill_week
from kneepoint.twin.fleet import Fleet, FleetSpec
from kneepoint.twin.profiles import gpu
from tests.conftest import migrated

SPEC = {
    "nodes": [{"name": "node", "gpus": ["l4", "l4"]}],
    "replicas": [
        {
            "name": "shed",
            "model": "qwen3-4b",
            "node": "node",
            "gpu_memory_utilization": 0.6,
            "max_num_queued_reqs": 24,
            "kv_offload_gib": 16.0,
        },
        {"name": "sleepy", "model": "qwen3-4b", "node": "node", "gpu_index": 1},
    ],
}


def test_the_history_sleeps_sheds_offloads_and_estimates(tmp_path: Path) -> None:
    fleet = Fleet(FleetSpec.model_validate(SPEC)).start()
    try:
        config_file = migrated(write_config(tmp_path, fleet))
        sessions = connect_store(load_config(config_file).database)
        now = (time.time() // 86400) * 86400 - 12 * 3600  # yesterday, 12:00 UTC
        backfill_week(
            sessions,
            fleet,
            {"shed": 19.0, "sleepy": 14.0},
            now,
            days=0.5,
            sleeps={"sleepy": Sleep(start_hour=3.0, hours=2.0, covered_by="shed")},
            overloads={"shed": Overload(hours_ago=4.0, hours=1.0, factor=2.5)},
        )
    finally:
        fleet.stop()
    with sessions() as session:
        ids = {name: t.id for name, t in queries.targets(session).items()}
        frame = queries.replica_frame(session, now - 43200, now, coarsest=RAW)
        gpus = queries.gpu_frame(session, now - 43200, now, coarsest=RAW)
    hour = (frame.ts % 86400) / 3600
    sleepy = frame[frame.target_id == ids["sleepy"]]
    asleep = sleepy[(hour[sleepy.index] >= 3.1) & (hour[sleepy.index] < 4.9)]
    awake = sleepy[(hour[sleepy.index] >= 6) & (hour[sleepy.index] < 8)]
    assert (asleep.sleep_level == 1).all() and (awake.sleep_level == 0).all()
    assert asleep.generation_tokens.diff().dropna().eq(0).all()  # frozen
    assert awake.generation_tokens.diff().dropna().gt(0).any()
    assert sleepy.kv_offload_usage.isna().all() and sleepy.kv_offload_load_bytes.isna().all()
    idle = gpu("l4").idle_watts
    sleepy_gpu = gpus[(gpus.gpu_index == 1) & gpus.ts.isin(asleep.ts)]
    assert len(sleepy_gpu) and (sleepy_gpu.power_watts == idle).all()

    shed = frame[frame.target_id == ids["shed"]]
    shed_hour = hour[shed.index]
    burst = (shed_hour >= 8) & (shed_hour < 9)
    # Under its queue limit through the morning (covering for the sleeper included): no
    # refusals; past it in the burst: refusals.
    before = shed[shed_hour < 8].admission_rejections
    during = shed[burst].admission_rejections
    assert before.max() == before.min() and during.max() > before.max() + 100
    assert shed.prompt_tokens_cached_host.max() > 0
    assert shed.kv_offload_usage.between(0, 1).all() and shed.kv_offload_usage.max() > 0
    # MFU over the burst, from the estimates: a plausible share of the L4's peak.
    window = shed[burst]
    flops = window.estimated_flops.iloc[-1] - window.estimated_flops.iloc[0]
    seconds = window.ts.iloc[-1] - window.ts.iloc[0]
    mfu = flops / seconds / (gpu("l4").bf16_tflops * 1e12)
    assert 0.02 < mfu < 0.6, mfu
    assert pd.notna(shed.estimated_read_bytes).all()
