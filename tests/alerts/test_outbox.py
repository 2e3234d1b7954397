"""The outbox's order and lifetime rules against a real loopback receiver, on an injected
clock (`now`): a newer state supersedes an older unsent one, nothing overtakes a row in
flight, a stale firing expires, a test message sends only itself, one bad row stays alone."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from alerts.channels import Outgoing
from alerts.lifecycle import FIRING, PENDING, RESOLVED, Alert, Transition
from alerts.messages import enqueue
from alerts.outbox import (
    COUNTS,
    Result,
    deliver_due,
    http_sender,
    put,
    send_trial,
    trial_notice,
)
from kneepoint.config import Config, Rule
from kneepoint.store.db import open_store
from kneepoint.store.models import NotificationRow
from tests.faults.test_delivery import (
    DEADLINE,
    NOW,
    Sink,
    deliver,
    outbox,
    poll,
    rule_to,
    serving,
)


@pytest.fixture
def sink() -> Iterator[Sink]:
    with serving() as state:
        yield state


def news(
    sessions: sessionmaker[Session],
    config: Config,
    rule: Rule,
    after: str,
    at: float,
    fingerprints: tuple[str, ...] = ("fp",),
) -> None:
    """The engine's news for some alerts of `rule`, enqueued as evaluation does."""
    before = PENDING if after == FIRING else FIRING
    changes = [
        Transition(Alert(fp, rule.name, fp, after, 0.97, 0.9, NOW - 60, NOW - 30), before, after)
        for fp in fingerprints
    ]
    with sessions.begin() as session:
        enqueue(session, config, [rule], changes, at)


def pagerduty(tmp_path: Path, sink: Sink, **extra: object) -> Config:
    config = Config.model_validate(
        {
            "database": f"sqlite:///{tmp_path / 'k.db'}",
            "channels": [
                {
                    "name": "pd",
                    "type": "pagerduty",
                    "url": sink.url("/pd"),
                    "routing_key": "R",
                    **extra,
                }
            ],
        }
    )
    return config


def stored(sessions: sessionmaker[Session]) -> list[NotificationRow]:
    with sessions() as session:
        return list(session.scalars(select(NotificationRow).order_by(NotificationRow.id)))


def actions(sink: Sink) -> list[str]:
    return [json.loads(g.body)["event_action"] for g in sink.got]


def test_a_resolution_supersedes_its_unsent_firing(sink: Sink, tmp_path: Path) -> None:
    config = pagerduty(tmp_path, sink)
    sessions = open_store(config.database)
    sink.modes["/pd"] = 500
    news(sessions, config, rule_to("pd"), FIRING, NOW)
    assert deliver(sessions, config, NOW)["retry"] == 1  # the trigger waits for its retry
    news(sessions, config, rule_to("pd"), RESOLVED, NOW + 5)
    sink.modes["/pd"] = "ok"
    counts = deliver(sessions, config, NOW + 10)
    assert (counts["superseded"], counts["sent"]) == (1, 1)
    firing, resolved = stored(sessions)
    assert (firing.state, firing.last_error) == ("superseded", f"superseded by #{resolved.id}")
    assert resolved.state == "sent"
    assert deliver(sessions, config, NOW + 3600)["sent"] == 0
    # The refused trigger, then the resolve; never a trigger after it (an incident left open).
    assert actions(sink) == ["trigger", "resolve"]


def test_a_firing_in_flight_is_not_overtaken_by_its_resolution(sink: Sink, tmp_path: Path) -> None:
    config = pagerduty(tmp_path, sink)
    sessions = open_store(config.database)
    sink.modes["/pd"] = "hold"
    news(sessions, config, rule_to("pd"), FIRING, NOW)
    first: dict[str, int] = {}
    sender = threading.Thread(
        target=lambda: first.update(
            deliver_due(sessions(), config, NOW, http_sender(10), deadline=10)
        )
    )
    sender.start()
    assert poll(sink.arrived.is_set)
    news(sessions, config, rule_to("pd"), RESOLVED, NOW + 1)
    # Another sender, while the trigger is in flight: the resolve waits, nothing superseded.
    assert deliver(sessions, config, NOW + 2) == dict.fromkeys(COUNTS, 0)
    assert [r.state for r in stored(sessions)] == ["pending", "pending"]
    sink.modes["/pd"] = "ok"
    sink.release.set()
    sender.join(15)
    assert first["sent"] == 1
    assert deliver(sessions, config, NOW + 3)["sent"] == 1
    assert actions(sink) == ["trigger", "resolve"]


def test_a_group_holds_back_the_later_news_of_its_members(sink: Sink, tmp_path: Path) -> None:
    config = outbox(tmp_path, {"hook": sink.url("/hook")})
    sessions = open_store(config.database)
    sink.modes["/hook"] = 500
    news(sessions, config, rule_to("hook"), FIRING, NOW, ("a", "b"))  # one message, two alerts
    deliver(sessions, config, NOW)
    news(sessions, config, rule_to("hook"), RESOLVED, NOW + 1, ("b",))
    sink.modes["/hook"] = "ok"
    # The group is not superseded (a is still firing) and goes first; b's resolution next.
    assert deliver(sessions, config, NOW + 10)["sent"] == 1
    assert deliver(sessions, config, NOW + 11)["sent"] == 1
    assert [r.state for r in stored(sessions)] == ["sent", "sent"]
    bodies = [json.loads(g.body) for g in sink.got]
    assert [(b["status"], [a["fingerprint"] for a in b["alerts"]]) for b in bodies] == [
        ("firing", ["a", "b"]),
        ("firing", ["a", "b"]),
        ("resolved", ["b"]),
    ]


def test_a_stale_firing_expires_and_a_resolution_never_does(
    sink: Sink, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = outbox(tmp_path, {"hook": sink.url("/hook")})
    assert config.channels[0].max_age == 3600
    sessions = open_store(config.database)
    sink.modes["/hook"] = 503
    news(sessions, config, rule_to("hook"), FIRING, NOW, ("x",))
    news(sessions, config, rule_to("hook"), RESOLVED, NOW, ("y",))
    for minute in range(0, 61, 20):
        assert deliver(sessions, config, NOW + minute * 60)["expired"] == 0
    counts = deliver(sessions, config, NOW + 3601)
    assert counts["expired"] == 1
    firing, _ = stored(sessions)
    assert firing.state == "expired" and firing.sent_at is None
    assert firing.last_error == "expired: not delivered within 3600s (3601s old)"
    assert f"notification #{firing.id} to hook dropped as stale" in caplog.text
    sink.modes["/hook"] = "ok"
    assert deliver(sessions, config, NOW + 7200)["sent"] == 1
    assert stored(sessions)[1].state == "sent"
    assert [json.loads(g.body)["status"] for g in sink.got][-1] == "resolved"


def test_send_trial_sends_its_own_row_and_no_other(sink: Sink, tmp_path: Path) -> None:
    config = outbox(tmp_path, {"hook": sink.url("/hook")})
    sessions = open_store(config.database)
    news(sessions, config, rule_to("hook"), FIRING, NOW)  # due, waiting for delivery
    others: list[dict[str, int]] = []

    def send_and_race(request: Outgoing) -> Result:
        # Another sender runs a whole round while the test message is on its way.
        with sessions() as session:
            others.append(deliver_due(session, config, NOW, lambda _: Result(500), DEADLINE))
        return http_sender(DEADLINE)(request)

    assert send_trial(sessions, config, "hook", NOW, send_and_race) == ("sent", None)
    # The race sent the waiting alert (with a 500) but never the trial: it was claimed.
    assert others == [dict.fromkeys(COUNTS, 0) | {"retry": 1}]
    (got,) = sink.got
    assert "A test of channel 'hook'" in json.loads(got.body)["alerts"][0]["annotations"]["runbook"]
    alert, trial = stored(sessions)
    assert (alert.state, alert.attempts) == ("pending", 1)
    assert (trial.state, trial.attempts, trial.claimed_by) == ("sent", 1, None)


def test_one_bad_row_is_refused_alone(sink: Sink, tmp_path: Path) -> None:
    config = outbox(tmp_path, {"hook": sink.url("/hook"), "other": sink.url("/other")})
    sessions = open_store(config.database)
    with sessions.begin() as session:
        broken = put(session, "hook", trial_notice(config, "hook", NOW), NOW)
        broken.notice = "{not json"
        put(session, "hook", trial_notice(config, "hook", NOW + 1), NOW)
        put(session, "other", trial_notice(config, "other", NOW), NOW)

    def odd_platform(request: Outgoing) -> Result:
        if request.url.endswith("/other"):
            raise RuntimeError("a bug in a sender")
        return http_sender(DEADLINE)(request)

    with sessions() as session:
        counts = deliver_due(session, config, NOW, odd_platform, DEADLINE)
    assert (counts["failed"], counts["sent"]) == (2, 1)
    bad, good, other = stored(sessions)
    assert bad.state == "failed"
    assert (bad.last_error or "").startswith("could not be prepared: JSONDecodeError")
    assert good.state == "sent"
    assert (other.state, other.last_error) == ("failed", "RuntimeError: a bug in a sender")


def test_every_request_carries_its_rows_idempotency_key(sink: Sink, tmp_path: Path) -> None:
    config = pagerduty(tmp_path, sink)
    sessions = open_store(config.database)
    news(sessions, config, rule_to("pd"), FIRING, NOW, ("a",))
    news(sessions, config, rule_to("pd"), FIRING, NOW, ("b",))
    deliver(sessions, config, NOW)
    rows = stored(sessions)
    keys = [f"kneepoint-{r.id}-{int(r.created_at * 1000)}" for r in rows]
    assert sorted(sink.keys()) == sorted(keys)
    # PagerDuty's own key is the alert's fingerprint: a re-sent trigger is one incident.
    assert sorted(json.loads(g.body)["dedup_key"] for g in sink.got) == ["a", "b"]


def test_evaluation_and_delivery_are_separate_jobs(sink: Sink, tmp_path: Path) -> None:
    from collectors.jobs import alerts_job, deliver_job, standard_jobs
    from tests.seed import seed

    config_file = seed(tmp_path, NOW, minutes=2)
    config_file.write_text(
        config_file.read_text()
        + f"channels: [{{name: hook, type: webhook, url: '{sink.url('/hook')}'}}]\n"
        + "rules: [{name: target-down, metric: up, op: '==', threshold: 0, for: 0s,"
        + " channels: [hook]}]\n"
    )
    from kneepoint.config import load_config

    config = load_config(config_file)
    sessions = open_store(config.database)
    assert {"alerts", "deliver"} <= {job.id for job in standard_jobs(config, sessions, lambda: NOW)}
    alerts_job(config, sessions, lambda: NOW)
    assert stored(sessions) and not sink.got  # evaluation wrote the news, sent nothing
    deliver_job(config, sessions, lambda: NOW)
    assert {r.state for r in stored(sessions)} == {"sent"} and sink.got


# --- an ending that is no recovery (alerts.lifecycle: the engine no longer exposes the metric)

GONE = "not exposed by llama.cpp since its KV gauges were removed"


def hook(tmp_path: Path, sink: Sink, **extra: object) -> Config:
    return Config.model_validate(
        {
            "database": f"sqlite:///{tmp_path / 'k.db'}",
            "targets": [
                {"name": name, "kind": "vllm", "url": "http://127.0.0.1:9/metrics"}
                for name in "abc"
            ],
            "channels": [{"name": "hook", "type": "webhook", "url": sink.url("/hook")}],
            **extra,
        }
    )


def ended(replica: str, note: str | None) -> Transition:
    """The alert of rule kv on `replica`, firing since NOW - 300, resolved now: with `note`,
    ended because its engine no longer exposes the metric; without, recovered (0.5)."""
    value = None if note else 0.5
    alert = Alert(f"fp-{replica}", "kv", replica, RESOLVED, value, 0.9, NOW - 360, NOW - 300, NOW)
    return Transition(alert, FIRING, RESOLVED, note=note)


def test_endings_are_never_grouped_with_recoveries(sink: Sink, tmp_path: Path) -> None:
    # One evaluation: a recovered, b and c ended (their engine, first seen at NOW - 120, does
    # not expose the metric). A group per kind of news, so no recovery reads "ended" and no
    # ending reads "resolved".
    config = hook(tmp_path, sink)
    sessions = open_store(config.database)
    changes = [ended("a", None), ended("b", GONE), ended("c", GONE)]
    since = dict.fromkeys("abc", NOW - 120)
    with sessions.begin() as session:
        assert enqueue(session, config, [rule_to("hook")], changes, NOW, engine_since=since) == 2
    assert deliver(sessions, config, NOW)["sent"] == 2
    bodies = sorted((json.loads(g.body) for g in sink.got), key=lambda b: b["note"] or "")
    shown = [
        (b["status"], b["note"], [a["labels"]["replica"] for a in b["alerts"]]) for b in bodies
    ]
    assert shown == [(RESOLVED, None, ["a"]), (RESOLVED, GONE, ["b", "c"])]
    summary = bodies[1]["commonAnnotations"]["summary"]
    assert summary.startswith("Ended without a recovery") and GONE in summary
    # The notice as stored (the outbox's JSON column): the why and when, no new column.
    notices = [json.loads(row.notice) for row in stored(sessions)]
    assert [(n["note"], n["engine_since"]) for n in notices] == [("", None), (GONE, NOW - 120)]


def test_an_ending_in_a_maintenance_window_is_muted_as_before_and_keeps_its_why(
    sink: Sink, tmp_path: Path
) -> None:
    from datetime import UTC, datetime

    from alerts import maintenance
    from alerts.channels import Notice
    from alerts.evaluate import MUTED_BY, _maintenance

    def iso(ts: float) -> str:
        return datetime.fromtimestamp(ts, UTC).isoformat()

    window = {"name": "upgrade", "start": iso(NOW - 600), "end": iso(NOW + 600), "replicas": ["a"]}
    config = hook(tmp_path, sink, maintenance=[window])
    sessions = open_store(config.database)
    change = ended("a", GONE)
    lasting = maintenance.active(config.maintenance, NOW)
    with sessions.begin() as session:
        muted, unmuted = _maintenance(
            session,
            config,
            [rule_to("hook")],
            [change],
            {"fp-a": change.alert},
            {"fp-a": NOW - 300},
            lasting,
            NOW,
            {"a": NOW - 120},
        )
    # Muted as any resolution in a window (nothing to send once it ends: it is not firing).
    assert (muted, unmuted) == ({"fp-a"}, [])
    (row,) = stored(sessions)
    assert row.state == "muted" and (row.last_error or "").startswith(f"{MUTED_BY} 'upgrade'")
    notice = Notice(**json.loads(row.notice))  # the delivery log shows what it would have said
    assert notice.title() == "[ENDED] kv on a" and GONE in notice.text()
    assert deliver(sessions, config, NOW + 700)["sent"] == 0 and sink.got == []
