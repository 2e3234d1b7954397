"""Prometheus mode after an outage: a Prometheus that refuses big queries (as a real one does
past `--query.max-samples`) still answers every round, because the catch-up is bounded by
`prometheus.lookback` and read in chunks of `prometheus.chunk`."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from collectors.prometheus_api import collect_from_prometheus
from kneepoint.config import Config, PrometheusSource, Target
from kneepoint.store.db import open_store
from kneepoint.store.models import ReplicaSampleRow
from tests.conftest import VLLM_032

INSTANCE = "10.0.0.1:8000"
LARGEST_RANGE = 900  # seconds: a bigger range selector "would load too many samples"
_RANGE = re.compile(r"^(?P<selector>.*)\[(?P<seconds>\d+)s\]$")


@dataclass
class FakePrometheus:
    """The query API of a Prometheus that scraped one vLLM every `every` seconds at
    `scrape_times`; it refuses range selectors longer than LARGEST_RANGE with the error a
    real one gives, and records every query."""

    scrape_times: list[float] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    refused: int = 0
    port: int = 0

    def answer(self, query: str, at: float) -> tuple[int, dict]:  # type: ignore[type-arg]
        self.queries.append(query)
        if query.startswith("up"):
            metric = {"__name__": "up", "instance": INSTANCE, "job": "vllm"}
            return 200, _vector([{"metric": metric, "value": [at, "1"]}])
        match = _RANGE.match(query)
        assert match, query
        seconds = int(match["seconds"])
        if seconds > LARGEST_RANGE:
            self.refused += 1
            return 422, {
                "status": "error",
                "errorType": "execution",
                "error": "query processing would load too many samples into memory in query "
                "execution",
            }
        names = re.compile(re.search(r'__name__=~"([^"]+)"', match["selector"])[1])  # type: ignore[index]
        times = [t for t in self.scrape_times if at - seconds < t <= at]
        series = []
        for family in text_string_to_metric_families(VLLM_032.read_text()):
            for sample in family.samples:
                if times and names.fullmatch(sample.name):
                    labels = {**sample.labels, "__name__": sample.name, "instance": INSTANCE}
                    series.append(
                        {"metric": labels, "values": [[t, repr(sample.value)] for t in times]}
                    )
        return 200, {"status": "success", "data": {"resultType": "matrix", "result": series}}


def _vector(result: list[dict]) -> dict:  # type: ignore[type-arg]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


@contextmanager
def serving(fake: FakePrometheus) -> Iterator[FakePrometheus]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, params: dict[str, list[str]]) -> None:
            status, body = fake.answer(params["query"][0], float(params["time"][0]))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._reply(parse_qs(urlsplit(self.path).query))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            self._reply(parse_qs(self.rfile.read(length).decode()))

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    fake.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def reading(fake: FakePrometheus, tmp_path: Path, lookback: str, chunk: str) -> Config:
    """One vLLM target, read through the fake Prometheus with this catch-up bound."""
    return Config(
        database=f"sqlite:///{tmp_path / 'k.db'}",
        targets=[Target(name="a", kind="vllm", url=f"http://{INSTANCE}/metrics")],
        prometheus=PrometheusSource(
            url=f"http://127.0.0.1:{fake.port}", lookback=lookback, chunk=chunk
        ),
    )


def test_a_three_hour_outage_is_read_back_in_chunks_within_the_lookback(tmp_path: Path) -> None:
    start = 1_800_000_000.0
    with serving(FakePrometheus()) as fake:
        config = reading(fake, tmp_path, lookback="1h", chunk="10m")
        sessions = open_store(config.database)
        fake.scrape_times = [start]
        (first,) = collect_from_prometheus(config, sessions, lambda: start + 1)
        assert first.ok
        # kneepoint is down for three hours while Prometheus goes on scraping every minute.
        now = start + 3 * 3600
        fake.scrape_times = [start + 60 * i for i in range(1, 181)]
        fake.queries.clear()
        outcomes = collect_from_prometheus(config, sessions, lambda: now)
        assert outcomes and all(o.ok for o in outcomes)
        assert fake.refused == 0
        ranges = [int(m[1]) for q in fake.queries if (m := re.search(r"\[(\d+)s\]$", q))]
        assert ranges and max(ranges) <= 600  # chunks, never the whole outage at once
        assert sum(ranges) == 3600  # exactly the lookback, nothing read twice
        with sessions() as session:
            stored = session.scalars(
                select(ReplicaSampleRow.ts).order_by(ReplicaSampleRow.ts)
            ).all()
        # The first scrape, then the last hour's 60 scrapes (one a minute, the first at
        # now - 59 min since the window is open on its left); the two hours before are a gap.
        assert stored[0] == start
        assert stored[1:] == [t for t in fake.scrape_times if t > now - 3600]
        assert len(stored) == 61
        # Caught up: the next round asks only for what is new.
        fake.queries.clear()
        fake.scrape_times.append(now + 60)
        assert all(o.ok for o in collect_from_prometheus(config, sessions, lambda: now + 61))
        ranges = [int(m[1]) for q in fake.queries if (m := re.search(r"\[(\d+)s\]$", q))]
        assert ranges == [61]


def test_the_same_outage_read_in_one_query_is_refused(tmp_path: Path) -> None:
    """The fault itself: without the bound, the catch-up query is the one Prometheus refuses
    (a lookback as long as the outage and one chunk reproduce the old behaviour)."""
    start = 1_800_000_000.0
    with serving(FakePrometheus()) as fake:
        config = reading(fake, tmp_path, lookback="4h", chunk="4h")
        sessions = open_store(config.database)
        fake.scrape_times = [start]
        collect_from_prometheus(config, sessions, lambda: start + 1)
        fake.scrape_times = [start + 60 * i for i in range(1, 181)]
        try:
            collect_from_prometheus(config, sessions, lambda: start + 3 * 3600)
        except Exception as error:
            assert "too many samples" in str(error)
        else:
            raise AssertionError("an unbounded catch-up was not refused")
        assert fake.refused == 1
