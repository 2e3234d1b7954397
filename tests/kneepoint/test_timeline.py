"""The timeline (kneepoint/timeline.py): each detector on built samples, a trigger and a
non-trigger; then a twin replica restarted, reconfigured, upgraded, throttled and given an
XID, its scrapes rendered by the twin, normalized and stored by the collector's own code:
each event appears once, at its time, in `kneepoint timeline --json` and in the message of
an alert that fires after them."""

from __future__ import annotations

import copy
import itertools
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from alerts import silences
from alerts.channels import Notice, channel
from alerts.lifecycle import FIRING, Alert, Transition
from alerts.messages import enqueue
from collectors.engines.vllm import parse_vllm
from kneepoint.cli import app
from kneepoint.config import Config, Retention, load_config
from kneepoint.samples import CacheConfig, ReplicaSample
from kneepoint.store.db import open_store
from kneepoint.store.models import (
    AlertHistoryRow,
    NotificationRow,
    ReplicaRollupRow,
    TargetConfigRow,
)
from kneepoint.store.rollup import rollup
from kneepoint.store.writer import batch, ensure_targets, record_replica, record_replica_history
from kneepoint.timeline import (
    HIT_RATE_DROP,
    STORM_FACTOR,
    STORM_MIN_RATE,
    alert_events,
    config_changes,
    events,
    gpu_clock_events,
    gpu_xids,
    gpus_gone,
    hit_rate_drops,
    outages,
    prefill_storms,
    restarts,
)
from tests.conftest import VLLM_032, migrated, read
from tests.timeline_scenario import FIRE, STEP, XID_CODE, expected, store_history, write_config

pytestmark = pytest.mark.timeout(120)

# --- the detectors, pure -----------------------------------------------------------------


def test_a_counter_that_falls_is_a_restart_and_one_that_stalls_is_not() -> None:
    times = [0.0, 15.0, 30.0, 45.0]
    found = restarts("r", times, {"prompt_tokens": [100, 200, 5, 5], "preemptions": [0, 0, 0, 0]})
    assert [(e.at, e.kind) for e in found] == [(30.0, "restart")]
    assert "prompt_tokens 200 → 5" in found[0].detail
    assert restarts("r", times, {"prompt_tokens": [100, 100, None, 120]}) == []


def test_an_idle_replica_whose_process_start_time_moves_is_one_restart() -> None:
    times = [0.0, 15.0, 30.0, 45.0]
    idle = {"prompt_tokens": [0.0, 0.0, 0.0, 0.0], "preemptions": [0.0, 0.0, 0.0, 0.0]}
    # Started before the range, restarted between the second and third scrape.
    first, second = times[0] - 3600.0, times[1] + 5.0
    found = restarts("r", times, idle, [first, first, second, second])
    assert [(e.at, e.kind) for e in found] == [(times[2], "restart")]
    assert found[0].detail.startswith("process restarted (started at ")
    assert datetime.fromtimestamp(second, UTC).strftime("%H:%M:%S UTC") in found[0].detail
    # Without the start time the same samples show nothing (counters never fall).
    assert restarts("r", times, idle) == []


def test_a_counter_reset_with_the_start_time_moving_is_one_restart() -> None:
    times = [0.0, 15.0, 30.0, 45.0]
    counters = {"prompt_tokens": [100.0, 200.0, 5.0, 9.0]}
    started = [-100.0, -100.0, 20.0, 20.0]
    found = restarts("r", times, counters, started)
    assert [(e.at, e.kind) for e in found] == [(times[2], "restart")]
    assert "process restarted" in found[0].detail
    assert "prompt_tokens 200 → 5" in found[0].detail


def test_an_unchanged_start_time_is_no_restart() -> None:
    times = [0.0, 15.0, 30.0]
    counters = {"prompt_tokens": [10.0, 20.0, 30.0]}
    assert restarts("r", times, counters, [-50.0, -50.0, -50.0]) == []


def test_a_missing_start_time_falls_back_to_counter_resets() -> None:
    times = [0.0, 15.0, 30.0, 45.0]
    counters = {"prompt_tokens": [100.0, 200.0, 5.0, 5.0]}
    with_none = restarts("r", times, counters, [None, None, None, None])
    without = restarts("r", times, counters)
    assert with_none == without
    assert [(e.at, e.detail.startswith("counters reset")) for e in with_none] == [(times[2], True)]
    # A start time known only on one side of a gap is compared with the last one known.
    gap = restarts("r", times, {"prompt_tokens": [0.0] * 4}, [-9.0, None, None, 40.0])
    assert [e.at for e in gap] == [times[3]]


def test_a_stored_idle_replica_restarted_between_scrapes_is_one_restart_in_raw_and_rollups(
    fresh_url,  # type: ignore[no-untyped-def]
) -> None:
    """The real 0.32 capture, normalized, as an idle replica (every counter 0 before and
    after) whose process start time moves once, mid-bucket: stored, the timeline shows one
    restart there, and the 5-minute summary rows keep each bucket's last start time."""
    before = parse_vllm(read(VLLM_032))
    started = before.gauges["process_start_time"]
    assert started is not None
    before.counters = dict.fromkeys(before.counters, 0.0)
    after = copy.deepcopy(before)
    after.gauges["process_start_time"] = started + 3600.0
    step, first = 15.0, 300.0 * 1000
    times = [first + step * i for i in range(120)]
    restarted = 50  # 750 s in: inside a 5-minute bucket, not at its edge
    sessions = open_store(fresh_url())
    with sessions.begin() as session:
        (target,) = ensure_targets(session, [("r", "vllm", "http://r/metrics")]).values()
        record_replica_history(
            session, target, [(t, before if i < restarted else after) for i, t in enumerate(times)]
        )
    with sessions() as session:
        found = [e for e in events(session, Config(), times[0], times[-1]) if e.kind == "restart"]
    assert [e.at for e in found] == [times[restarted]]
    assert "process restarted" in found[0].detail

    with sessions.begin() as session:
        rollup(session, times[-1] + 600.0, Retention())
    with sessions() as session:
        rows = session.execute(
            select(ReplicaRollupRow.ts, ReplicaRollupRow.process_start_time)
            .where(ReplicaRollupRow.resolution == 300)
            .order_by(ReplicaRollupRow.ts)
        ).all()
    assert rows
    for ts, value in rows:
        last = max(i for i, t in enumerate(times) if t <= ts)
        assert value == (started if last < restarted else started + 3600.0)
    values = [value for _, value in rows]
    assert sum(1 for a, b in itertools.pairwise(values) if b > a) == 1


def test_a_configuration_change_and_an_upgrade_are_told_apart() -> None:
    first = {"engine": "vllm", "generation": "v1", "num_gpu_blocks": 100, "cache_dtype": "auto"}
    configs = [
        (0.0, first),
        (60.0, {**first, "num_gpu_blocks": 80, "cache_dtype": "fp8"}),
        (120.0, {**first, "num_gpu_blocks": 80, "cache_dtype": "fp8", "generation": "v1-0.10"}),
    ]
    found = config_changes("r", configs)
    assert [(e.at, e.kind) for e in found] == [(60.0, "config_change"), (120.0, "upgrade")]
    assert (
        "num_gpu_blocks 100 → 80" in found[0].detail and "cache_dtype auto → fp8" in found[0].detail
    )
    assert found[1].detail == "generation v1 → v1-0.10"
    assert config_changes("r", configs[:1]) == []  # the first configuration is no change


def test_another_engine_is_an_engine_change_in_words_not_an_upgrade() -> None:
    # An `auto` target that served vLLM now serves SGLang: its generation and cache change
    # with it, told as one engine change (and the cache's keys as a config change).
    vllm = {"engine": "vllm", "generation": "v1", "block_size": 16, "model_names": ["m"]}
    sglang = {"engine": "sglang", "generation": "0.5.23", "block_size": None, "model_names": ["m"]}
    found = config_changes("r", [(0.0, vllm), (60.0, sglang), (120.0, {**sglang})])
    assert [(e.at, e.kind, e.detail) for e in found] == [
        (60.0, "engine_change", "engine changed from vLLM to SGLang"),
        (60.0, "config_change", "block_size 16 → none"),
    ]


def test_an_xid_is_one_event_while_its_code_is_held() -> None:
    found = gpu_xids("GPU 0", "r", [0, 15, 30, 45, 60, 75], [None, 79, 79, None, 79, 48])
    assert [(e.at, e.detail) for e in found] == [(15, "XID 79 on GPU 0"), (75, "XID 48 on GPU 0")]
    # A code already held at the first sample may be old: no event.
    assert gpu_xids("GPU 0", "r", [0, 15], [79, 79]) == []


def test_clock_event_bits_that_turn_on_are_throttling_or_power_capping() -> None:
    times = [0, 15, 30, 45, 60]
    found = gpu_clock_events("GPU 0", "r", times, [0, 0x1, 0x40 | 0x1, 0x40 | 0x4, 0x4])
    assert [(e.at, e.kind) for e in found] == [(30, "gpu_throttle"), (45, "gpu_power_cap")]
    assert "HW thermal slowdown" in found[0].detail and "SW power cap" in found[1].detail
    # Idle (0x1) and application clocks (0x2) are no slowdown.
    assert gpu_clock_events("GPU 0", "r", times, [0, 1, 2, 3, 1]) == []


def test_a_gpu_missing_from_its_exporters_scrape_is_gone() -> None:
    scrapes = [0.0, 15.0, 30.0, 45.0]
    listed: dict[tuple[str, str | None], set[float]] = {
        ("GPU 0", "r"): {0.0, 15.0, 30.0, 45.0},
        ("GPU 1", "r"): {0.0, 15.0},
    }
    found = gpus_gone(scrapes, listed)
    assert [(e.at, e.detail) for e in found] == [(30.0, "GPU 1 no longer reported")]
    assert gpus_gone(scrapes, {("GPU 0", "r"): set(scrapes)}) == []


def test_failed_scrapes_close_together_are_one_outage() -> None:
    times = [100.0, 115.0, 130.0, 1000.0]
    found = outages("r", times, ["refused", "refused", "refused", "timeout"], interval=15.0)
    assert [(e.at, e.kind) for e in found] == [(100.0, "scrape_outage"), (1000.0, "scrape_outage")]
    assert found[0].detail.startswith("3 failed scrapes over 30 s: refused")


def _intervals(hit_rates: list[float], computed: list[float]) -> pd.DataFrame:
    start = pd.Timestamp("2026-12-01T00:00:00Z")
    return pd.DataFrame(
        {
            "time": [start + pd.Timedelta(minutes=5 * i) for i in range(len(hit_rates))],
            "hit_rate": hit_rates,
            "computed_prompt_tokens_per_second": computed,
        }
    )


def test_a_hit_rate_drop_below_its_trailing_hour() -> None:
    steady = 0.8
    dropped = steady - HIT_RATE_DROP - 0.05
    series = _intervals([steady] * 6 + [dropped] * 2, [10.0] * 8)
    (event,) = hit_rate_drops("r", series)
    assert event.at == series.time[6].timestamp() and event.kind == "hit_rate_drop"
    wobble = _intervals([steady] * 6 + [steady - HIT_RATE_DROP / 2] * 2, [10.0] * 8)
    assert hit_rate_drops("r", wobble) == []


def test_a_prefill_storm_is_a_burst_over_its_trailing_hour_and_not_an_idle_replica_waking() -> None:
    base = STORM_MIN_RATE
    series = _intervals([0.5] * 8, [base] * 5 + [base * STORM_FACTOR * 2] * 2 + [base])
    (event,) = prefill_storms("r", series)
    assert event.at == series.time[5].timestamp() and event.kind == "prefill_storm"
    small = _intervals([0.5] * 8, [1.0] * 5 + [STORM_MIN_RATE / 2] * 3)
    assert prefill_storms("r", small) == []


# --- a twin replica through the collector's store (tests/timeline_scenario.py) ----------


def test_a_restarted_reconfigured_upgraded_throttled_twin_shows_each_change_once(
    tmp_path: Path,
) -> None:
    config_file = migrated(write_config(tmp_path))
    config = load_config(config_file)
    start = float(int(time.time()) // 60 * 60) - (FIRE + 10) * STEP
    at = store_history(config, start)
    sessions = open_store(config.database)
    wanted = expected(at)
    kinds = {kind for kind, _ in wanted}

    with sessions() as session:
        found = events(session, config, start, at[FIRE])
    seen = [(e.kind, e.at) for e in found if e.kind in kinds]
    assert sorted(seen) == sorted(wanted)  # each once, at its round
    assert all(e.replica == "r1" for e in found if e.kind in kinds)  # the GPU is r1's
    change = next(e for e in found if e.kind == "config_change")
    assert "cache_dtype auto → fp8" in change.detail and "num_gpu_blocks" in change.detail
    upgrade = next(e for e in found if e.kind == "upgrade")
    assert upgrade.detail == "generation v1 → v1-0.10"
    assert f"XID {XID_CODE}" in next(e for e in found if e.kind == "gpu_xid").detail
    assert "HW thermal slowdown" in next(e for e in found if e.kind == "gpu_throttle").detail
    assert "SW power cap" in next(e for e in found if e.kind == "gpu_power_cap").detail

    # The command line: the same events, as JSON with ISO times.
    result = CliRunner().invoke(
        app, ["timeline", "--config", str(config_file), "--since", "1h", "--json"]
    )
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    from_cli = [
        (e["kind"], pd.Timestamp(e["at"]).timestamp()) for e in listed if e["kind"] in kinds
    ]
    assert sorted(from_cli) == sorted(wanted)
    assert {e["replica"] for e in listed if e["kind"] in kinds} == {"r1"}
    other = CliRunner().invoke(
        app,
        ["timeline", "--config", str(config_file), "--replica", "node9", "--json"],
    )
    assert other.exit_code == 0 and json.loads(other.output) == []

    # An alert that fires after them carries each one in its message.
    rule = next(r for r in config.rules if r.name == "kv-high")
    alert = Alert("f1", rule.name, "r1", FIRING, 0.9, rule.threshold, fired_at=at[FIRE])
    with sessions.begin() as session:
        enqueue(session, config, config.rules, [Transition(alert, "pending", FIRING)], at[FIRE])
    with sessions() as session:
        row = session.scalars(select(NotificationRow)).one()
    notice = Notice(**json.loads(row.notice))
    lines = [e.line() for e in found if e.kind in kinds]
    assert len(lines) == len(wanted)
    for line in lines:
        assert notice.changes.count(line) == 1
    text = channel(config.channels[0]).request(notice, at[FIRE]).json["text"]
    assert "changes in the hour before:" in text
    assert all(f"- {line}" in text for line in lines)


def test_a_replicas_configuration_is_kept_each_time_it_changes(fresh_url) -> None:  # type: ignore[no-untyped-def]
    """On SQLite and PostgreSQL: the writer's conditional insert adds a row only when a
    scrape's configuration differs from the newest stored, in a batched round and in a
    history of several scrapes alike; a configuration that comes back is a change again."""
    sessions = open_store(fresh_url())
    a = ReplicaSample("v1", 1, ["m"], cache=CacheConfig(16, 100, "auto", True))
    b = ReplicaSample("v1", 1, ["m"], cache=CacheConfig(16, 80, "fp8", True))
    with sessions.begin() as session:
        (target,) = ensure_targets(session, [("r", "vllm", "http://r/metrics")]).values()
        for ts, sample in ((10.0, a), (20.0, a)):
            with batch(session):
                record_replica(session, target, ts, sample)
        record_replica_history(session, target, [(30.0, b), (40.0, b), (50.0, a), (60.0, a)])
        with batch(session):
            record_replica(session, target, 70.0, a)
    with sessions() as session:
        rows = session.execute(
            select(TargetConfigRow.ts, TargetConfigRow.config).order_by(TargetConfigRow.ts)
        ).all()
        assert [ts for ts, _ in rows] == [10.0, 30.0, 50.0]
        found = events(session, Config(), 0.0, 100.0)
    assert [(e.kind, e.at) for e in found if e.kind == "config_change"] == [
        ("config_change", 30.0),
        ("config_change", 50.0),
    ]


# --- alerts, silences and model names -------------------------------------------------


def _history(
    before: str | None, after: str, ts: float, value: float | None = 2.0
) -> dict[str, object]:
    return {"ts": ts, "rule": "kv-saturated", "replica": "r", "before": before, "after": after,
            "value": value}  # fmt: skip


def test_an_alert_firing_and_resolving_are_events_and_a_reminder_is_not_a_new_firing() -> None:
    rows = [
        _history("inactive", "pending", 10.0),  # waiting out `for`: no event
        _history("pending", "firing", 70.0),  # fired
        _history("firing", "firing", 130.0),  # a reminder (or a no-data note): not a firing
        _history("firing", "resolved", 190.0, None),  # resolved after firing
        _history(None, "firing", 250.0),  # fired without pending (`for: 0`)
    ]
    found = alert_events(rows)
    assert [(e.at, e.kind) for e in found] == [
        (70.0, "alert_firing"),
        (190.0, "alert_resolved"),
        (250.0, "alert_firing"),
    ]
    assert found[0].replica == "r" and found[0].detail == "kv-saturated fired (value 2)"
    assert found[1].detail == "kv-saturated resolved"  # no value: none shown


def test_a_pending_alert_that_ends_is_no_resolved_event() -> None:
    # Resolved only after firing: a pending alert ended (recovered, or its quantity not
    # exposed) never fired, so nothing on the timeline.
    assert alert_events([_history("inactive", "pending", 10.0)]) == []
    assert alert_events([_history("pending", "resolved", 40.0)]) == []
    assert alert_events([_history("pending", "inactive", 40.0)]) == []


def _store(tmp_path: Path) -> tuple[Config, int]:
    config_file = tmp_path / "kneepoint.yaml"
    config_file.write_text(f"""
database: sqlite:///{tmp_path / "k.db"}
targets:
  - {{name: r, kind: vllm, url: "http://127.0.0.1:9/metrics"}}
""")
    migrated(config_file)
    config = load_config(config_file)
    with open_store(config.database).begin() as session:
        (target,) = ensure_targets(session, [("r", "vllm", "http://127.0.0.1:9/metrics")]).values()
    return config, target


def test_stored_alert_transitions_on_the_timeline_are_firings_and_resolutions_only(
    tmp_path: Path,
) -> None:
    config, _ = _store(tmp_path)
    with open_store(config.database).begin() as session:
        for row in [
            _history("inactive", "pending", 1000.0),
            _history("pending", "firing", 1060.0),
            _history("firing", "firing", 1120.0),
            _history("firing", "resolved", 1180.0),
            _history("inactive", "pending", 1240.0),
            _history("pending", "resolved", 1300.0),
        ]:
            session.add(AlertHistoryRow(fingerprint="f", note=None, **row))
    with open_store(config.database)() as session:
        found = [e for e in events(session, config, 0.0, 2000.0) if e.kind.startswith("alert")]
        later = events(session, config, 1100.0, 2000.0)  # the firing is before this range
    assert [(e.at, e.kind) for e in found] == [(1060.0, "alert_firing"), (1180.0, "alert_resolved")]
    assert [(e.at, e.kind) for e in later] == [(1180.0, "alert_resolved")]


def test_a_silence_is_an_event_when_created_and_only_then(tmp_path: Path) -> None:
    config, _ = _store(tmp_path)
    with open_store(config.database).begin() as session:
        on_r = silences.create(
            session, {"alertname": "kv-saturated", "replica": "r"}, 1000.0, 5000.0, "ann",
            "resharding", 1000.0,
        )  # fmt: skip
        fleet = silences.create(
            session, {"alertname": "up-burn-1h"}, 2000.0, 3000.0, "bob", "", 1500.0
        )
        silences.create(session, {"replica": "r"}, 100.0, 9000.0, "eve", "", 100.0)  # earlier
    with open_store(config.database)() as session:
        found = [e for e in events(session, config, 500.0, 4000.0) if e.kind == "silence"]
        only_r = events(session, config, 500.0, 4000.0, replica="r")
    assert [(e.at, e.replica) for e in found] == [(1000.0, "r"), (1500.0, None)]
    assert found[0].detail.startswith(f"silence {on_r} (alertname=kv-saturated, replica=r) until")
    assert found[0].detail.endswith("by ann: resharding")
    assert found[1].detail.startswith(f"silence {fleet} (alertname=up-burn-1h) until")
    # A silence created before the range is no event in it, though it still lasts.
    assert all(e.at >= 500.0 for e in found)
    # The fleet's silence shows beside a replica's own.
    assert [e.at for e in only_r if e.kind == "silence"] == [1000.0, 1500.0]


def test_a_changed_model_name_is_a_config_change_and_the_same_names_are_not(
    tmp_path: Path,
) -> None:
    config, target = _store(tmp_path)
    base = parse_vllm(read(VLLM_032))
    renamed = copy.deepcopy(base)
    renamed.model_names = ["tiny-v2"]
    both, reordered = copy.deepcopy(base), copy.deepcopy(base)
    both.model_names, reordered.model_names = ["a", "tiny"], ["tiny", "a"]
    with open_store(config.database).begin() as session:
        for ts, sample in enumerate([base, base, renamed, renamed, both, reordered], start=1):
            record_replica(session, target, ts * 15.0, sample)
    with open_store(config.database)() as session:
        found = events(session, config, 0.0, 1000.0)
    changes = [(e.at, e.kind, e.detail) for e in found if e.kind in ("config_change", "upgrade")]
    assert changes == [
        (45.0, "config_change", f"model_names {','.join(base.model_names)} → tiny-v2"),
        (75.0, "config_change", "model_names tiny-v2 → a,tiny"),
    ]
