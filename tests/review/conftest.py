"""The demo's backfilled week, shared by the review tests (the backfill takes half a minute)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kneepoint.config import load_config
from kneepoint.demo import FLEET, HISTORY_PEAKS, sweep_runs, write_config
from kneepoint.store.db import open_store
from kneepoint.store.runs import save_run
from kneepoint.twin.backfill import backfill_week
from kneepoint.twin.fleet import Fleet, FleetSpec
from tests.alerts.conftest import receiver  # noqa: F401  (the loopback chat platform)


@pytest.fixture(scope="session")
def demo_week(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, float]]:
    """The demo's store as `kneepoint demo` leaves it: a backfilled week and twin sweeps."""
    folder = tmp_path_factory.mktemp("week")
    fleet = Fleet(FleetSpec.model_validate(FLEET)).start()
    try:
        config_file = write_config(folder, fleet)
        sessions = open_store(load_config(config_file).database)
        now = float(int(time.time()) - 60)
        backfill_week(sessions, fleet, HISTORY_PEAKS, now)
        with sessions.begin() as session:
            for run in sweep_runs(fleet):
                save_run(session, run, now)
    finally:
        fleet.stop()
    yield config_file, now
