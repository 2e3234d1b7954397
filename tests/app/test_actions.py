"""app/actions.py through the pages, in Streamlit's AppTest: each mutation checks the role on
the server where it happens and lands in the audit trail; the silence policy; the upload cap.

Three set-ups: `auth: {mode: none}` with `anonymous_role: viewer` (read only), the same with
`operator` (or `admin`), and no `auth:` at all (loopback: the local user, admin). What a
script run sends by hand (AppTest.from_function calling the action itself, as a forged form
would) is refused the same way as what the page's widgets send.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
from alerts import silences
from app.registry import PAGES_DIR
from kneepoint import audit
from kneepoint.config import load_config
from kneepoint.knee.runs import Point, Run
from kneepoint.store.db import open_store
from kneepoint.store.models import NotificationRow, SilenceRow
from kneepoint.store.runs import load_runs, save_run
from tests.seed import seed

ALERTS = str(PAGES_DIR / "alerts.py")
KNEE = str(PAGES_DIR / "knee.py")
WEEKLY = str(PAGES_DIR / "weekly.py")
AUDIT = str(PAGES_DIR / "audit.py")
MAIN = str(PAGES_DIR.parent / "main.py")

VIEWER = "auth: {mode: none, anonymous_role: viewer}"
OPERATOR = "auth: {mode: none, anonymous_role: operator}"
ADMIN = "auth: {mode: none, anonymous_role: admin}"
LOOPBACK = ""  # no auth: section


class Receiver:
    """A real HTTP endpoint on loopback that counts what channels post to it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                receiver.bodies.append(self.rfile.read(length))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.server.shutdown()
    running.server.server_close()


class Store:
    """The seeded config and its database, as a test reads them back."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.settings = load_config(config)
        self.sessions: sessionmaker[Session] = open_store(self.settings.database)

    def count(self, model: type) -> int:
        with self.sessions() as session:
            return int(session.scalar(select(func.count()).select_from(model)) or 0)

    def entries(self) -> list[audit.Entry]:
        with self.sessions() as session:
            return audit.entries(session, 0.0)

    def silences(self) -> list[silences.Silence]:
        with self.sessions() as session:
            return silences.load(session)

    def runs(self) -> list[str]:
        with self.sessions() as session:
            return [r.label for r in load_runs(session)]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> Iterator[Any]:
    """A seeded store with a webhook channel (to `receiver`), a run, and limits; call it with
    the `auth:` line of the set-up under test."""

    def make(auth: str, limits: str = "limits: {silence_max: 2h, upload_mb: 0.01}") -> Store:
        config = seed(tmp_path, time.time())
        reports = tmp_path / "reports"
        config.write_text(
            config.read_text()
            + f"channels: [{{name: oncall, type: webhook, url: '{receiver.url}'}}]\n"
            + f"report: {{channels: [oncall], output_dir: '{reports}'}}\n"
            + f"{limits}\n{auth}\n"
        )
        monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
        made = Store(config)
        with made.sessions.begin() as session:
            points = tuple(Point(c, 30.0 * c) for c in (1, 8, 32))
            save_run(session, Run("bf16", "Qwen/Qwen3-4B", "vllm-bench", points), 1.0)
        return made

    yield make


def page(path: str) -> AppTest:
    app = AppTest.from_file(path, default_timeout=60).run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def button(app: AppTest, label: str, key: str | None = None) -> Any:
    found = [b for b in app.button if b.label == label and (key is None or b.key == key)]
    assert found, f"no button {label!r}: {[b.label for b in app.button]}"
    return found[0]


def errors(app: AppTest) -> list[str]:
    assert not app.exception, [e.value for e in app.exception]
    return [e.value for e in app.error]


def fill_silence(app: AppTest, matchers: str, hours: float, comment: str) -> AppTest:
    app.text_input[0].input(matchers)
    app.number_input[0].set_value(hours)
    app.text_input[1].input(comment)
    return button(app, "Silence").click().run()


def call(action: str, *args: Any) -> AppTest:
    """Run `app.actions.<action>(*args)` in a script run of its own, as a hand-made request
    would reach the server; its result or its refusal is written to the page."""

    def script(action: str, args: list[object]) -> None:
        import streamlit as st

        from app import actions
        from kneepoint.auth import Refused

        try:
            st.write(repr(getattr(actions, action)(*args)))
        except Refused as refused:
            st.error(str(refused))

    app = AppTest.from_function(script, default_timeout=60, args=(action, list(args))).run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def refused_entries(store: Store, action: str) -> list[audit.Entry]:
    return [e for e in store.entries() if e.action == action and e.outcome == "refused"]


OPERATOR_SENTENCE = "needs the operator role; anonymous has the viewer role."


# --- A viewer changes nothing ---------------------------------------------------------------


def test_a_viewer_cannot_create_a_silence_from_the_form_or_by_hand(store: Any) -> None:
    viewing = store(VIEWER)
    app = fill_silence(page(ALERTS), "alertname=kv-cache-saturated", 1.0, "deploying")
    assert errors(app) == [f"Creating a silence {OPERATOR_SENTENCE}"]
    forged = call("create_silence", "alertname=kv-cache-saturated", 1.0, "by hand")
    assert [e.value for e in forged.error] == [f"Creating a silence {OPERATOR_SENTENCE}"]
    assert viewing.count(SilenceRow) == 0
    (second, first) = refused_entries(viewing, "silence.create")
    assert first.actor == "anonymous" and first.role == "viewer" and first.via == "none"
    assert first.subject == "alertname=kv-cache-saturated" == second.subject
    assert first.detail == f"Creating a silence {OPERATOR_SENTENCE}"


def test_a_viewer_cannot_expire_a_silence(store: Any) -> None:
    viewing = store(VIEWER)
    now = time.time()
    with viewing.sessions.begin() as session:
        number = silences.create(session, {"alertname": "x"}, now, now + 3600, "ops", "c", now)
    app = page(ALERTS)
    app = button(app, "Expire", key=f"expire-{number}").click().run()
    assert errors(app) == [f"Expiring a silence {OPERATOR_SENTENCE}"]
    (kept,) = viewing.silences()
    assert kept.ends_at > time.time()  # still active
    (entry,) = refused_entries(viewing, "silence.expire")
    assert entry.subject == f"silence {number}"


def test_a_viewer_cannot_send_a_test_message(store: Any, receiver: Receiver) -> None:
    viewing = store(VIEWER)
    app = button(page(ALERTS), "Send a test message", key="test-oncall").click().run()
    assert errors(app) == [f"Sending a test message {OPERATOR_SENTENCE}"]
    assert receiver.bodies == [] and viewing.count(NotificationRow) == 0
    (entry,) = refused_entries(viewing, "channel.test")
    assert entry.subject == "channel oncall"


def test_a_viewer_cannot_delete_or_import_runs(store: Any) -> None:
    viewing = store(VIEWER)
    app = page(KNEE)
    app.selectbox(key="delete-run").select("bf16").run()
    app = button(app, "Delete").click().run()
    assert errors(app) == [f"Deleting a knee run {OPERATOR_SENTENCE}"]
    good = {"label": "up", "model_id": "m", "max_concurrency": 4, "output_throughput": 99.0}
    forged = call("import_results", [("good.json", json.dumps(good).encode())])
    assert [e.value for e in forged.error] == [f"Importing knee runs {OPERATOR_SENTENCE}"]
    assert viewing.runs() == ["bf16"]
    assert [e.subject for e in refused_entries(viewing, "run.delete")] == ["run bf16"]
    assert [e.subject for e in refused_entries(viewing, "run.import")] == ["good.json"]


def test_a_viewer_cannot_send_the_weekly_review(store: Any, receiver: Receiver) -> None:
    viewing = store(VIEWER)
    app = button(page(WEEKLY), "Send the review now").click().run()
    assert errors(app) == [f"Sending the weekly review {OPERATOR_SENTENCE}"]
    reports = viewing.config.parent / "reports"
    assert not reports.exists() or not any(reports.iterdir())
    assert receiver.bodies == [] and viewing.count(NotificationRow) == 0
    assert len(refused_entries(viewing, "report.send")) == 1


# --- An operator does, and it is recorded ---------------------------------------------------


def test_an_operator_silence_is_authored_by_the_identity_and_recorded(store: Any) -> None:
    operating = store(OPERATOR)
    app = page(ALERTS)
    assert "Author" not in [t.label for t in app.text_input]  # no free-text author any more
    app = fill_silence(app, "alertname=kv-cache-saturated, replica=replica-a", 1.5, "deploy")
    assert errors(app) == []
    (made,) = operating.silences()
    assert made.author == "anonymous" and made.comment == "deploy"
    assert made.matchers == {"alertname": "kv-cache-saturated", "replica": "replica-a"}
    assert made.ends_at - made.starts_at == pytest.approx(1.5 * 3600)
    assert f"Silence #{made.id} created." in [s.value for s in app.success]
    (entry,) = [e for e in operating.entries() if e.action == "silence.create"]
    assert (entry.outcome, entry.subject, entry.role) == ("done", f"silence {made.id}", "operator")
    assert entry.after == {
        "matchers": made.matchers,
        "ends_at": made.ends_at,
        "comment": "deploy",
    }


def test_an_expired_silence_stays_in_history_and_its_expiry_is_recorded(store: Any) -> None:
    operating = store(OPERATOR)
    now = time.time()
    with operating.sessions.begin() as session:
        number = silences.create(session, {"alertname": "x"}, now, now + 3600, "ops", "c", now)
    app = button(page(ALERTS), "Expire", key=f"expire-{number}").click().run()
    assert errors(app) == []
    (ended,) = operating.silences()
    assert ended.id == number and ended.ends_at <= time.time()
    # The page's other expanders are the runbook browser's (kneepoint/runbooks.py).
    shown = [e.label for e in app.expander if not e.label.startswith("Runbook:")]
    assert shown == ["Ended silences (1, kept for retention.silences)"]
    assert "Expire" not in [b.label for b in app.button]
    (entry,) = [e for e in operating.entries() if e.action == "silence.expire"]
    assert entry.outcome == "done" and entry.before == {
        "matchers": {"alertname": "x"},
        "ends_at": now + 3600,
    }
    assert entry.after == {"ends_at": ended.ends_at}


def test_an_operator_test_message_is_delivered_and_recorded(store: Any, receiver: Receiver) -> None:
    operating = store(OPERATOR)
    app = button(page(ALERTS), "Send a test message", key="test-oncall").click().run()
    assert errors(app) == []
    assert "Delivered." in [m.value for m in app.markdown]
    assert len(receiver.bodies) == 1
    (entry,) = [e for e in operating.entries() if e.action == "channel.test"]
    assert (entry.outcome, entry.after) == ("done", {"state": "sent"})


# --- The silence policy ---------------------------------------------------------------------


def test_a_silence_needs_a_comment(store: Any) -> None:
    operating = store(OPERATOR)
    app = fill_silence(page(ALERTS), "alertname=x", 1.0, "   ")
    assert errors(app) == ["a silence needs a comment: why, and until what"]
    assert operating.count(SilenceRow) == 0
    (entry,) = refused_entries(operating, "silence.create")
    assert entry.detail == "a silence needs a comment: why, and until what"


def test_a_silence_lasts_at_most_limits_silence_max(store: Any) -> None:
    operating = store(OPERATOR)
    app = page(ALERTS)
    assert app.number_input[0].max == 2.0  # the form offers at most silence_max (2h)
    forged = call("create_silence", "alertname=x", 2.5, "longer than allowed")
    assert [e.value for e in forged.error] == ["a silence may last at most 2h (limits.silence_max)"]
    assert operating.count(SilenceRow) == 0
    assert len(refused_entries(operating, "silence.create")) == 1
    exactly = call("create_silence", "alertname=x", 2.0, "the most allowed")
    assert not exactly.error and operating.count(SilenceRow) == 1


def test_the_default_silence_max_is_a_day(store: Any) -> None:
    operating = store(OPERATOR, limits="")
    assert operating.settings.limits.silence_max == 24 * 3600
    forged = call("create_silence", "alertname=x", 24.25, "a day and a bit")
    assert [e.value for e in forged.error] == ["a silence may last at most 1d (limits.silence_max)"]


@pytest.mark.parametrize("matchers", ["severity=page", "team=ml, severity=ticket"])
def test_a_broad_silence_needs_admin(store: Any, matchers: str) -> None:
    operating = store(OPERATOR)
    app = fill_silence(page(ALERTS), matchers, 1.0, "mute every page")
    (message,) = errors(app)
    assert "names no alertname and no replica" in message
    assert message.endswith("needs the admin role; anonymous has the operator role.")
    assert operating.count(SilenceRow) == 0
    (entry,) = refused_entries(operating, "silence.create")
    assert entry.detail == message


def test_an_admin_may_create_a_broad_silence(store: Any) -> None:
    administering = store(ADMIN)
    app = fill_silence(page(ALERTS), "severity=page", 1.0, "maintenance window")
    assert errors(app) == []
    (made,) = administering.silences()
    assert made.matchers == {"severity": "page"} and made.author == "anonymous"


# --- Uploads --------------------------------------------------------------------------------


def test_uploads_are_capped_and_type_checked_and_a_refused_file_stores_nothing(
    store: Any,
) -> None:
    operating = store(OPERATOR)  # upload_mb: 0.01, about 10 KB
    small = {"label": "up", "model_id": "m", "max_concurrency": 4, "output_throughput": 99.0}
    big = {**small, "label": "big", "padding": "x" * 20_000}
    app = call(
        "import_results",
        [
            ("small.json", json.dumps(small).encode()),
            ("big.json", json.dumps(big).encode()),
            ("notes.txt", json.dumps({**small, "label": "txt"}).encode()),
        ],
    )
    shown = app.markdown[0].value
    assert "big.json: larger than limits.upload_mb (0.01 MB)" in shown
    assert "notes.txt: not a .json or .jsonl file" in shown
    assert operating.runs() == ["bf16", "up"]
    (entry,) = [e for e in operating.entries() if e.action == "run.import"]
    assert entry.outcome == "done" and entry.after["stored"] == ["up"]
    assert entry.after["refused"] == [
        "big.json: larger than limits.upload_mb (0.01 MB)",
        "notes.txt: not a .json or .jsonl file",
    ]


def test_the_upload_limit_defaults_to_20_mb(store: Any) -> None:
    operating = store(OPERATOR, limits="")
    assert operating.settings.limits.upload_mb == 20
    app = page(KNEE)
    assert "At most 20 MB each (limits.upload_mb)" in app.get("file_uploader")[0].help


# --- The Audit page -------------------------------------------------------------------------


@pytest.mark.parametrize("auth", [VIEWER, OPERATOR])
def test_the_audit_page_refuses_anyone_but_an_admin(store: Any, auth: str) -> None:
    refusing = store(auth)
    role = "viewer" if "viewer" in auth else "operator"
    app = page(AUDIT)
    assert errors(app) == [f"The Audit page needs the admin role; anonymous has the {role} role."]
    assert not app.dataframe and not app.title  # the page stopped before showing anything
    (entry,) = refused_entries(refusing, "page.open")
    assert entry.subject == "The Audit page"


@pytest.mark.parametrize("auth", [ADMIN, LOOPBACK])
def test_the_audit_page_shows_an_admin_every_entry(store: Any, auth: str) -> None:
    administering = store(auth)
    call("create_silence", "alertname=x", 1.0, "seen on the audit page")
    app = page(AUDIT)
    assert errors(app) == []
    shown = app.dataframe[0].value
    actor = "anonymous" if auth else "local user"
    assert list(shown["Who"]) == [actor]
    assert list(shown["Action"]) == ["silence.create"]
    assert list(shown["Outcome"]) == ["● done"]
    (silence,) = administering.silences()
    assert list(shown["Subject"]) == [f"silence {silence.id}"]
    assert "seen on the audit page" in shown["After"][0]


# --- The banner -----------------------------------------------------------------------------


def test_mode_none_puts_a_no_sign_in_banner_on_every_page(store: Any) -> None:
    store(VIEWER)
    app = page(MAIN)
    assert any(w.value.startswith("No sign-in: everyone who can reach") for w in app.warning)
    assert any("viewer" in w.value for w in app.warning)


def test_loopback_without_auth_has_no_banner(store: Any) -> None:
    store(LOOPBACK)
    app = page(MAIN)
    assert not [w for w in app.warning if "No sign-in" in w.value]
    assert any("Local user (admin)" in c.value for c in app.sidebar.caption)
