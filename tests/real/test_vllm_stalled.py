"""`engine-stalled` on a real vLLM 0.32 (CPU build): its engine-core process is stopped
(SIGSTOP) while requests stream, the API server keeps answering /metrics, and kneepoint's
collector and alert evaluation see the stall; SIGCONT and the alert resolves and every
request completes.

The engine core is found as vLLM V1 names it: the API server (the process started with our
`--port`) spawns a child whose process title vLLM sets to `VLLM::EngineCore` (setproctitle,
vllm/v1/engine/core.py); it is read from /proc/<pid>/cmdline, parents from /proc/<pid>/stat.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from alerts.evaluate import evaluate_once
from alerts.values import values
from collectors.collect import Outcome, collect_once
from kneepoint.config import load_config
from kneepoint.status import build_status
from kneepoint.store.db import open_store
from kneepoint.store.models import AlertHistoryRow, ReplicaSampleRow
from kneepoint.views import build_view
from tests.conftest import migrated
from tests.real.vllm_server import Vllm

pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]

NAME = "vllm-stalled"
RULE = "engine-stalled"
STALL_FOR = 3  # seconds: the rule's `for`, overridden short for the test
STREAMS = 8  # concurrent streams, with --max-num-seqs 2: some run, some wait
DEADLINE = 120.0  # seconds any phase may take before the test fails


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line with spaces) of every process we can read."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])  # "pid (comm) state ppid ..."
        found[int(entry)] = (parent, cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def engine_core_pid(port: int) -> int:
    """The engine-core process of the vLLM API server listening on `port`."""
    processes = _processes()
    servers = [
        pid
        for pid, (_, cmd) in processes.items()
        if "vllm.entrypoints.openai.api_server" in cmd and f"--port {port} " in f"{cmd} "
    ]
    assert len(servers) == 1, f"API servers on port {port}: {servers}"

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = processes.get(pid, (0, ""))[0]
            if pid == servers[0]:
                return True
        return False

    cores = [
        pid
        for pid, (_, cmd) in processes.items()
        if cmd.startswith("VLLM::EngineCore") and descends(pid)
    ]
    assert len(cores) == 1, f"engine cores under {servers[0]}: {cores}"
    return cores[0]


def state(pid: int) -> str:
    """The process's state letter (T: stopped by a signal)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def generated(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:generation_tokens_total{")
    )


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {DEADLINE:.0f} s"
        time.sleep(0.05)


def test_a_stopped_engine_core_pages_while_the_api_server_answers(
    tiny_servers: dict[str, Vllm], tmp_path: Path
) -> None:
    server = tiny_servers["two_seqs"]  # --max-num-seqs 2, used by this test only
    port = int(server.url.rsplit(":", 1)[1])
    path = tmp_path / "kneepoint.yaml"
    path.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        "scrape_interval: 1s\n"
        f"targets:\n  - {{name: {NAME}, kind: vllm, url: '{server.url}/metrics', "
        "timeout: 5s}\n"
        "rules:\n"
        f"  - {{name: {RULE}, metric: engine_stalled, op: '==', threshold: 1, "
        f"for: {STALL_FOR}s, severity: page}}\n"
    )
    config = load_config(migrated(path))
    sessions = open_store(config.database)

    def round_() -> Outcome:
        (outcome,) = collect_once(config, sessions)
        with sessions.begin() as session:
            evaluate_once(session, config, time.time())
        return outcome

    def watched() -> tuple[float | None, dict[str, Any]]:
        now = time.time()
        with sessions() as session:
            view = build_view(session, config, now, 300.0)
            value = values(view, build_status(session, config, now, 3600.0))[NAME]
            (replica,) = build_status(session, config, now, 300.0)["replicas"]
        return value["engine_stalled"], replica

    def history() -> list[tuple[str | None, str]]:
        with sessions() as session:
            rows = session.scalars(
                select(AlertHistoryRow)
                .where(AlertHistoryRow.rule == RULE)
                .order_by(AlertHistoryRow.id)
            )
            return [(row.before, row.after) for row in rows]

    def rounds_until(done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not done():
            assert time.monotonic() < deadline, f"{what} not within {DEADLINE:.0f} s"
            assert round_().ok
            time.sleep(config.scrape_interval)  # the collector's own cadence

    # Streams with long outputs, more than max_num_seqs: requests run and wait.
    finished: list[int] = []

    def stream(number: int) -> None:
        with (
            httpx.Client(timeout=600) as client,
            client.stream(
                "POST",
                f"{server.url}/v1/completions",
                json={
                    "model": "tiny",
                    "prompt": f"agent {number}: plan the file search",
                    "max_tokens": 900,
                    "ignore_eos": True,
                    "stream": True,
                },
            ) as response,
        ):
            assert response.status_code == 200
            chunks = sum(1 for line in response.iter_lines() if line.startswith("data: {"))
            finished.append(chunks)

    threads = [threading.Thread(target=stream, args=(n,)) for n in range(STREAMS)]
    for thread in threads:
        thread.start()

    def stored_steps(since: float) -> list[float | None]:
        """The engine step counter (iteration_tokens_total's count) as stored since."""
        samples = ReplicaSampleRow.__table__
        with sessions() as session:
            return list(
                session.scalars(
                    select(samples.c.engine_steps)
                    .where(samples.c.ts >= since)
                    .order_by(samples.c.ts)
                )
            )

    # Working: the tokens move between rounds, so nothing is stalled.
    working = time.time()
    for _ in range(2):
        before = generated(server.url)
        wait_for(lambda: generated(server.url) > before, "tokens counted")  # noqa: B023
        assert round_().ok
    value, replica = watched()
    assert value == 0.0 and replica["stalled"] is False
    assert (replica["requests_running"] or 0) > 0 and (replica["requests_waiting"] or 0) > 0
    steps = stored_steps(working)
    assert None not in steps and len(steps) >= 2 and steps[-1] > steps[0]  # type: ignore[operator]

    core = engine_core_pid(port)
    with stopped(core):
        wait_for(lambda: state(core) == "T", "the engine core stopped")
        halted = time.time()
        # The API server answers /metrics with the engine core stopped: the stall is
        # seen as frozen counters with requests queued, not as failed scrapes.
        frozen = generated(server.url)
        rounds_until(lambda: history()[-1:] == [("pending", "firing")], "firing")
        assert history() == [(None, "pending"), ("pending", "firing")]
        assert generated(server.url) == frozen
        # The engine's step counter, stored at every round since, stands still too.
        standing = stored_steps(halted)
        assert len(standing) >= 2 and None not in standing and len(set(standing)) == 1
        value, replica = watched()
        assert value == 1.0
        assert replica["stalled"] is True and replica["stalled_since"] is not None
        assert (replica["requests_running"] or 0) > 0

    # Resumed: tokens move again, the alert resolves, every request completes.
    rounds_until(lambda: history()[-1:] == [("firing", "resolved")], "resolved")
    value, replica = watched()
    assert value == 0.0 and replica["stalled"] is False
    for thread in threads:
        thread.join(timeout=DEADLINE)
    assert len(finished) == STREAMS and min(finished) > 0
