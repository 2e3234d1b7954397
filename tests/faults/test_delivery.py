"""Delivery faults against a real loopback receiver: one that refuses the connection, holds
the request past the deadline, trickles its answer, answers 429 or 500, and a channel whose
URL is invalid. For each: what is stored, what the receiver got, and that the other channel's
row still goes out in the same round. Then two senders over one outbox, and a sender killed
with SIGKILL in the middle of a send."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from alerts.lifecycle import FIRING, PENDING, RESOLVED, Alert, Transition
from alerts.messages import enqueue
from alerts.outbox import COUNTS, channel_health, deliver_due, http_sender
from kneepoint.config import Config, ConfigError, Rule, parse_config
from kneepoint.secrets import HookURL
from kneepoint.store.db import open_store
from kneepoint.store.models import NotificationRow
from tests.conftest import free_port

NOW = 1_795_000_000.0
DEADLINE = 3.0  # the tests' overall deadline per send, seconds (loopback needs ms)


@dataclass
class Got:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def key(self) -> str:
        return self.headers.get("Idempotency-Key", "")


@dataclass
class Sink:
    """A real HTTP receiver on loopback. Each path answers by its mode: "ok" (200), an int
    (that status, with `headers`), "hold" (keeps the request until `release` is set, then
    200), "slow" (200 after 1 s), "trickle" (the status line a byte at a time for ~10 s),
    "pair" (waits until a second "pair" request arrives, then 200)."""

    port: int = 0
    modes: dict[str, object] = field(default_factory=dict)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)
    got: list[Got] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    pair: threading.Barrier = field(default_factory=lambda: threading.Barrier(2, timeout=5))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def paths(self) -> list[str]:
        with self.lock:
            return [g.path for g in self.got]

    def keys(self) -> list[str]:
        with self.lock:
            return [g.key for g in self.got]


@pytest.fixture
def sink() -> Iterator[Sink]:
    with serving() as state:
        yield state


@contextmanager
def serving() -> Iterator[Sink]:
    """Run a Sink on a free loopback port for the duration of the block."""
    state = Sink()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with state.lock:
                state.got.append(Got(self.path, dict(self.headers.items()), body))
            state.arrived.set()
            # The sender may have given up at its deadline: nothing left to answer.
            with suppress(BrokenPipeError, ConnectionResetError, threading.BrokenBarrierError):
                self._answer(state.modes.get(self.path, "ok"))

        def _answer(self, mode: object) -> None:
            if mode == "hold":
                state.release.wait(30)
            elif mode == "slow":  # answers, but takes a while each time
                time.sleep(1.0)
            elif mode == "pair":
                state.pair.wait()
            elif mode == "trickle":  # each byte well within any per-read timeout
                for byte in b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 75:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.1)
                self.wfile.write(b"\r\nContent-Length: 0\r\n\r\n")
                return
            status = mode if isinstance(mode, int) else 200
            reply = b'{"code": 0}' if status == 200 else b"not now"
            self.send_response(status)
            for name, value in state.headers.get(self.path, {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state
    finally:
        state.release.set()
        state.pair.abort()
        server.shutdown()
        server.server_close()


def outbox(tmp_path: Path, channels: dict[str, str], **extra: object) -> Config:
    """A config whose channels (name -> URL) are all webhooks; built without validation so
    a test can give a channel a URL the config loader would refuse."""
    specs = [{"name": name, "type": "webhook", "url": "http://placeholder"} for name in channels]
    config = Config.model_validate(
        {"database": f"sqlite:///{tmp_path / 'k.db'}", "channels": specs, **extra}
    )
    fixed = [c.model_copy(update={"url": HookURL(channels[c.name])}) for c in config.channels]
    return config.model_copy(update={"channels": fixed})


def rule_to(*channels: str) -> Rule:
    return Rule.model_validate(
        {
            "name": "kv",
            "metric": "kv_cache_occupancy",
            "op": ">",
            "threshold": 0.9,
            "channels": list(channels),
        }
    )


def fire(
    sessions: sessionmaker[Session],
    config: Config,
    rule: Rule,
    fingerprint: str = "fp",
    after: str = FIRING,
    at: float = NOW,
) -> None:
    alert = Alert(fingerprint, rule.name, fingerprint, after, 0.97, 0.9, at - 60, at - 30)
    before = PENDING if after == FIRING else FIRING
    with sessions.begin() as session:
        enqueue(session, config, [rule], [Transition(alert, before, after)], at)


def deliver(sessions: sessionmaker[Session], config: Config, at: float) -> dict[str, int]:
    with sessions() as session:
        return deliver_due(session, config, at, http_sender(DEADLINE), deadline=DEADLINE)


def by_channel(sessions: sessionmaker[Session]) -> dict[str, NotificationRow]:
    with sessions() as session:
        return {r.channel: r for r in session.scalars(select(NotificationRow))}


# fault -> (its channel's path and mode, headers it answers with)
FAULTS: dict[str, tuple[object, dict[str, str]]] = {
    "refused": ("closed port", {}),
    "timeout": ("hold", {}),
    "trickle": ("trickle", {}),
    "429": (429, {"Retry-After": "120"}),
    "500": (500, {}),
    "invalid-url": ("bad url", {}),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_faulty_channel_is_recorded_and_the_other_still_gets_its_message(
    fault: str, sink: Sink, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mode, headers = FAULTS[fault]
    secret_path = "/hook/T0KEN-s3cret"
    bad = {
        "closed port": f"http://127.0.0.1:{free_port()}{secret_path}",
        "bad url": f"http://127.0.0.1:{sink.port}{secret_path}\x07",
    }.get(str(mode), sink.url(secret_path))
    sink.modes[secret_path] = mode
    sink.headers[secret_path] = headers
    config = outbox(tmp_path, {"faulty": bad, "fine": sink.url("/fine")})
    sessions = open_store(config.database)
    fire(sessions, config, rule_to("faulty", "fine"))

    counts = deliver(sessions, config, NOW)
    rows = by_channel(sessions)
    fine, faulty = rows["fine"], rows["faulty"]
    # The other channel's row went out in the same round, whatever the faulty one did.
    assert (fine.state, fine.sent_at) == ("sent", NOW), fine.last_error
    assert "/fine" in sink.paths()
    assert counts["sent"] == 1
    reached = sink.paths().count(secret_path)
    if fault == "invalid-url":
        assert counts["failed"] == 1 and faulty.state == "failed"
        assert faulty.last_error == (
            f"invalid URL (http://127.0.0.1:{sink.port}/…): is not a valid URL"
            " (Invalid non-printable ASCII character in URL)"
        )
        assert reached == 0
        with sessions() as session:
            assert channel_health(session) == {"faulty": "broken", "fine": "ok"}
        assert deliver(sessions, config, NOW + 3600)["sent"] == 0  # refused for good
    else:
        assert counts["retry"] == 1 and faulty.state == "pending" and faulty.attempts == 1
        wait = 120 if fault == "429" else 10
        assert faulty.next_attempt_at == NOW + wait
        expected_error = {
            "refused": "ConnectError: All connection attempts failed",
            "timeout": f"no complete answer within {DEADLINE:g}s",
            "trickle": f"no complete answer within {DEADLINE:g}s",
            "429": "HTTP 429: not now",
            "500": "HTTP 500: not now",
        }[fault]
        assert faulty.last_error == expected_error
        assert reached == (0 if fault == "refused" else 1)
        # Only an unanswered request may have reached the platform: its re-send is counted.
        assert faulty.maybe_sent == (fault in ("timeout", "trickle"))
        sink.modes[secret_path] = "ok"
        if fault == "refused":  # the receiver is back, on its own port now
            config = outbox(tmp_path, {"faulty": sink.url(secret_path), "fine": sink.url("/f")})
        assert deliver(sessions, config, NOW + wait)["sent"] == 1, [
            (r.channel, r.state, r.last_error) for r in by_channel(sessions).values()
        ]
        again = by_channel(sessions)["faulty"]
        assert again.state == "sent" and again.attempts == 2
        assert again.resends == (1 if fault in ("timeout", "trickle") else 0)
        keys = [g.key for g in sink.got if g.path == secret_path]
        assert len(set(keys)) == 1  # a retry carries the same idempotency key
    # The secret part of the URL is in no stored error and no log line.
    assert "T0KEN" not in (faulty.last_error or "")
    assert "T0KEN" not in caplog.text


def test_a_slow_channel_does_not_hold_another_one(sink: Sink, tmp_path: Path) -> None:
    # Each receiver answers only once the other one's request has arrived: both are sent
    # only if the two channels are sent at the same time, not one after the other.
    sink.modes = {"/a": "pair", "/b": "pair"}
    config = outbox(tmp_path, {"a": sink.url("/a"), "b": sink.url("/b")})
    sessions = open_store(config.database)
    fire(sessions, config, rule_to("a", "b"))
    assert deliver(sessions, config, NOW)["sent"] == 2
    assert sorted(sink.paths()) == ["/a", "/b"]


def test_a_channel_that_does_not_answer_gives_up_its_other_rows_for_the_round(
    sink: Sink, tmp_path: Path
) -> None:
    sink.modes["/slow"] = "hold"
    config = outbox(tmp_path, {"slow": sink.url("/slow")})
    sessions = open_store(config.database)
    for alert in ("a", "b", "c"):
        fire(sessions, config, rule_to("slow"), fingerprint=alert)
    counts = deliver(sessions, config, NOW)
    assert counts["retry"] == 1 and len(sink.got) == 1  # one deadline, not three
    with sessions() as session:
        rows = list(session.scalars(select(NotificationRow).order_by(NotificationRow.id)))
    assert [(r.attempts, r.claimed_by, r.maybe_sent) for r in rows] == [
        (1, None, True),
        (0, None, False),
        (0, None, False),
    ]
    sink.release.set()
    sink.modes["/slow"] = "ok"
    assert deliver(sessions, config, NOW + 1)["sent"] == 2  # the two untried ones go next


def test_a_round_starts_no_send_after_two_deadlines(sink: Sink, tmp_path: Path) -> None:
    sink.modes["/slow"] = "slow"  # 1 s each: ten take 10 s, past the 6 s budget
    config = outbox(tmp_path, {"slow": sink.url("/slow"), "fine": sink.url("/fine")})
    sessions = open_store(config.database)
    for alert in range(10):
        fire(sessions, config, rule_to("slow", "fine"), fingerprint=f"alert-{alert}")
    first = deliver(sessions, config, NOW)
    slow_sent = sink.paths().count("/slow")
    assert 1 <= slow_sent < 10 and sink.paths().count("/fine") == 10
    assert first["sent"] + first["retry"] == 10 + slow_sent
    with sessions() as session:
        untried = list(
            session.scalars(
                select(NotificationRow).where(
                    NotificationRow.state == "pending", NotificationRow.attempts == 0
                )
            )
        )
    # The rest were given back untried: no lease, no possible duplicate.
    assert len(untried) == 10 - slow_sent
    assert {(r.claimed_by, r.maybe_sent) for r in untried} == {(None, False)}
    sink.modes["/slow"] = "ok"
    for later in range(1, 20):  # the next rounds send them (a minute apart: past any backoff)
        if deliver(sessions, config, NOW + 60 * later) == dict.fromkeys(COUNTS, 0):
            break
    with sessions() as session:
        assert {r.state for r in session.scalars(select(NotificationRow))} == {"sent"}
    assert len(set(sink.keys())) == 20


def test_config_refuses_an_unusable_channel_url_without_quoting_it() -> None:
    def load(url: str, environ: dict[str, str] | None = None) -> Config:
        text = f"channels:\n  - {{name: hook, type: slack, url: '{url}'}}\n"
        return parse_config(text, environ=environ or {})

    cases = {
        "hooks.slack.com/services/T0KEN": "has no scheme",
        "ftp://hooks.example/T0KEN": "must be an http:// or https:// URL",
        "http://hooks.example:T0KEN/": "is not a valid URL (Invalid port)",
        "http://[hooks.example/T0KEN": "has a host name that cannot be looked up",
        "https:///T0KEN": "has no host",
    }
    for url, problem in cases.items():
        with pytest.raises(ConfigError) as refused:
            load(url)
        message = str(refused.value)
        assert message.startswith("kneepoint.yaml: channels[0].url: ") and problem in message
        assert "T0KEN" not in message
    # ${VAR} expansion still works, and the expanded URL is what is checked.
    hook = load("${HOOK}", {"HOOK": "https://hooks.example/T0KEN"}).channels[0].url
    assert hook is not None and hook.reveal() == "https://hooks.example/T0KEN"
    with pytest.raises(ConfigError, match="has no scheme") as refused:
        load("${HOOK}", {"HOOK": "hooks.example/T0KEN"})
    assert "T0KEN" not in str(refused.value)


DELIVER_LOOP = """
import sys, time
from alerts.outbox import deliver_due, http_sender
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.models import NotificationRow
from sqlalchemy import func, select
from pathlib import Path
config = load_config(sys.argv[1])
sessions = open_store(config.database)
Path(sys.argv[3]).touch()  # ready; both start together
while not Path(sys.argv[4]).exists():
    time.sleep(0.01)
now, rounds, sent = float(sys.argv[2]), 0, 0
while rounds < 200:
    with sessions() as session:
        sent += deliver_due(session, config, now, http_sender(30), deadline=30)["sent"]
        left = session.scalar(select(func.count()).select_from(NotificationRow)
                              .where(NotificationRow.state == "pending"))
    rounds += 1
    if not left:
        break
    time.sleep(0.1)
print(sent)
"""


def write_config(tmp_path: Path, channels: dict[str, str]) -> Path:
    file = tmp_path / "kneepoint.yaml"
    lines = [f"database: sqlite:///{tmp_path / 'k.db'}", "channels:"]
    lines += [f"  - {{name: {n}, type: webhook, url: '{u}'}}" for n, u in channels.items()]
    file.write_text("\n".join(lines) + "\n")
    return file


def test_two_processes_over_one_outbox_send_every_row_exactly_once(
    sink: Sink, tmp_path: Path
) -> None:
    channels = {name: sink.url(f"/{name}") for name in ("a", "b", "c")}
    file = write_config(tmp_path, channels)
    config = outbox(tmp_path, channels)
    sessions = open_store(config.database)
    for alert in range(25):  # more per channel than one round takes: both get some
        fire(sessions, config, rule_to("a", "b", "c"), fingerprint=f"alert-{alert}")
    go = tmp_path / "go"
    senders = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                DELIVER_LOOP,
                str(file),
                str(NOW),
                str(tmp_path / f"ready{i}"),
                str(go),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    assert poll(lambda: all((tmp_path / f"ready{i}").exists() for i in range(2)), 60)
    go.touch()
    sent = [int(process.communicate(timeout=60)[0]) for process in senders]
    assert [process.returncode for process in senders] == [0, 0]
    with sessions() as session:
        rows = list(session.scalars(select(NotificationRow)))
    assert len(rows) == 75 and {r.state for r in rows} == {"sent"}
    assert sum(sent) == 75 and len(sink.got) == 75  # each row sent by one of them, once
    assert len(set(sink.keys())) == 75 and all(r.resends == 0 for r in rows)


HOLD_ONE = """
import sys
from alerts.outbox import deliver_due, http_sender
from kneepoint.config import load_config
from kneepoint.store.db import open_store
config = load_config(sys.argv[1])
sessions = open_store(config.database)
with sessions() as session:
    deliver_due(session, config, float(sys.argv[2]), http_sender(30), deadline=30)
"""


def poll(condition: Callable[[], bool], seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_sender_killed_mid_send_is_taken_over_and_the_duplicate_counted(
    sink: Sink, tmp_path: Path
) -> None:
    sink.modes["/hook"] = "hold"
    file = write_config(tmp_path, {"hook": sink.url("/hook")})
    config = outbox(tmp_path, {"hook": sink.url("/hook")})
    sessions = open_store(config.database)
    fire(sessions, config, rule_to("hook"))
    sender = subprocess.Popen([sys.executable, "-c", HOLD_ONE, str(file), str(NOW)])
    try:
        assert poll(sink.arrived.is_set), "the request never reached the receiver"
        os.kill(sender.pid, signal.SIGKILL)  # between the send and the commit of its outcome
    finally:
        sender.wait(10)
    assert sender.returncode == -signal.SIGKILL
    (row,) = by_channel(sessions).values()
    assert row.state == "pending" and row.claimed_by and row.maybe_sent
    lease_end = row.claimed_until
    assert lease_end is not None and lease_end > NOW

    sink.modes["/hook"] = "ok"
    # Restarted while the dead sender's lease runs: nobody sends the row yet.
    assert deliver(sessions, config, NOW + 1)["sent"] == 0
    assert len(sink.got) == 1
    # The lease ran out: the row is taken over, sent, and the possible duplicate counted.
    assert deliver(sessions, config, lease_end + 1)["sent"] == 1
    (row,) = by_channel(sessions).values()
    assert row.state == "sent" and row.resends == 1 and row.claimed_by is None
    keys = sink.keys()
    assert len(keys) == 2 and len(set(keys)) == 1  # one duplicate, with the same key
    assert json.loads(sink.got[0].body)["alerts"][0]["fingerprint"] == "fp"


@pytest.mark.parametrize("then", [FIRING, RESOLVED])
def test_a_muted_firing_never_takes_the_place_of_an_unsent_one(
    then: str, sink: Sink, tmp_path: Path
) -> None:
    # Found by bench/chaos.py: a firing row left pending by a 500, then the same alert's
    # firing → firing news muted (inhibited: its replica's target-down fires): the muted row
    # superseded the unsent one, and the receiver never heard of the alert. A muted
    # resolution still supersedes it: the alert is over, and its end is muted.
    sink.modes["/hook"] = 500
    config = outbox(tmp_path, {"hook": sink.url("/hook")})
    sessions = open_store(config.database)
    rule = rule_to("hook")
    fire(sessions, config, rule, fingerprint="replica-a")
    assert deliver(sessions, config, NOW)["retry"] == 1
    down = Alert("down", "target-down", "replica-a", FIRING, 0.0, 0.0, NOW, NOW)
    again = Alert("replica-a", rule.name, "replica-a", then, None, 0.9, NOW - 60, NOW - 30)
    with sessions.begin() as session:
        enqueue(
            session, config, [rule], [Transition(again, FIRING, then)], NOW + 20, {"down": down}
        )
    sink.modes["/hook"] = "ok"
    deliver(sessions, config, NOW + 3600)
    with sessions() as session:
        states = [
            r.state for r in session.scalars(select(NotificationRow).order_by(NotificationRow.id))
        ]
    if then == FIRING:
        assert states == ["sent", "muted"]
        assert [json.loads(g.body)["status"] for g in sink.got if g.path == "/hook"][-1] == "firing"
    else:
        assert states == ["superseded", "muted"]
