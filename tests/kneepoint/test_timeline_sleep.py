"""Going to sleep and waking up on the timeline (kneepoint/timeline.py `sleeps`): the pure
detector, and the events read from a store seeded with the real vLLM 0.32 capture whose
stored sleep level changes (a replica put to sleep, deeper, then woken; another always
awake)."""

from __future__ import annotations

import copy
from pathlib import Path

from collectors.engines.vllm import parse_vllm
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets, record_replica
from kneepoint.timeline import events, sleeps
from tests.conftest import VLLM_032, migrated, read

START, STEP = 1_800_000_000.0, 15.0


def test_sleep_and_wake_are_the_level_leaving_and_returning_to_zero() -> None:
    times = [0.0, 15.0, 30.0, 45.0, 60.0, 75.0, 90.0]
    levels: list[float | None] = [0.0, 1.0, None, 1.0, 2.0, 0.0, 0.0]
    found = sleeps("r", times, levels)
    assert [(e.at, e.kind) for e in found] == [(15.0, "sleep"), (60.0, "sleep"), (75.0, "wake")]
    assert "weights offloaded" in found[0].detail
    assert "everything discarded" in found[1].detail
    # The first known level is the baseline: asleep from the start is no event.
    assert sleeps("r", times[:3], [None, 1.0, 1.0]) == []
    # A summary row's mean (asleep for part of its bucket) counts as asleep.
    assert [e.kind for e in sleeps("r", times[:3], [0.0, 0.25, 0.0])] == ["sleep", "wake"]
    # No level (older vLLM, other engines): nothing.
    assert sleeps("r", times[:3], [None, None, None]) == []


def test_a_stored_replica_going_to_sleep_and_waking_is_on_its_timeline(tmp_path: Path) -> None:
    path = tmp_path / "kneepoint.yaml"
    path.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        "targets:\n"
        "  - {name: sleeper, kind: vllm, url: 'http://127.0.0.1:9/a'}\n"
        "  - {name: awake, kind: vllm, url: 'http://127.0.0.1:9/b'}\n"
    )
    config = load_config(migrated(path))
    base = parse_vllm(read(VLLM_032))
    # The sleeper: awake, weights offloaded from sample 20, everything discarded from 30,
    # awake again from 40.
    level = {**dict.fromkeys(range(20, 30), 1.0), **dict.fromkeys(range(30, 40), 2.0)}
    times = [START + i * STEP for i in range(60)]
    sessions = open_store(config.database)
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for i, ts in enumerate(times):
            for name in ids:
                sample = copy.deepcopy(base)
                sample.gauges["sleep_level"] = level.get(i, 0.0) if name == "sleeper" else 0.0
                record_replica(session, ids[name], ts, sample)
    with sessions() as session:
        found = [
            e for e in events(session, config, times[0], times[-1]) if e.kind in ("sleep", "wake")
        ]
        only = events(session, config, times[0], times[-1], replica="awake")
    assert [(e.at, e.replica, e.kind) for e in found] == [
        (times[20], "sleeper", "sleep"),
        (times[30], "sleeper", "sleep"),
        (times[40], "sleeper", "wake"),
    ]
    assert found[0].detail == "went to sleep (weights offloaded)"
    assert found[2].as_dict()["kind"] == "wake"
    assert not [e for e in only if e.kind in ("sleep", "wake")]
