"""An engine change never resolves an alert by itself: an alert pending or firing when its
metric stops being exposed (the target's engine changed) follows its rule's `no_data` until
the new engine has been seen for the rule's `for` (at least ENGINE_SETTLE); only then does
it end with the reason. Pure cases on alerts.lifecycle.evaluate, then end to end: a real HTTP
server whose /metrics goes from vLLM to llama.cpp under an `auto` target, collected and
evaluated on a test clock, with the outbox, the timeline and the targets row checked."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import select, text

from alerts.channels import Notice, channel
from alerts.evaluate import evaluate_once
from alerts.lifecycle import ENGINE_SETTLE, FIRING, PENDING, RESOLVED, Alert, evaluate, settle_time
from alerts.values import FLEET, engine_since
from collectors.collect import collect_once
from kneepoint import timeline
from kneepoint.config import Rule, load_config
from kneepoint.store.db import alembic_config, make_engine, open_store
from kneepoint.store.models import AlertHistoryRow, AlertRow, NotificationRow, TargetRow
from tests.conftest import OWN_FIXTURES, MetricsServer, Route, migrated

GONE = "not exposed by llama.cpp since its KV gauges were removed"
WHY = {"r": {"kv_cache_occupancy": GONE}}
Values = dict[str, dict[str, float | None]]
NONE: Values = {"r": {"kv_cache_occupancy": None}}


def rule(**overrides: object) -> Rule:
    base = {"name": "kv", "metric": "kv_cache_occupancy", "op": ">", "threshold": 0.9, "for": 120}
    return Rule.model_validate({**base, **overrides})


def firing(the_rule: Rule, at: float = 0.0) -> dict[str, Alert]:
    """The rule's alert on replica r, firing since `at` (for: waited out on vLLM)."""
    alerts: dict[str, Alert] = {}
    for now in (at - the_rule.for_, at):
        alerts, _ = evaluate([the_rule], {"r": {"kv_cache_occupancy": 0.95}}, alerts, now)
    assert next(iter(alerts.values())).state == FIRING
    return alerts


def test_a_firing_alert_is_held_while_the_new_engine_settles_then_ends_with_the_reason() -> None:
    the_rule = rule()  # no_data: keep
    alerts = firing(the_rule)
    changed = 100.0  # the new engine's first sample
    alerts, changes = evaluate([the_rule], NONE, alerts, changed + 5, WHY, {"r": changed})
    # Held through the change: a firing -> firing with no value (the "no data" message), no
    # resolution and no reason (the alert has not ended).
    assert [(c.before, c.after, c.alert.value, c.note) for c in changes] == [
        (FIRING, FIRING, None, None)
    ]
    (alert,) = alerts.values()
    assert (alert.state, alert.fired_at, alert.resolved_at) == (FIRING, 0.0, None)
    alerts, changes = evaluate([the_rule], NONE, alerts, changed + 119, WHY, {"r": changed})
    assert changes == [] and next(iter(alerts.values())).state == FIRING
    # Seen for the rule's `for`: now the engine does not expose it, and the alert ends so.
    alerts, changes = evaluate([the_rule], NONE, alerts, changed + 120, WHY, {"r": changed})
    (change,) = changes
    assert (change.before, change.after, change.note, change.alert.value) == (
        FIRING,
        RESOLVED,
        GONE,
        None,
    )
    assert next(iter(alerts.values())).resolved_at == changed + 120


def test_no_data_resolve_resolves_at_the_change_as_no_data_not_with_the_reason() -> None:
    the_rule = rule(no_data="resolve")
    alerts = firing(the_rule)
    alerts, changes = evaluate([the_rule], NONE, alerts, 105.0, WHY, {"r": 100.0})
    (change,) = changes
    assert (change.before, change.after, change.alert.value, change.note) == (
        FIRING,
        RESOLVED,
        None,
        None,
    )


def test_no_data_alert_keeps_firing_and_a_pending_alert_fires_after_its_for() -> None:
    the_rule = rule(no_data="alert")
    alerts = firing(the_rule)
    for now in (105.0, 200.0):
        alerts, changes = evaluate([the_rule], NONE, alerts, now, WHY, {"r": 100.0})
        assert all(c.after == FIRING for c in changes)
        assert next(iter(alerts.values())).state == FIRING
    # Pending on vLLM at 0 (for: 120); the engine changes at 100: no data is a breach, so
    # it fires at 120, its `for` counted from 0, and ends once the engine is 120 s old.
    alerts, _ = evaluate([the_rule], {"r": {"kv_cache_occupancy": 0.95}}, {}, 0.0)
    assert next(iter(alerts.values())).state == PENDING
    states = []
    for now in (105.0, 120.0, 219.0, 220.0):
        alerts, changes = evaluate([the_rule], NONE, alerts, now, WHY, {"r": 100.0})
        states.append((next(iter(alerts.values())).state, [c.note for c in changes]))
    assert states == [(PENDING, []), (FIRING, [None]), (FIRING, []), (RESOLVED, [GONE])]


def test_a_pending_alert_under_keep_keeps_its_pending_since_while_the_engine_settles() -> None:
    the_rule = rule()
    alerts, _ = evaluate([the_rule], {"r": {"kv_cache_occupancy": 0.95}}, {}, 0.0)
    alerts, changes = evaluate([the_rule], NONE, alerts, 110.0, WHY, {"r": 100.0})
    (alert,) = alerts.values()
    assert changes == [] and (alert.state, alert.pending_since) == (PENDING, 0.0)


def test_for_0_still_waits_engine_settle_before_the_reason_ends_it() -> None:
    the_rule = rule(**{"for": 0})
    assert settle_time(the_rule) == ENGINE_SETTLE > 0
    alerts = firing(the_rule)
    alerts, changes = evaluate([the_rule], NONE, alerts, 100.0, WHY, {"r": 100.0})
    assert next(iter(alerts.values())).state == FIRING
    assert [c.after for c in changes] == [FIRING]  # the no-data note, no resolution
    alerts, changes = evaluate([the_rule], NONE, alerts, 100.0 + ENGINE_SETTLE, WHY, {"r": 100.0})
    assert [(c.after, c.note) for c in changes] == [(RESOLVED, GONE)]


def test_an_engine_swapped_back_within_the_settle_time_leaves_the_alert_firing() -> None:
    # A scrape of the wrong port (or an engine swapped and swapped back): one round without
    # the metric, then vLLM again, first seen anew.
    the_rule = rule()
    alerts = firing(the_rule)
    alerts, _ = evaluate([the_rule], NONE, alerts, 100.0, WHY, {"r": 100.0})
    back: Values = {"r": {"kv_cache_occupancy": 0.97}}
    alerts, changes = evaluate([the_rule], back, alerts, 115.0, None, {"r": 115.0})
    (alert,) = alerts.values()
    assert changes == [] and (alert.state, alert.value, alert.fired_at) == (FIRING, 0.97, 0.0)


@pytest.mark.parametrize("no_data", ["keep", "resolve", "alert"])
def test_an_engine_the_same_all_along_keeps_today_s_behaviour(no_data: str) -> None:
    the_rule = rule(no_data=no_data)
    # A replica first seen just now that never exposed the metric: the rule never starts.
    for now in (0.0, 10.0, 200.0):
        alerts, changes = evaluate([the_rule], NONE, {}, now, WHY, {"r": 0.0})
        assert alerts == {} and changes == []
    # An engine first seen long ago (or not known): a firing alert ends at once, with why.
    for since in ({"r": -1000.0}, {}):
        alerts, changes = evaluate([the_rule], NONE, firing(the_rule), 100.0, WHY, since)
        assert [(c.after, c.note) for c in changes] == [(RESOLVED, GONE)]


def test_a_fleet_alert_is_held_by_its_latest_replica_s_engine_change() -> None:
    the_rule = rule(scope="fleet")
    status = {"replicas": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}
    since = engine_since(status, {"a": 10.0, "b": 100.0, "c": None, "gone": 500.0})
    assert since == {"a": 10.0, "b": 100.0, FLEET: 100.0}
    alerts: dict[str, Alert] = {}
    for now in (-120.0, 0.0):
        alerts, _ = evaluate([the_rule], {FLEET: {"kv_cache_occupancy": 0.95}}, alerts, now)
    why = {FLEET: {"kv_cache_occupancy": GONE}}
    none: Values = {FLEET: {"kv_cache_occupancy": None}}
    alerts, changes = evaluate([the_rule], none, alerts, 150.0, why, since)
    assert next(iter(alerts.values())).state == FIRING and [c.after for c in changes] == [FIRING]
    alerts, changes = evaluate([the_rule], none, alerts, 220.0, why, since)
    assert [(c.after, c.note) for c in changes] == [(RESOLVED, GONE)]


# --- end to end: collection, the store, evaluation, the outbox, the timeline -------------

VLLM = (OWN_FIXTURES / "vllm-0.32.0-cpu-preemption-under-load.prom").read_bytes()  # KV 0.82
LLAMACPP = (OWN_FIXTURES / "llamacpp-b11434-busy.prom").read_bytes()  # no KV gauges
STEP = 15.0
FOR = 30.0
# How the reason llama.cpp's collector gives for its missing KV gauges begins.
GONE_E2E = "not exposed by llama.cpp"


def statuses(session) -> list[str]:  # type: ignore[no-untyped-def]
    """The outbox's messages about kv-high, oldest first: each one's status."""
    rows = session.scalars(select(NotificationRow).order_by(NotificationRow.id))
    notices = [json.loads(row.notice) for row in rows]
    return [n["status"] for n in notices if n["rule"] == "kv-high"]


def test_an_auto_target_that_changes_engine_keeps_its_alert_and_the_timeline_says_so(
    tmp_path: Path, metrics_server: MetricsServer
) -> None:
    metrics_server.routes["/metrics"] = Route(VLLM)
    path = tmp_path / "kneepoint.yaml"
    path.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        f"targets:\n  - {{name: r1, kind: auto, url: '{metrics_server.url('/metrics')}'}}\n"
        'channels: [{name: hook, type: webhook, url: "http://127.0.0.1:9/hook"}]\n'
        "rules:\n"
        f"  - {{name: kv-high, metric: kv_cache_occupancy, op: '>', threshold: 0.5, "
        f"for: {FOR:.0f}s, channels: [hook]}}\n"
    )
    config = load_config(migrated(path))
    sessions = open_store(config.database)
    now = float(int(time.time()))

    def round_at(at: float) -> None:
        (outcome,) = collect_once(config, sessions, clock=lambda: at)
        assert outcome.ok, outcome.error
        with sessions.begin() as session:
            evaluate_once(session, config, at)

    for _ in range(4):  # vLLM, KV at 82 %: pending, then firing after 30 s
        now += STEP
        round_at(now)
    with sessions() as session:
        (alert,) = session.scalars(select(AlertRow).where(AlertRow.rule == "kv-high"))
        assert alert.state == FIRING
        target = session.scalars(select(TargetRow)).one()
        assert target.engine == "vllm" and target.engine_since == now - 3 * STEP
        sent_before = statuses(session)
    assert sent_before == [FIRING]

    metrics_server.routes["/metrics"] = Route(LLAMACPP)  # the same port now serves llama.cpp
    now += STEP
    changed = now
    round_at(changed)
    with sessions() as session:
        (alert,) = session.scalars(select(AlertRow).where(AlertRow.rule == "kv-high"))
        assert alert.state == FIRING and alert.resolved_at is None
        assert RESOLVED not in statuses(session)  # no RESOLVED message queued
        target = session.scalars(select(TargetRow)).one()
        assert (target.engine, target.engine_since) == ("llamacpp", changed)
        found = timeline.events(session, config, changed - 600, changed)
    (event,) = [e for e in found if e.kind == "engine_change"]
    assert (event.at, event.replica, event.detail) == (
        changed,
        "r1",
        "engine changed from vLLM to llama.cpp",
    )
    assert not [e for e in found if e.kind == "upgrade"]  # the generation went with it

    # Held until llama.cpp has been seen for the rule's settle time (its `for`, at least
    # ENGINE_SETTLE); then it ends, with the reason, and the resolution is sent.
    settle = max(FOR, ENGINE_SETTLE)
    while now + STEP < changed + settle:
        now += STEP
        round_at(now)
        with sessions() as session:
            assert RESOLVED not in statuses(session)
    now = changed + settle
    round_at(now)
    with sessions() as session:
        (alert,) = session.scalars(select(AlertRow).where(AlertRow.rule == "kv-high"))
        assert (alert.state, alert.resolved_at) == (RESOLVED, now)
        assert statuses(session)[-1] == RESOLVED  # what closes it on the machine channels
        # ... but the message says it ended, why, and when llama.cpp came: no "RESOLVED".
        row = session.scalars(select(NotificationRow).order_by(NotificationRow.id.desc())).first()
        assert row is not None
        notice = Notice(**json.loads(row.notice))
        assert notice.note.startswith(GONE_E2E) and notice.engine_since == changed
        text_ = notice.text()
        when = datetime.fromtimestamp(changed, UTC).strftime("%Y-%m-%d %H:%M UTC")
        assert text_.startswith("[ENDED] kv-high on r1\nEnded without a recovery"), text_
        assert notice.note in text_ and f"engine changed at {when}" in text_
        assert "RESOLVED" not in text_ and "no data" not in text_
        (spec,) = config.channels  # the webhook as it would be sent: status and its note
        body = channel(spec).request(notice, now).json
        assert (body["status"], body["note"]) == (RESOLVED, notice.note)
        (last,) = session.scalars(
            select(AlertHistoryRow)
            .where(AlertHistoryRow.rule == "kv-high")
            .order_by(AlertHistoryRow.id.desc())
            .limit(1)
        )
        assert (last.after, last.ts) == (RESOLVED, now)
        assert last.note is not None and "llama.cpp" in last.note
        assert last.note == notice.note  # the history's why is the message's
        # The engine did not change again: engine_since stays at its first sample.
        assert session.scalars(select(TargetRow)).one().engine_since == changed
        queued = len(statuses(session))
    # Ended, it is resolved like any other: no reminder, nothing more queued after it.
    for _ in range(2):
        now += STEP
        round_at(now)
    with sessions() as session:
        assert len(statuses(session)) == queued


def test_the_migration_backfills_engine_since_from_the_configuration_history(
    tmp_path: Path,
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'k.db'}")
    alembic = alembic_config(engine)
    with engine.begin() as connection:
        alembic.attributes["connection"] = connection
        command.upgrade(alembic, "0017")

    def config(engine_name: str, model: str = "m") -> str:
        return json.dumps({"engine": engine_name, "model_names": [model]})

    with engine.begin() as connection:
        for target_id, engine_name in ((1, "sglang"), (2, "vllm"), (3, None)):
            connection.execute(
                text(
                    "INSERT INTO targets (id, name, kind, url, consecutive_failures, engine) "
                    "VALUES (:id, :name, 'auto', 'http://x', 0, :engine)"
                ),
                {"id": target_id, "name": f"t{target_id}", "engine": engine_name},
            )
        # t1: vLLM from 100, SGLang from 200 (its model changed at 300: the same engine),
        # t2: no history (stored before the timeline kept one), t3: never sampled.
        for ts, text_ in (
            (100, config("vllm")),
            (200, config("sglang")),
            (300, config("sglang", "n")),
        ):
            connection.execute(
                text("INSERT INTO target_configs (target_id, ts, config) VALUES (1, :ts, :c)"),
                {"ts": ts, "c": text_},
            )
    with engine.begin() as connection:
        alembic.attributes["connection"] = connection
        command.upgrade(alembic, "head")
    with engine.connect() as connection:
        rows: dict[int, float | None] = dict(
            connection.execute(text("SELECT id, engine_since FROM targets")).all()
        )
    assert rows == {1: 200.0, 2: None, 3: None}
