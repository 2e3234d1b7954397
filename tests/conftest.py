"""Shared test helpers: real captures, a real local HTTP server, a seeded store."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_FIXTURES = ROOT.parent / "shared" / "fixtures"
OWN_FIXTURES = ROOT / "tests" / "fixtures"
VLLM_032 = SHARED_FIXTURES / "vllm-0.32.0-cpu-prefix-caching.prom"
DCGM_L4 = SHARED_FIXTURES / "dcgm_exporter_gpu_operator_L4_idle.prom"
DCGM_T4 = SHARED_FIXTURES / "dcgm_exporter_gpu_operator_T4_loaded_nohelp.prom"


def pytest_configure(config: pytest.Config) -> None:
    """One PostgreSQL cluster for the whole session (tests/postgres.py says why)."""
    import tests.postgres

    tests.postgres.SHARE = True


def pytest_unconfigure(config: pytest.Config) -> None:
    import tests.postgres

    tests.postgres.stop_shared()


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    """Each test starts with no remembered secrets: `scrub` masks every secret loaded in the
    process, so one test's config (a password "kneepoint", say) would mask another's text."""
    from kneepoint.secrets import forget_all

    forget_all()
    yield


def require_real(reason: str) -> None:
    """Skip on a developer machine without the system; fail in CI (KNEEPOINT_REQUIRE_REAL=1)."""
    if os.environ.get("KNEEPOINT_REQUIRE_REAL") == "1":
        pytest.fail(f"required real system missing: {reason}")
    pytest.skip(reason)


def migrated(config: Path) -> Path:
    """Create `config`'s database at the newest schema with `kneepoint migrate`, as a user
    does before the first collect (no other command migrates)."""
    from typer.testing import CliRunner

    from kneepoint.cli import app

    result = CliRunner().invoke(app, ["migrate", "--config", str(config)])
    assert result.exit_code == 0, result.output
    return config


@dataclass
class Route:
    """What the test server answers on one path."""

    body: bytes | Callable[[], bytes] = b""
    status: int = 200
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    delay: float = 0.0
    declared_length: int | None = None  # a Content-Length larger than the body: truncation


@dataclass
class MetricsServer:
    """A real HTTP server on loopback whose routes tests set; it counts requests per path."""

    routes: dict[str, Route] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)  # last request's, by path
    port: int = 0
    in_flight: int = 0  # requests being answered now
    most_in_flight: int = 0  # the most ever answered at once: the server's view of concurrency
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def metrics_server() -> Iterator[MetricsServer]:
    with serving_metrics() as server:
        yield server


@contextmanager
def serving_metrics() -> Iterator[MetricsServer]:
    """Run a MetricsServer on a free loopback port for the duration of the block."""
    state = MetricsServer()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with state.lock:
                state.hits[self.path] = state.hits.get(self.path, 0) + 1
                state.in_flight += 1
                state.most_in_flight = max(state.most_in_flight, state.in_flight)
            state.headers[self.path] = dict(self.headers.items())
            try:
                self._answer()
            finally:
                with state.lock:
                    state.in_flight -= 1

        def _answer(self) -> None:
            route = state.routes.get(self.path)
            if route is None:
                self.send_error(404)
                return
            if route.delay:
                time.sleep(route.delay)
            body = route.body() if callable(route.body) else route.body
            try:
                self.send_response(route.status)
                self.send_header("Content-Type", route.content_type)
                self.send_header("Content-Length", str(route.declared_length or len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test): nothing left to do

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@contextmanager
def loopback(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """A threaded HTTP server on 127.0.0.1 with `handler`, on a free port (yielded); shut
    down afterwards."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_healthy(
    process: subprocess.Popen[Any], url: str, seconds: float, logs: Callable[[], str]
) -> None:
    """Wait for `url` to answer 200 while `process` runs; fail with its logs otherwise."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{process.args} exited with {process.returncode}: {logs()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    process.kill()
    pytest.fail(f"{url} did not answer within {seconds:g}s: {logs()[-3000:]}")
