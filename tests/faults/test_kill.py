"""A real `kneepoint collect` process killed with SIGKILL in the middle of its work and
started again: what it had committed is all there, the database is sound, and it goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import func, select, text

from kneepoint.store.db import open_store
from kneepoint.store.models import GpuSampleRow, ReplicaSampleRow
from tests.conftest import DCGM_T4, VLLM_032, MetricsServer, Route

KNEEPOINT = [sys.executable, "-m", "kneepoint.cli"]


def poll(condition: Callable[[], bool], seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


@contextmanager
def collector(config: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        process = subprocess.Popen(
            [*KNEEPOINT, "collect", "--config", str(config)], stdout=out, stderr=out
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def test_killed_mid_scrape_it_loses_nothing_committed_and_resumes(
    metrics_server: MetricsServer, tmp_path: Path
) -> None:
    metrics_server.routes = {
        "/vllm": Route(VLLM_032.read_bytes()),
        "/gpus": Route(DCGM_T4.read_bytes()),
    }
    config = tmp_path / "kneepoint.yaml"
    database = tmp_path / "k.db"
    config.write_text(
        f"database: sqlite:///{database}\nscrape_interval: 1s\ntargets:\n"
        f"  - {{name: a, kind: vllm, url: '{metrics_server.url('/vllm')}', timeout: 30s}}\n"
        f"  - {{name: gpu-node, kind: dcgm, url: '{metrics_server.url('/gpus')}'}}\n"
    )
    sessions = open_store(f"sqlite:///{database}")

    def stored(model: type) -> int:
        with sessions() as session:
            return int(session.scalar(select(func.count()).select_from(model)) or 0)

    log = tmp_path / "collector.log"
    with collector(config, log) as first:
        assert poll(lambda: stored(ReplicaSampleRow) >= 3), log.read_text()[-2000:]
        # The vLLM target now holds every request open: the next round is mid-scrape (the
        # GPU node already answered) when the process dies.
        metrics_server.routes["/vllm"] = Route(VLLM_032.read_bytes(), delay=8)
        hits = metrics_server.hits["/vllm"]
        assert poll(lambda: metrics_server.hits["/vllm"] > hits)
        before = stored(ReplicaSampleRow), stored(GpuSampleRow)
        with sessions() as session:
            last = session.scalar(select(func.max(ReplicaSampleRow.ts)))
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    with sessions() as session:
        assert session.execute(text("PRAGMA integrity_check")).scalar() == "ok"
    assert (stored(ReplicaSampleRow), stored(GpuSampleRow)) == before  # all kept, none added
    metrics_server.routes["/vllm"] = Route(VLLM_032.read_bytes())
    with collector(config, log):
        assert poll(lambda: stored(ReplicaSampleRow) >= before[0] + 2), log.read_text()[-2000:]
    with sessions() as session:
        newer = session.scalar(
            select(func.count()).select_from(ReplicaSampleRow).where(ReplicaSampleRow.ts > last)
        )
    assert newer == stored(ReplicaSampleRow) - before[0]  # the restart's follow the old
    assert stored(GpuSampleRow) > before[1]
