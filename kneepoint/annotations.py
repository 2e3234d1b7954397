"""Annotations: changes posted from outside (a deploy, a prompt version), shown on the
timeline; written by `kneepoint annotate` and by a small authenticated HTTP endpoint for CI
pipelines.

Where the endpoint lives: Streamlit serves no custom routes, so the app cannot take a POST.
The endpoint is a small HTTP server (the standard library's ThreadingHTTPServer, no new
dependency) started in a thread of `kneepoint serve`'s process, beside the app, when the
config has `auth.api_tokens`; without tokens there is no endpoint at all. It listens on
loopback by default (`--api-host`, `--api-port`, default 127.0.0.1:8502): a pipeline on
another machine reaches it through the same TLS reverse proxy as the app, since the bearer
token must not cross a network in clear text. Not the collector: the collector runs
several members under high availability and should have no inbound port; the app's
process already is the one people reach.

Authentication: `Authorization: Bearer <token>`, compared in constant time (SHA-256 of
each side, hmac.compare_digest, every configured token tried) against `auth.api_tokens`
(`{name, token: ${VAR}, role}`). The token is never logged, shown or stored: the audit trail
names the token (`api:<name>`), and the server's log lines carry the method, path, status
and peer only. No token or a wrong one: 401 (logged, not audited: an unauthenticated
caller could fill the trail). The role is checked where the annotation is written
(`annotate`, through kneepoint/audit.py's `mutation`: operator or admin), so the CLI and
the endpoint take the same path; a viewer token is refused with 403 and the refusal is in
the audit trail.

Routes:
- POST /api/v1/annotations  {"text": "prompt v42", "replica": "r1" (optional, none: the
  fleet), "at": Unix seconds or ISO 8601 (optional, default now)} → 201 {"id", "at"}.
- GET /api/v1/timeline?since=1h&replica=r1 → 200, the timeline's events as
  `kneepoint timeline --json` prints them (viewer).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sqlalchemy.orm import Session, sessionmaker

from kneepoint import audit
from kneepoint.auth import Identity, Refused, Role
from kneepoint.config import Config
from kneepoint.durations import parse_duration
from kneepoint.store.models import AnnotationRow

log = logging.getLogger(__name__)

MAX_TEXT = 500  # characters of an annotation
MAX_BODY = 64 * 1024  # bytes of a request body
FUTURE = 300.0  # an annotation may be dated at most this far ahead (clock skew)
DEFAULT_PORT = 8502
NEEDED: Role = "operator"


class Invalid(ValueError):
    """The annotation cannot be stored as given; the message says why."""


def annotate(
    begin: audit.Begin,
    who: Identity,
    text: str,
    replica: str | None,
    at: float | None,
    now: float,
) -> AnnotationRow:
    """Store an annotation if `who` holds the operator role (checked here, where it is
    written; a refusal is recorded and raised as Refused), with its audit entry."""
    text = text.strip()
    if not text:
        raise Invalid("the annotation needs a text")
    if len(text) > MAX_TEXT:
        raise Invalid(f"the text is {len(text)} characters; at most {MAX_TEXT}")
    if replica is not None and not (0 < len(replica) <= 200):
        raise Invalid("the replica name must be 1 to 200 characters")
    when = now if at is None else at
    if not when > 0 or when > now + FUTURE:
        raise Invalid("the time must be in the past (or within 5 minutes ahead)")
    subject = f"annotation on {replica or 'the fleet'}"
    with audit.mutation(begin, who, NEEDED, "annotation.create", subject, now) as (session, change):
        row = AnnotationRow(ts=when, replica=replica, text=text, author=who.name)
        session.add(row)
        session.flush()
        change.subject = f"annotation {row.id}"
        change.after = {"at": when, "replica": replica, "text": text}
    return row


def parse_time(value: Any) -> float | None:
    """Unix seconds or ISO 8601 with a time zone; None for none."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise Invalid(f"at: {value!r} is neither ISO 8601 nor Unix seconds") from None
        if parsed.tzinfo is None:
            raise Invalid(f"at: {value!r} needs a time zone (Z or +01:00)")
        return parsed.timestamp()
    raise Invalid("at: give Unix seconds or an ISO 8601 time")


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


def token_identity(config: Config, header: str | None, address: str | None) -> Identity | None:
    """The identity of a request's bearer token, or None (no token, or not one of
    auth.api_tokens). Every configured token is compared, in constant time."""
    tokens = config.auth.api_tokens if config.auth else []
    if not header or not header.startswith("Bearer "):
        return None
    given = _digest(header.removeprefix("Bearer ").strip())
    found = None
    for token in tokens:
        if hmac.compare_digest(given, _digest(token.token.reveal())):
            found = token
    if found is None:
        return None
    return Identity(f"api:{found.name}", found.role, "api", address=address)


Clock = Callable[[], float]


def make_handler(
    config: Config, sessions: sessionmaker[Session], clock: Clock
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "kneepoint"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:
            # The request line only (no header, so never the token).
            log.info("api %s %s", self.address_string(), format % args)

        def _send(self, status: int, body: Any, extra: dict[str, str] | None = None) -> None:
            content = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(content)))
            self.send_header("Cache-Control", "no-store")
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(content)

        def _who(self) -> Identity | None:
            who = token_identity(config, self.headers.get("Authorization"), self.client_address[0])
            if who is None:
                log.warning("api: %s %s without a valid token", self.client_address[0], self.path)
                self._send(
                    401,
                    {"error": "a valid bearer token is required (auth.api_tokens)"},
                    {"WWW-Authenticate": 'Bearer realm="kneepoint"'},
                )
            return who

        def do_POST(self) -> None:
            if urlsplit(self.path).path != "/api/v1/annotations":
                self._send(404, {"error": "not found"})
                return
            who = self._who()
            if who is None:
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0:
                self._send(400, {"error": "Content-Length must be a number of bytes"})
                return
            if length > MAX_BODY:
                self._send(413, {"error": f"the body is over {MAX_BODY} bytes"})
                return
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict) or not isinstance(body.get("text"), str):
                    raise Invalid('the body must be a JSON object with a "text"')
                replica = body.get("replica")
                if replica is not None and not isinstance(replica, str):
                    raise Invalid("replica must be a string")
                row = annotate(
                    sessions.begin,
                    who,
                    body["text"],
                    replica or None,
                    parse_time(body.get("at")),
                    clock(),
                )
            except Refused as refused:
                self._send(403, {"error": str(refused)})
                return
            except (Invalid, json.JSONDecodeError, UnicodeDecodeError) as error:
                self._send(400, {"error": str(error)})
                return
            self._send(201, {"id": row.id, "at": row.ts})

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path != "/api/v1/timeline":
                self._send(404, {"error": "not found"})
                return
            who = self._who()
            if who is None:
                return
            query = parse_qs(url.query)
            try:
                since = parse_duration(query.get("since", ["1h"])[0])
            except ValueError as error:
                self._send(400, {"error": f"since: {error}"})
                return
            # Deferred: the timeline brings pandas and the status, which `kneepoint
            # annotate` (this module's other user) never needs.
            from kneepoint.timeline import events

            now = clock()
            with sessions() as session:
                found = events(session, config, now - since, now, query.get("replica", [None])[0])
            self._send(200, [event.as_dict() for event in found])

    return Handler


def serve_api(
    config: Config,
    sessions: sessionmaker[Session],
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    clock: Clock | None = None,
) -> ThreadingHTTPServer:
    """Start the endpoint in a daemon thread; the caller shuts it down (`.shutdown()`)."""
    server = ThreadingHTTPServer((host, port), make_handler(config, sessions, clock or time.time))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="kneepoint-api", daemon=True)
    thread.start()
    return server
