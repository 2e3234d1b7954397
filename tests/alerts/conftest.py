"""A real chat-platform stand-in on loopback: it records every POST and answers as scripted."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class Received:
    path: str  # with its query string
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    port: int = 0
    received: list[Received] = field(default_factory=list)
    # path (without query) -> answers to give in order, then 200 {"code": 0} for ever
    script: dict[str, list[tuple[int, dict[str, str], bytes]]] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.received.append(Received(self.path, dict(self.headers.items()), body))
            answers = state.script.get(self.path.split("?")[0], [])
            status, headers, reply = answers.pop(0) if answers else (200, {}, b'{"code": 0}')
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state
    server.shutdown()
    server.server_close()
