"""Load shedding counted as errors in the availability SLO, on a real vLLM 0.32 (CPU build):
the "limits" server (vllm_server.LIMITS_FLAGS: 2 running, at most 4 in flight) is collected
into a store of its own by kneepoint's collector before and after a burst that it partly
refuses with HTTP 503. Over the window between the two scrapes the availability SLO's
measurement (alerts.evaluate.measure) counts as refused exactly the increase of the
server's own admission_rejections counter (and the 503s the client saw), and its bad share
is the hand formula over the stored counters: the larger of the engine's (failed + refused)
÷ (finished + refused) and the API server's 5xx ÷ requests (where the server exposes
http_requests_total; none counted where it does not), no stall in between."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from alerts.evaluate import measure
from alerts.slo import Availability, bad_share
from collectors.collect import collect_once
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.models import ReplicaSampleRow
from tests.conftest import migrated
from tests.real.vllm_server import MAX_QUEUED_LIMITS, MAX_SEQS_LIMITS, Vllm

pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]

BURST = 3 * (MAX_SEQS_LIMITS + MAX_QUEUED_LIMITS)  # well past what may be in flight
FINISHED = ("stop", "length", "abort", "error", "repetition")


async def _burst(url: str) -> list[int]:
    async with httpx.AsyncClient(timeout=120) as client:
        bodies = [
            {"model": "tiny", "prompt": f"shed {n} the plan", "max_tokens": 16, "ignore_eos": True}
            for n in range(BURST)
        ]
        answers = await asyncio.gather(
            *(client.post(f"{url}/v1/completions", json=body) for body in bodies)
        )
    return [answer.status_code for answer in answers]


def test_refused_requests_are_the_availability_slos_errors(
    tiny_servers: dict[str, Vllm], tmp_path: Path
) -> None:
    server = tiny_servers["limits"]  # shared: only read and sent requests, never restarted
    path = tmp_path / "kneepoint.yaml"
    path.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        "scrape_interval: 1s\n"
        f"targets:\n  - {{name: limits, kind: vllm, url: '{server.url}/metrics'}}\n"
        "slos:\n  - {name: up, kind: availability, objective: 0.99}\n"
    )
    config = load_config(migrated(path))
    sessions = open_store(config.database)
    # One request first: the API server's counter (http_requests_total) has a series once it
    # has answered one, so both scrapes hold it where the build exposes it.
    warm = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": "tiny", "prompt": "warm the plan", "max_tokens": 16, "ignore_eos": True},
        timeout=120,
    )
    assert warm.status_code == 200, warm.text
    (before,) = collect_once(config, sessions)
    assert before.ok, before
    statuses = asyncio.run(_burst(server.url))
    assert set(statuses) <= {200, 503}, statuses
    assert 503 in statuses and 200 in statuses  # some refused, some served
    time.sleep(1.1)  # the second scrape a moment later, after every answer
    (after,) = collect_once(config, sessions)
    assert after.ok, after

    with sessions() as session:
        rows = session.scalars(select(ReplicaSampleRow).order_by(ReplicaSampleRow.ts)).all()
        assert len(rows) == 2
        first, last = rows

        def grew(column: str, exposed: bool = True) -> float:
            start, end = getattr(first, column), getattr(last, column)
            if not exposed and start is None and end is None:
                return 0.0  # not exposed: that layer counts nothing (alerts/slo.py)
            assert start is not None and end is not None, column
            return float(end - start)

        refused = grew("admission_rejections")
        finished = sum(grew(f"requests_finished_{reason}") for reason in FINISHED)
        failed = grew("requests_finished_error") + grew("requests_finished_abort")
        # The API server's counter, where this build exposes it (None in the store if not).
        http = grew("http_requests", exposed=False)
        http_5xx = grew("http_requests_5xx", exposed=False)
        counted = measure(session, config, first.ts, last.ts).availability

    assert refused == statuses.count(503)  # the server's counter is the client's 503s
    assert finished >= statuses.count(200)
    assert isinstance(counted, Availability)
    assert counted.refused == refused
    assert (counted.finished, counted.failed) == (finished, failed)
    assert (counted.http, counted.http_failed) == (http, http_5xx)
    assert counted.stalled == 0
    # The hand formula: the larger of the two layers' shares; no stalled time.
    engine = (failed + refused) / (finished + refused)
    server_share = http_5xx / http if http > 0 else 0.0
    (slo,) = config.slos
    share = bad_share(slo, counted)
    assert share == pytest.approx(max(engine, server_share), rel=1e-12)
    # Each refusal is a bad request: the share is at least the refused share of the offered.
    assert share >= refused / (finished + refused) > 0
