"""A real process killed with SIGKILL in the middle of a rollup (summaries, thinning, expiry,
committed slice by slice), then the rollup run again: the store ends exactly as one
uninterrupted rollup leaves it."""

from __future__ import annotations

import copy
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import event, text

from collectors.engines.vllm import parse_vllm
from kneepoint.config import Retention
from kneepoint.store.db import open_store
from kneepoint.store.rollup import rollup_in_slices
from kneepoint.store.writer import ensure_targets, record_replica_history
from tests.conftest import VLLM_032, read

NOW = 1_800_000_000.0
HOURS = 8
# Every tier at work on eight hours: raw thinned to minutes after an hour, minutes to hours
# after four, hours expired after six; summaries of every bucket.
RETENTION = {"raw": 3600.0, "minute": 4 * 3600.0, "hour": 6 * 3600.0}
# Roll up in a process that kills itself (SIGKILL, nothing flushed or cleaned up) right after
# its K-th write statement: inside a slice's transaction, deterministically, wherever K is.
ROLLUP = """
import os, signal, sys
from sqlalchemy import event
from kneepoint.config import Retention
from kneepoint.store.db import open_store
from kneepoint.store.rollup import rollup_in_slices
sessions = open_store(sys.argv[1])
writes, limit = [0], int(sys.argv[2])
@event.listens_for(sessions.kw["bind"], "after_cursor_execute")
def count(conn, cursor, statement, *args):
    if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
        writes[0] += 1
        if writes[0] == limit:
            os.kill(os.getpid(), signal.SIGKILL)
rollup_in_slices(sessions, float(sys.argv[3]), Retention(**eval(sys.argv[4])))
"""


def seed(path: Path) -> None:
    """Eight hours of 15-second scrapes of two replicas, counters climbing."""
    sessions = open_store(f"sqlite:///{path}")
    base = parse_vllm(read(VLLM_032))
    with sessions.begin() as session:
        ids = ensure_targets(session, [(n, "vllm", f"http://{n}/m") for n in ("a", "b")])
        for name, target_id in ids.items():
            history = []
            for step in range(HOURS * 3600 // 15):
                sample = copy.deepcopy(base)
                sample.counters["generation_tokens"] = step * 50.0 * (1 + (name == "b"))
                sample.gauges["kv_cache_usage"] = (step % 40) / 40
                history.append((NOW - HOURS * 3600 + step * 15, sample))
            record_replica_history(session, target_id, history)
    with sessions() as session:  # all in the main file, so a copy of it is the whole store
        session.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    sessions.kw["bind"].dispose()


def dump(path: Path) -> dict[str, list[tuple[object, ...]]]:
    sessions = open_store(f"sqlite:///{path}")
    with sessions() as session:
        return {
            table: [tuple(row) for row in session.execute(text(f"SELECT * FROM {table}"))]
            for table in ("replica_samples", "replica_rollups", "rollup_progress")
        }


def writes_of_a_whole_rollup(path: Path) -> int:
    sessions = open_store(f"sqlite:///{path}")
    writes = [0]

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        writes[0] += statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))

    event.listen(sessions.kw["bind"], "after_cursor_execute", count)
    rollup_in_slices(sessions, NOW, Retention(**RETENTION))
    return writes[0]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """The seeded store, the store after one calm rollup, and how many writes that took."""
    folder = tmp_path_factory.mktemp("rollup")
    seeded, calm = folder / "seeded.db", folder / "calm.db"
    seed(seeded)
    shutil.copy(seeded, calm)
    return seeded, calm, writes_of_a_whole_rollup(calm)


@pytest.mark.parametrize("share", [0.0, 0.3, 0.6, 0.95])
def test_a_rollup_killed_mid_way_finishes_as_if_never_interrupted(
    seeded: tuple[Path, Path, int], tmp_path: Path, share: float
) -> None:
    source, calm, writes = seeded
    assert writes > 20
    killed = tmp_path / "killed.db"
    shutil.copy(source, killed)
    url = f"sqlite:///{killed}"
    limit = max(1, int(writes * share))
    process = subprocess.run(
        [sys.executable, "-c", ROLLUP, url, str(limit), str(NOW), repr(RETENTION)], timeout=120
    )
    assert process.returncode == -signal.SIGKILL  # it died mid-rollup, at its write `limit`
    assert dump(killed) != dump(calm)  # the work was not finished
    with open_store(url)() as session:
        assert session.execute(text("PRAGMA integrity_check")).scalar() == "ok"
    rollup_in_slices(open_store(url), NOW, Retention(**RETENTION))
    assert dump(killed) == dump(calm)
