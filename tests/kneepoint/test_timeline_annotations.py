"""Annotations: `kneepoint annotate` and the annotation API (kneepoint/annotations.py), a real
HTTP server on a free loopback port, with an operator token, a wrong one, a viewer token and
none; each write or refusal where the audit trail says, and the token nowhere in the logs
or the database."""

from __future__ import annotations

import json
import logging
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from kneepoint.annotations import serve_api
from kneepoint.cli import app
from kneepoint.config import Config, ConfigError, load_config
from kneepoint.store.db import open_store
from kneepoint.store.models import AnnotationRow, AuditRow
from tests.conftest import migrated

pytestmark = pytest.mark.timeout(60)
OPERATOR = secrets.token_hex(24)
VIEWER = secrets.token_hex(24)


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CI_TOKEN", OPERATOR)
    monkeypatch.setenv("DASH_TOKEN", VIEWER)
    path = tmp_path / "kneepoint.yaml"
    path.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        "targets:\n  - {name: r1, kind: vllm, url: 'http://127.0.0.1:9/metrics'}\n"
        "auth:\n"
        "  mode: none\n"
        "  api_tokens:\n"
        "    - {name: ci, token: '${CI_TOKEN}', role: operator}\n"
        "    - {name: dashboards, token: '${DASH_TOKEN}', role: viewer}\n"
    )
    return migrated(path)


@pytest.fixture
def api(config_file: Path) -> Iterator[tuple[str, Config, sessionmaker[Session]]]:
    config = load_config(config_file)
    sessions = open_store(config.database)
    server = serve_api(config, sessions, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.server_address[1]}", config, sessions
    server.shutdown()
    server.server_close()


def call(
    url: str, token: str | None, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any] | list[Any], dict[str, str]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read()), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def rows(sessions: sessionmaker[Session]) -> tuple[list[AnnotationRow], list[AuditRow]]:
    with sessions() as session:
        notes = list(session.scalars(select(AnnotationRow).order_by(AnnotationRow.id)))
        trail = list(session.scalars(select(AuditRow).order_by(AuditRow.id)))
    return notes, trail


def test_the_api_takes_an_operator_token_and_refuses_a_wrong_one_a_viewer_and_none(
    api: tuple[str, Config, sessionmaker[Session]], caplog: pytest.LogCaptureFixture
) -> None:
    base, _config, sessions = api
    caplog.set_level(logging.DEBUG)
    post = f"{base}/api/v1/annotations"

    status, answer, _ = call(post, OPERATOR, {"replica": "r1", "text": "prompt v42"})
    assert status == 201, answer
    notes, trail = rows(sessions)
    assert [(n.replica, n.text, n.author) for n in notes] == [("r1", "prompt v42", "api:ci")]
    assert isinstance(answer, dict) and answer["id"] == notes[0].id
    assert [(a.actor, a.role, a.via, a.action, a.outcome) for a in trail] == [
        ("api:ci", "operator", "api", "annotation.create", "done")
    ]

    wrong = OPERATOR[:-1] + ("0" if OPERATOR[-1] != "0" else "1")
    for token in (wrong, None):
        status, answer, headers = call(post, token, {"text": "not stored"})
        assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Bearer")
    assert len(rows(sessions)[0]) == 1  # nothing stored, nothing audited for no identity
    assert len(rows(sessions)[1]) == 1

    status, answer, _ = call(post, VIEWER, {"text": "a viewer may not"})
    assert status == 403 and "operator" in str(answer)
    notes, trail = rows(sessions)
    assert len(notes) == 1
    assert (trail[-1].actor, trail[-1].role, trail[-1].outcome) == (
        "api:dashboards",
        "viewer",
        "refused",
    )

    # A viewer reads the timeline; the annotation is on it.
    status, listed, _ = call(f"{base}/api/v1/timeline?since=1h&replica=r1", VIEWER)
    assert status == 200 and isinstance(listed, list)
    assert [(e["kind"], e["replica"]) for e in listed] == [("annotation", "r1")]
    assert "prompt v42" in listed[0]["detail"]
    assert call(f"{base}/api/v1/timeline", None)[0] == 401

    # Bad bodies are 400, and store nothing.
    assert call(post, OPERATOR, {"text": "   "})[0] == 400
    assert call(post, OPERATOR, {"text": "x", "at": "yesterday"})[0] == 400
    assert len(rows(sessions)[0]) == 1

    # The tokens are in no log line and nowhere in the database.
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "without a valid token" in logged  # the refusals were logged
    assert OPERATOR not in logged and VIEWER not in logged and wrong not in logged
    with sessions() as session:
        for table in ("annotations", "audit_log"):
            for row in session.execute(text(f"SELECT * FROM {table}")):
                assert OPERATOR not in str(row) and VIEWER not in str(row)


def test_annotate_on_the_command_line_is_audited_and_on_the_timeline(config_file: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(
        app, ["annotate", "--config", str(config_file), "--replica", "r1", "--text", "deploy 7"]
    )
    assert done.exit_code == 0, done.output
    fleet = runner.invoke(app, ["annotate", "--config", str(config_file), "--text", "all: v2"])
    assert fleet.exit_code == 0, fleet.output
    empty = runner.invoke(app, ["annotate", "--config", str(config_file), "--text", " "])
    assert empty.exit_code == 2

    sessions = open_store(load_config(config_file).database)
    notes, trail = rows(sessions)
    assert [(n.replica, n.text) for n in notes] == [("r1", "deploy 7"), (None, "all: v2")]
    assert all(a.action == "annotation.create" and a.via == "cli" for a in trail)
    assert [a.outcome for a in trail] == ["done", "done"]

    shown = runner.invoke(
        app, ["timeline", "--config", str(config_file), "--replica", "r1", "--json"]
    )
    assert shown.exit_code == 0, shown.output
    listed = json.loads(shown.output)
    shown_notes = {(e["kind"], e["replica"], e["detail"].split(" (by ")[0]) for e in listed}
    assert shown_notes == {("annotation", "r1", "deploy 7"), ("annotation", None, "all: v2")}


def test_a_short_api_token_or_two_of_one_name_are_refused(tmp_path: Path) -> None:
    for tokens in (
        "[{name: ci, token: short}]",
        f"[{{name: ci, token: {OPERATOR}}}, {{name: ci, token: {VIEWER}}}]",
    ):
        path = tmp_path / "kneepoint.yaml"
        path.write_text(f"auth:\n  mode: none\n  api_tokens: {tokens}\n")
        with pytest.raises(ConfigError):
            load_config(path)
