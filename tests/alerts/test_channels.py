"""Delivery through the outbox to real HTTP receivers: payloads and signatures checked the way
each platform checks them, retries, refusals, restarts and rate limits."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from alerts.channels import Notice, channel
from alerts.lifecycle import FIRING, PENDING, RESOLVED, Alert, Transition
from alerts.messages import enqueue
from alerts.outbox import COUNTS, channel_health, deliver_due, http_sender
from kneepoint.config import Config, Rule
from kneepoint.secrets import HookURL
from kneepoint.store.db import open_store
from kneepoint.store.models import NotificationRow
from tests.alerts.conftest import Receiver

NOW = 1_795_000_000.0
SECRET = "s3cr3t"


def setup(tmp_path: Path, receiver: Receiver, kind: str, **extra: str) -> tuple[Config, Rule]:
    config = Config.model_validate(
        {
            "database": f"sqlite:///{tmp_path / 'k.db'}",
            "dashboard_url": "http://kneepoint.example:8501",
            "channels": [{"name": "chat", "type": kind, "url": receiver.url(f"/{kind}"), **extra}],
        }
    )
    rule = Rule.model_validate(
        {
            "name": "kv-cache-saturated",
            "metric": "kv_cache_occupancy",
            "op": ">",
            "threshold": 0.9,
            "severity": "page",
            "runbook": "fp8 KV cache or more replicas",
            "channels": ["chat"],
        }
    )
    return config, rule


def fire(
    sessions: sessionmaker[Session],
    config: Config,
    rule: Rule,
    after: str = FIRING,
    replica: str = "qwen-a",
) -> None:
    fingerprint = "f1ngerpr1nt" if replica == "qwen-a" else f"fp-{replica}"
    alert = Alert(fingerprint, rule.name, replica, after, 0.97, 0.9, NOW - 300, NOW - 60)
    before = PENDING if after == FIRING else FIRING
    with sessions.begin() as session:
        enqueue(session, config, [rule], [Transition(alert, before, after)], NOW)


def deliver(sessions: sessionmaker[Session], config: Config, at: float) -> dict[str, int]:
    with sessions() as session:
        return deliver_due(session, config, at, http_sender(timeout=5))


def counted(**counts: int) -> dict[str, int]:
    """A round's counts: those given, every other outcome 0."""
    return {key: counts.get(key, 0) for key in COUNTS}


def rows(sessions: sessionmaker[Session]) -> list[NotificationRow]:
    with sessions() as session:
        return list(session.scalars(select(NotificationRow).order_by(NotificationRow.id)))


def test_slack_gets_a_short_useful_message(tmp_path: Path, receiver: Receiver) -> None:
    config, rule = setup(tmp_path, receiver, "slack")
    sessions = open_store(config.database)
    fire(sessions, config, rule)
    assert deliver(sessions, config, NOW) == counted(sent=1)
    (got,) = receiver.received
    text = json.loads(got.body)["text"]
    assert text.startswith("[PAGE] kv-cache-saturated on qwen-a")
    assert "value 0.97 (threshold > 0.9)" in text
    assert "http://kneepoint.example:8501/?page=capacity&range=1h&replica=qwen-a" in text
    assert "runbook: fp8 KV cache or more replicas" in text
    assert rows(sessions)[0].state == "sent"


def test_feishu_signature_verifies_as_feishu_checks_it(tmp_path: Path, receiver: Receiver) -> None:
    config, rule = setup(tmp_path, receiver, "feishu", secret=SECRET)
    sessions = open_store(config.database)
    fire(sessions, config, rule)
    deliver(sessions, config, NOW)
    body = json.loads(receiver.received[0].body)
    timestamp = body["timestamp"]
    assert timestamp == str(int(NOW))  # seconds
    key = f"{timestamp}\n{SECRET}".encode()
    expected = base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()
    assert body["sign"] == expected
    assert body["msg_type"] == "text" and "kv-cache-saturated" in body["content"]["text"]


def test_dingtalk_signature_verifies_as_dingtalk_checks_it(
    tmp_path: Path, receiver: Receiver
) -> None:
    config, rule = setup(tmp_path, receiver, "dingtalk", secret=SECRET)
    sessions = open_store(config.database)
    fire(sessions, config, rule)
    deliver(sessions, config, NOW)
    query = parse_qs(urlsplit(receiver.received[0].path).query)
    (timestamp,), (sign,) = query["timestamp"], query["sign"]
    assert timestamp == str(int(NOW * 1000))  # milliseconds
    digest = hmac.new(SECRET.encode(), f"{timestamp}\n{SECRET}".encode(), hashlib.sha256)
    assert sign == base64.b64encode(digest.digest()).decode()  # parse_qs undid the URL-encoding
    assert json.loads(receiver.received[0].body)["msgtype"] == "text"


def test_webhook_carries_alertmanager_v4_and_a_verifiable_hmac(
    tmp_path: Path, receiver: Receiver
) -> None:
    config, rule = setup(tmp_path, receiver, "webhook", secret=SECRET)
    sessions = open_store(config.database)
    fire(sessions, config, rule)
    deliver(sessions, config, NOW)
    fire(sessions, config, rule, RESOLVED)
    deliver(sessions, config, NOW)
    for got, status in zip(receiver.received, (FIRING, RESOLVED), strict=True):
        expected = hmac.new(SECRET.encode(), got.body, hashlib.sha256).hexdigest()
        assert got.headers["X-Kneepoint-Signature"] == f"sha256={expected}"
        payload = json.loads(got.body)
        assert payload["version"] == "4" and payload["status"] == status
        (alert,) = payload["alerts"]
        assert alert["labels"] == {
            "alertname": "kv-cache-saturated",
            "replica": "qwen-a",
            "severity": "page",
        }
        assert alert["fingerprint"] == "f1ngerpr1nt"
        assert (alert["endsAt"] == "0001-01-01T00:00:00Z") == (status == FIRING)


def test_a_500_then_a_200_delivers_exactly_once_after_the_backoff(
    tmp_path: Path, receiver: Receiver
) -> None:
    config, rule = setup(tmp_path, receiver, "slack")
    receiver.script["/slack"] = [(500, {}, b"upstream down")]
    sessions = open_store(config.database)
    fire(sessions, config, rule)
    assert deliver(sessions, config, NOW)["retry"] == 1
    assert deliver(sessions, config, NOW + 5)["sent"] == 0  # not due before the backoff
    assert deliver(sessions, config, NOW + 10)["sent"] == 1
    assert deliver(sessions, config, NOW + 1000) == counted()
    assert len(receiver.received) == 2
    (row,) = rows(sessions)
    assert (row.state, row.attempts, row.sent_at) == ("sent", 2, NOW + 10)


def test_retry_after_is_honoured(tmp_path: Path, receiver: Receiver) -> None:
    config, rule = setup(tmp_path, receiver, "discord")
    receiver.script["/discord"] = [(429, {"Retry-After": "120"}, b"slow down")]
    sessions = open_store(config.database)
    fire(sessions, config, rule)
    deliver(sessions, config, NOW)
    assert rows(sessions)[0].next_attempt_at == NOW + 120
    assert deliver(sessions, config, NOW + 60)["sent"] == 0
    assert deliver(sessions, config, NOW + 120)["sent"] == 1


def test_a_permanent_refusal_stops_and_marks_the_channel_broken(
    tmp_path: Path, receiver: Receiver
) -> None:
    config, rule = setup(tmp_path, receiver, "slack")
    receiver.script["/slack"] = [(404, {}, b"no_service")]
    sessions = open_store(config.database)
    fire(sessions, config, rule)
    assert deliver(sessions, config, NOW)["failed"] == 1
    assert deliver(sessions, config, NOW + 3600)["sent"] == 0
    assert len(receiver.received) == 1
    (row,) = rows(sessions)
    assert row.state == "failed" and row.last_error == "HTTP 404: no_service"
    with sessions() as session:
        assert channel_health(session) == {"chat": "broken"}


def test_a_200_with_an_error_code_is_a_refusal(tmp_path: Path, receiver: Receiver) -> None:
    config, rule = setup(tmp_path, receiver, "dingtalk", secret=SECRET)
    receiver.script["/dingtalk"] = [(200, {}, b'{"errcode": 310000, "errmsg": "sign not match"}')]
    sessions = open_store(config.database)
    fire(sessions, config, rule)
    assert deliver(sessions, config, NOW)["failed"] == 1
    assert "sign not match" in (rows(sessions)[0].last_error or "")


def test_pending_notifications_survive_a_restart(tmp_path: Path, receiver: Receiver) -> None:
    config, rule = setup(tmp_path, receiver, "wecom")
    receiver.script["/wecom"] = [(503, {}, b"")]
    first = open_store(config.database)
    fire(first, config, rule)
    deliver(first, config, NOW)
    first.kw["bind"].dispose()  # the process goes away
    after_restart = open_store(config.database)
    assert deliver(after_restart, config, NOW + 30)["sent"] == 1
    assert [r.state for r in rows(after_restart)] == ["sent"]
    assert len(receiver.received) == 2


def test_rate_limited_channels_hold_the_rest(tmp_path: Path, receiver: Receiver) -> None:
    config, rule = setup(tmp_path, receiver, "dingtalk")
    sessions = open_store(config.database)
    for replica in range(25):  # 25 alerts (one alert's later news would supersede its own)
        fire(sessions, config, rule, replica=f"r{replica}")
    counts = deliver(sessions, config, NOW)
    assert counts == counted(sent=20, held=5)
    assert deliver(sessions, config, NOW + 61)["sent"] == 5


def test_a_channel_without_what_it_needs_fails_with_a_reason(
    tmp_path: Path, receiver: Receiver
) -> None:
    config, rule = setup(tmp_path, receiver, "telegram")  # no token, no chat_id
    sessions = open_store(config.database)
    fire(sessions, config, rule)
    assert deliver(sessions, config, NOW)["failed"] == 1
    assert rows(sessions)[0].last_error == "channel 'chat' (telegram) needs token and chat_id"


NOTICE = Notice("fp", "kv", "qwen-a", FIRING, "page", 0.97, 0.9, ">", NOW - 60, NOW)


@pytest.mark.parametrize(
    ("kind", "extra"),
    [("discord", {}), ("wecom", {}), ("slack", {}), ("teams", {})],
)
def test_messages_respect_each_platforms_size(kind: str, extra: dict[str, str]) -> None:
    from dataclasses import replace

    from kneepoint.config import Channel as ChannelConfig

    target = channel(ChannelConfig(name="c", type=kind, url="http://x", **extra))  # type: ignore[arg-type]
    long = replace(NOTICE, runbook="x" * 50_000)
    text = json.dumps(target.request(long, NOW).json, ensure_ascii=False)
    assert len(text) < target.max_chars + 2000
    assert "kv on qwen-a" in text


def test_pagerduty_trigger_and_resolve_share_the_dedup_key() -> None:
    from dataclasses import replace

    from kneepoint.config import Channel as ChannelConfig

    pd = channel(ChannelConfig(name="pd", type="pagerduty", routing_key="R0UTING"))
    trigger = pd.request(NOTICE, NOW)
    resolve = pd.request(replace(NOTICE, status=RESOLVED), NOW)
    assert trigger.url == "https://events.pagerduty.com/v2/enqueue"
    assert trigger.json["event_action"] == "trigger" and resolve.json["event_action"] == "resolve"
    assert trigger.json["dedup_key"] == resolve.json["dedup_key"] == "fp"
    assert trigger.json["payload"]["severity"] == "critical"


def test_teams_gets_an_adaptive_card_and_alertmanager_its_alert_list() -> None:
    from kneepoint.config import Channel as ChannelConfig

    teams = channel(ChannelConfig(name="t", type="teams", url="http://x")).request(NOTICE, NOW)
    (attachment,) = teams.json["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert attachment["content"]["type"] == "AdaptiveCard"
    am = channel(ChannelConfig(name="a", type="alertmanager", url="http://am:9093/"))
    posted = am.request(NOTICE, NOW)
    assert posted.url == "http://am:9093/api/v2/alerts"
    assert posted.json[0]["labels"]["alertname"] == "kv"


def test_alerts_test_sends_through_the_outbox_and_says_what_happened(
    tmp_path: Path, receiver: Receiver
) -> None:
    from typer.testing import CliRunner

    from kneepoint.cli import app

    config_file = tmp_path / "kneepoint.yaml"
    config_file.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        "channels:\n"
        f"  - {{name: ok, type: slack, url: '{receiver.url('/ok')}'}}\n"
        f"  - {{name: gone, type: slack, url: '{receiver.url('/gone')}'}}\n"
    )
    receiver.script["/gone"] = [(410, {}, b"channel_is_archived")]
    open_store(f"sqlite:///{tmp_path / 'k.db'}")  # the store exists (`kneepoint migrate`)
    runner = CliRunner()
    ok = runner.invoke(app, ["alerts", "test", "--channel", "ok", "--config", str(config_file)])
    assert ok.exit_code == 0 and "ok: delivered" in ok.output
    assert "A test of channel 'ok' from kneepoint" in json.loads(receiver.received[0].body)["text"]
    gone = runner.invoke(app, ["alerts", "test", "--channel", "gone", "--config", str(config_file)])
    assert gone.exit_code == 1 and "refused (HTTP 410: channel_is_archived)" in gone.output
    unknown = runner.invoke(app, ["alerts", "test", "--channel", "x", "--config", str(config_file)])
    assert unknown.exit_code == 2 and "no channel named 'x'" in unknown.output


def test_the_alerts_page_shows_channel_health_and_the_delivery_log(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from streamlit.testing.v1 import AppTest

    from alerts.evaluate import evaluate_once
    from app.registry import PAGES_DIR
    from kneepoint.config import load_config
    from tests.seed import seed

    config_file = seed(tmp_path, time.time())
    config_file.write_text(
        config_file.read_text()
        + "channels:\n"
        + f"  - {{name: oncall, type: slack, url: '{receiver.url('/oncall')}'}}\n"
        + f"  - {{name: old-room, type: discord, url: '{receiver.url('/old')}'}}\n"
        + "rules:\n"
        + "  - {name: target-down, metric: up, op: '==', threshold: 0, for: 0s,"
        + " severity: page, channels: [oncall, old-room]}\n"
    )
    receiver.script["/old"] = [(404, {}, b"Unknown Webhook")]
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config_file))
    config = load_config(config_file)
    sessions = open_store(config.database)
    now = time.time() - 2
    with sessions.begin() as session:
        evaluate_once(session, config, now)
    deliver(sessions, config, now)
    page = AppTest.from_file(str(PAGES_DIR / "alerts.py"), default_timeout=60).run()
    assert not page.exception, [e.value for e in page.exception]
    health = {m.label: m.value for m in page.metric}
    assert health["oncall"] == "ok" and health["old-room"] == "broken"
    log = page.dataframe[-1].value  # headers for people, states as badges (app/tables.py)
    assert sorted(zip(log["Channel"], log["State"], strict=True)) == [
        ("old-room", "● failed"),
        ("oncall", "● sent"),
    ]
    text = json.loads(next(r for r in receiver.received if r.path == "/oncall").body)["text"]
    assert "target-down on replica-down" in text and "page=health" in text
    # The page's test button sends through the outbox and says what became of it.
    page.button(key="test-oncall").click().run()
    assert "Delivered." in [m.value for m in page.markdown]
    assert "A test of channel 'oncall'" in json.loads(receiver.received[-1].body)["text"]


def test_a_silence_suppresses_and_a_down_replica_inhibits_its_other_alerts(
    tmp_path: Path, receiver: Receiver
) -> None:
    from alerts import silences
    from alerts.lifecycle import evaluate

    config, kv = setup(tmp_path, receiver, "slack")
    down = Rule.model_validate(
        {"name": "target-down", "metric": "up", "op": "==", "threshold": 0, "channels": ["chat"]}
    )
    sessions = open_store(config.database)
    with sessions.begin() as session:
        silence = silences.create(
            session,
            {"alertname": "kv-cache-saturated", "replica": "b"},
            NOW - 10,
            NOW + 3600,
            "ana",
            "resizing b",
            NOW,
        )
    values = {
        "a": {"kv_cache_occupancy": 0.97, "up": 0.0},  # down: its KV alert is a consequence
        "b": {"kv_cache_occupancy": 0.97, "up": 1.0},  # silenced
        "c": {"kv_cache_occupancy": 0.97, "up": 1.0},  # sent
    }
    states, changes = evaluate([down, kv.model_copy(update={"for_": 0})], values, {}, NOW)
    with sessions.begin() as session:
        assert enqueue(session, config, [down, kv], changes, NOW, states) == 2
    deliver(sessions, config, NOW)
    texts = sorted(json.loads(r.body)["text"].split("\n")[0] for r in receiver.received)
    assert texts == ["[PAGE] kv-cache-saturated on c", "[TICKET] target-down on a"]
    muted = {
        (json.loads(r.notice)["replica"], r.last_error)
        for r in rows(sessions)
        if r.state == "muted"
    }
    assert muted == {
        ("a", "inhibited: a is down"),
        ("b", f"silenced by #{silence} (ana: resizing b)"),
    }
    # Expired, the silence no longer holds.
    with sessions.begin() as session:
        assert silences.expire(session, silence, NOW + 60)
        assert not silences.expire(session, silence, NOW + 61)
        assert (
            silences.muted(
                {"alertname": "kv-cache-saturated", "replica": "b"},
                silences.load(session),
                {},
                NOW + 61,
            )
            is None
        )
    with sessions.begin() as session, pytest.raises(ValueError, match="at least one matcher"):
        silences.create(session, {}, NOW, NOW + 1, "x", "y", NOW)


def test_one_rule_firing_on_several_replicas_is_one_message_except_for_pagerduty(
    tmp_path: Path, receiver: Receiver
) -> None:
    from alerts.lifecycle import evaluate

    config = Config.model_validate(
        {
            "database": f"sqlite:///{tmp_path / 'k.db'}",
            "channels": [
                {"name": "chat", "type": "slack", "url": receiver.url("/slack")},
                {"name": "hook", "type": "webhook", "url": receiver.url("/hook")},
                {"name": "pd", "type": "pagerduty", "url": receiver.url("/pd"), "routing_key": "R"},
            ],
        }
    )
    kv = Rule.model_validate(
        {
            "name": "kv",
            "metric": "kv_cache_occupancy",
            "op": ">",
            "threshold": 0.9,
            "channels": ["chat", "hook", "pd"],
        }
    )
    values = {name: {"kv_cache_occupancy": 0.91 + i / 100} for i, name in enumerate("abc")}
    states, changes = evaluate([kv], values, {}, NOW)
    sessions = open_store(config.database)
    with sessions.begin() as session:
        assert enqueue(session, config, [kv], changes, NOW, states) == 1 + 1 + 3
    deliver(sessions, config, NOW)
    by_path: dict[str, list[dict]] = {}
    for got in receiver.received:
        by_path.setdefault(got.path, []).append(json.loads(got.body))
    (slack,) = by_path["/slack"]
    assert slack["text"].startswith("[TICKET] kv on 3 replicas")
    assert "values a 0.91, b 0.92, c 0.93 (threshold > 0.9)" in slack["text"]
    (hook,) = by_path["/hook"]
    assert [a["labels"]["replica"] for a in hook["alerts"]] == ["a", "b", "c"]
    assert hook["commonLabels"] == {"alertname": "kv", "severity": "ticket"}
    assert len({a["fingerprint"] for a in hook["alerts"]}) == 3
    assert sorted(p["payload"]["source"] for p in by_path["/pd"]) == ["a", "b", "c"]


TELEGRAM = {"token": "123:ABC", "chat_id": "-100200"}
SHAPES = {
    "slack": ({}, lambda body: body["text"]),
    "discord": ({}, lambda body: body["content"]),
    "teams": ({}, lambda body: body["attachments"][0]["content"]["body"][0]["text"]),
    "feishu": ({}, lambda body: body["content"]["text"]),
    "dingtalk": ({}, lambda body: body["text"]["content"]),
    "wecom": ({}, lambda body: body["text"]["content"]),
    "telegram": (TELEGRAM, lambda body: body["text"]),
    "pagerduty": ({"routing_key": "R"}, lambda body: body["payload"]["summary"]),
    "webhook": ({}, lambda body: body["alerts"][0]["labels"]["alertname"]),
    "alertmanager": ({}, lambda body: body[0]["labels"]["alertname"]),
}


@pytest.mark.parametrize("kind", SHAPES)
def test_every_channel_delivers_its_platforms_payload(
    kind: str, tmp_path: Path, receiver: Receiver
) -> None:
    extra, text_of = SHAPES[kind]
    config, rule = setup(tmp_path, receiver, kind, **extra)
    if kind == "telegram":  # the Bot API's base URL, here the receiver
        api = config.channels[0].model_copy(update={"url": HookURL(receiver.url(""))})
        config = config.model_copy(update={"channels": [api]})
    sessions = open_store(config.database)
    fire(sessions, config, rule)
    assert deliver(sessions, config, NOW)["sent"] == 1
    (got,) = receiver.received
    assert "kv-cache-saturated" in text_of(json.loads(got.body))
    expected_path = {
        "telegram": "/bot123:ABC/sendMessage",
        "alertmanager": f"/{kind}/api/v2/alerts",
    }.get(kind, f"/{kind}")
    assert got.path == expected_path


RAW = r"\d\.\d+e[+-]\d+|\d{4}-\d{2}-\d{2}T\d"  # exponent floats, ISO times


@pytest.mark.parametrize(
    ("value", "threshold", "shown"),
    [
        (1.86933e9, 1e6, "value 1,869,330,000 (threshold > 1,000,000)"),
        (9999.5, 5000.0, "value 10,000 (threshold > 5,000)"),
        (0.000123, 0.0001, "value 0.000123 (threshold > 0.0001)"),
        (0.97, 0.9, "value 0.97 (threshold > 0.9)"),
    ],
)
def test_a_message_says_numbers_as_people_write_them(
    value: float, threshold: float, shown: str
) -> None:
    import re

    notice = Notice(
        fingerprint="f",
        rule="big-counter",
        replica="qwen-a",
        status=FIRING,
        severity="page",
        value=value,
        threshold=threshold,
        op=">",
        since=NOW - 60,
        at=NOW,
    )
    text = notice.text()
    assert shown in text
    assert not re.search(RAW, text), text


# --- an ending that is no recovery (the replica's engine no longer exposes the metric) ---

GONE = "not exposed by SGLang before 0.5.10: retractions were only a per-interval gauge"
SWITCHED = NOW - 120  # when SGLang was first seen: after the alert began (NOW - 360)
SWITCHED_SHOWN = "the replica's engine changed at 2026-11-18 11:04 UTC"
# What each platform shows people (chat), or the field that carries the why (machines).
ENDED_SHOWN = {
    **{kind: text_of for kind, (_, text_of) in SHAPES.items()},
    "teams": lambda body: "\n".join(
        block["text"] for block in body["attachments"][0]["content"]["body"]
    ),
    "pagerduty": lambda body: body["payload"]["summary"],
    "webhook": lambda body: body["alerts"][0]["annotations"]["summary"],
    "alertmanager": lambda body: body[0]["annotations"]["summary"],
}


def end(sessions: sessionmaker[Session], config: Config, rule: Rule, note: str | None) -> None:
    """The alert on qwen-a, firing since NOW - 300, ends now: with `note`, because SGLang,
    first seen at SWITCHED, does not expose its metric (alerts.lifecycle.evaluate); without,
    a recovery."""
    alert = Alert("f1ngerpr1nt", rule.name, "qwen-a", RESOLVED, None, 0.9, NOW - 360, NOW - 300)
    change = Transition(alert, FIRING, RESOLVED, note=note)
    with sessions.begin() as session:
        enqueue(session, config, [rule], [change], NOW, engine_since={"qwen-a": SWITCHED})


@pytest.mark.parametrize("kind", SHAPES)
def test_an_ending_without_a_recovery_is_never_called_resolved(
    kind: str, tmp_path: Path, receiver: Receiver
) -> None:
    extra, _ = SHAPES[kind]
    config, rule = setup(tmp_path, receiver, kind, **extra)
    if kind == "telegram":
        api = config.channels[0].model_copy(update={"url": HookURL(receiver.url(""))})
        config = config.model_copy(update={"channels": [api]})
    sessions = open_store(config.database)
    end(sessions, config, rule, GONE)
    assert deliver(sessions, config, NOW)["sent"] == 1
    (got,) = receiver.received
    body = json.loads(got.body)
    shown = ENDED_SHOWN[kind](body)
    assert "Ended without a recovery" in shown and GONE in shown, shown
    assert "RESOLVED" not in got.body.decode() and "no data" not in got.body.decode()
    if kind not in ("webhook", "alertmanager"):  # their summary annotation is the why alone
        assert "[ENDED] kv-cache-saturated on qwen-a" in shown
    if kind in ("pagerduty", "webhook", "alertmanager"):
        assert SWITCHED_SHOWN in shown
    else:  # chat: the title, the why with when the engine changed, then the rest
        lines = shown.split("\n")
        assert lines[0] == "[ENDED] kv-cache-saturated on qwen-a"
        assert lines[1].startswith("Ended without a recovery") and SWITCHED_SHOWN in lines[1]
        assert "value not measured (threshold > 0.9)" in shown
    # The machines still close it: only a resolve (endsAt) ends the incident there.
    if kind == "pagerduty":
        assert body["event_action"] == "resolve" and body["payload"]["custom_details"] == {
            "note": GONE
        }
    if kind == "webhook":
        assert (body["status"], body["note"]) == (RESOLVED, GONE)
        assert body["alerts"][0]["annotations"]["note"] == GONE
        assert body["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
    if kind == "alertmanager":
        assert body[0]["annotations"]["note"] == GONE and "endsAt" in body[0]


@pytest.mark.parametrize("kind", ["slack", "webhook", "pagerduty"])
def test_a_recovery_is_still_resolved_with_no_note(
    kind: str, tmp_path: Path, receiver: Receiver
) -> None:
    # The same ending without a note: a plain resolution, as before (the engine change time
    # is no part of it either).
    extra, _ = SHAPES[kind]
    config, rule = setup(tmp_path, receiver, kind, **extra)
    sessions = open_store(config.database)
    end(sessions, config, rule, None)
    assert deliver(sessions, config, NOW)["sent"] == 1
    (got,) = receiver.received
    body = json.loads(got.body)
    assert "Ended" not in got.body.decode() and "engine changed" not in got.body.decode()
    if kind == "slack":
        assert body["text"].startswith("[RESOLVED] kv-cache-saturated on qwen-a\nvalue no data")
    if kind == "webhook":
        assert (body["status"], body["note"]) == (RESOLVED, None)
        assert "note" not in body["alerts"][0]["annotations"]
    if kind == "pagerduty":
        assert body["event_action"] == "resolve" and "payload" not in body


def test_an_engine_seen_before_the_alert_began_is_not_named_as_its_change(
    tmp_path: Path, receiver: Receiver
) -> None:
    # A metric gone with no engine change (an upgrade of the same engine): the why, but no
    # "engine changed at" from an engine first seen long before the alert.
    config, rule = setup(tmp_path, receiver, "slack")
    sessions = open_store(config.database)
    alert = Alert("f1ngerpr1nt", rule.name, "qwen-a", RESOLVED, None, 0.9, NOW - 360, NOW - 300)
    with sessions.begin() as session:
        enqueue(
            session,
            config,
            [rule],
            [Transition(alert, FIRING, RESOLVED, note=GONE)],
            NOW,
            engine_since={"qwen-a": NOW - 86_400},
        )
    deliver(sessions, config, NOW)
    (got,) = receiver.received
    text = json.loads(got.body)["text"]
    assert text.startswith("[ENDED] kv-cache-saturated on qwen-a\nEnded without a recovery")
    assert GONE in text and "engine changed" not in text
