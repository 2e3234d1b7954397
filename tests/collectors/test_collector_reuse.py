"""Rounds of `kneepoint collect` reuse what the round before made: the connections to its
targets (HTTP keep-alive, collectors/scrape.py) and, once each job has run, the objects made
at start-up are frozen out of Python's collections (collectors/scheduler.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from collectors import scrape
from collectors.scrape import fetch_all
from kneepoint.config import Target
from tests.conftest import ROOT, VLLM_032


@contextmanager
def keep_alive_server(body: bytes) -> Iterator[tuple[str, list[int]]]:
    """An HTTP/1.1 server that keeps connections open; the client ports it was reached from."""
    ports: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            ports.append(self.client_address[1])
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", ports
    finally:
        server.shutdown()
        server.server_close()


def test_rounds_reuse_their_connections() -> None:
    """Three rounds of two targets on one server: two connections, not six; the bodies as
    sent."""
    body = VLLM_032.read_bytes()
    with keep_alive_server(body) as (url, ports):
        targets = [Target(name=f"t{n}", kind="vllm", url=url + f"?n={n}") for n in range(2)]
        for _ in range(3):
            fetched = fetch_all(targets)
            assert [f.body for f in fetched] == [body.decode()] * 2
    assert len(ports) == 6
    assert len(set(ports)) == 2


def test_a_round_while_another_runs_uses_connections_of_its_own() -> None:
    body = b"a 1\n"
    with keep_alive_server(body) as (url, ports):
        target = Target(name="t", kind="vllm", url=url)
        with scrape._CONNECTIONS.held() as share:  # type: ignore[attr-defined]
            assert share is not None
            assert [f.body for f in fetch_all([target])] == ["a 1\n"]
    assert len(ports) == 1


def test_kneepoint_collects_scheduler_freezes_its_start_up_objects_after_a_first_run() -> None:
    """In its own process (a freeze in the test process would outlive the test)."""
    script = textwrap.dedent(
        """
        import gc, threading
        from collectors.scheduler import StepSafeBlockingScheduler
        scheduler = StepSafeBlockingScheduler()
        counts = []
        def job():
            counts.append(gc.get_freeze_count())
            if len(counts) == 2:
                threading.Thread(target=scheduler.shutdown, kwargs={"wait": False}).start()
        scheduler.add_job(job, "interval", seconds=0.2, id="job")
        scheduler.start()
        print(counts[0], counts[1])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    assert before == 0
    assert after > 10_000  # the modules and what the first run made
