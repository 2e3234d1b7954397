"""A stored day of one twin replica (Qwen3-4B on an L4 at 60 % memory: near KV saturation
at its peak), backfilled as `kneepoint demo` does, and a twin sweep of it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kneepoint.config import load_config
from kneepoint.demo import write_config
from kneepoint.store.db import connect_store
from kneepoint.store.runs import save_run
from kneepoint.twin.backfill import backfill_week
from kneepoint.twin.fleet import Fleet, FleetSpec
from kneepoint.twin.ladder import ladder_run
from tests.conftest import migrated

REPLICA = "qwen3-4b-l4"
SPEC = {
    "nodes": [{"name": "gpu-node-2", "gpus": ["l4"]}],
    "replicas": [
        {"name": REPLICA, "model": "qwen3-4b", "node": "gpu-node-2", "gpu_memory_utilization": 0.6}
    ],
}
PEAK_SESSIONS = 19.0
TRUTH_LEVELS, TRUTH_SECONDS = (1, 3, 8, 12, 16, 20, 28, 48), 300.0
DAYS = 1.0


@pytest.fixture(scope="session")
def stored_day(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, float]]:
    folder = tmp_path_factory.mktemp("whatif")
    fleet = Fleet(FleetSpec.model_validate(SPEC)).start()
    try:
        config_file = migrated(write_config(folder, fleet))
        sessions = connect_store(load_config(config_file).database)
        # The day's shape follows the clock (diurnal load, the 10:00 UTC deploy): it ends at
        # the last midnight UTC, so every run replays the same day, whatever the hour (ending
        # at the wall clock, the TTFT p99 ratio moved from run to run across its bound).
        now = float(int(time.time()) // 86400 * 86400)
        # The replay is judged against this day, so the day's own counts must be close to
        # what its agents do: levels near the peak, each measured for five minutes (at the
        # demo's 90 s the stored preemptions near the knee read 3-5× high; backfill.py).
        backfill_week(
            sessions,
            fleet,
            {REPLICA: PEAK_SESSIONS},
            now,
            days=DAYS,
            levels=TRUTH_LEVELS,
            level_seconds=TRUTH_SECONDS,
        )
        replica = fleet.replicas[REPLICA]
        sweep = ladder_run(
            replica.engine.config, f"{REPLICA}-sweep", replica.served_name, (1, 2, 4, 8, 16, 32)
        )
        with sessions.begin() as session:
            save_run(session, sweep, now)
    finally:
        fleet.stop()
    yield config_file, now
