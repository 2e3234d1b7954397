"""What the collector's fixed work per round and per job run costs in statements.

A collection round reads the targets table once (it read it three times: the targets, their
newest samples, their engines) and every exporter's GPUs in one query (it was one query per
exporter: 100 at 500 targets); a job run's health is one UPDATE and a membership beat one
UPDATE (both were the ORM's SELECT and UPDATE). What they write is what they wrote:
tests/collectors/test_scrape_path.py, test_jobs.py and tests/faults/test_ha.py check the
rows; here a GPU whose identity changes, and one that appears, within a round.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, JobExecutionEvent
from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

import collectors.collect
from collectors.cluster import Cluster
from collectors.collect import store_fetched
from collectors.jobs import record_job_event
from collectors.scrape import Fetched
from kneepoint.config import Config, Target
from kneepoint.store.db import open_store
from kneepoint.store.models import CollectorRow, GpuRow, JobHealthRow
from tests.conftest import DCGM_L4, VLLM_032, read

T0 = 1_700_000_000.0


@contextmanager
def statements(sessions: sessionmaker[Session]) -> Iterator[list[str]]:
    """The SQL text of every statement the store runs within the block."""
    engine = sessions.kw["bind"]
    seen: list[str] = []

    def record(*args: object) -> None:
        seen.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def reading(seen: list[str], table: str) -> list[str]:
    """The SELECTs among `seen` whose FROM is `table`."""
    pattern = re.compile(rf"^\s*SELECT\b.*\bFROM {table}\b", re.S)
    return [sql for sql in seen if pattern.search(sql)]


def store(sessions: sessionmaker[Session], bodies: list[tuple[str, str, str]], n: int) -> None:
    fetched = [
        Fetched(Target(name=name, kind=kind, url=f"http://127.0.0.1:9/{name}"),
                T0 + 5 * n, 0.01, body, None)
        for name, kind, body in bodies
    ]  # fmt: skip
    outcomes = store_fetched(fetched, sessions)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]


def test_a_round_reads_the_targets_once_and_every_exporters_gpus_in_one_query(
    tmp_path: Path,
) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'k.db'}")
    vllm, dcgm = read(VLLM_032), read(DCGM_L4)
    bodies = [(f"r{n}", "vllm", vllm) for n in range(3)]
    bodies += [(f"node{n}", "dcgm", dcgm.replace("Hostname=\"", f'Hostname="n{n}-'))
               for n in range(4)]  # fmt: skip
    store(sessions, bodies, 0)  # targets and GPUs made
    with statements(sessions) as seen:
        store(sessions, bodies, 1)
    assert len(reading(seen, "targets")) == 1
    assert len(reading(seen, "gpus")) == 1  # four exporters
    with sessions() as session:  # every exporter's GPUs stored
        hosts = {host for (host,) in session.execute(select(GpuRow.host))}
    assert len(hosts) == 4
    sessions.kw["bind"].dispose()


def test_a_gpu_changed_or_added_within_a_round_is_stored_as_outside_one(tmp_path: Path) -> None:
    """Exporter a's GPU 0 gets a new UUID; exporter b appears: a's row is updated in place
    (same id), b's GPUs are added, and a second round with the same bodies changes nothing."""
    sessions = open_store(f"sqlite:///{tmp_path / 'k.db'}")
    dcgm = read(DCGM_L4)
    old_uuid = re.search(r'gpu="0",UUID="([^"]+)"', dcgm)
    assert old_uuid is not None
    store(sessions, [("a", "dcgm", dcgm)], 0)
    with sessions() as session:
        before = {(g.host, g.gpu_index): (g.id, g.uuid) for g in session.scalars(select(GpuRow))}
    changed = dcgm.replace(old_uuid.group(1), "GPU-new")
    other = dcgm.replace('Hostname="', 'Hostname="b-')
    bodies = [("a", "dcgm", changed), ("b", "dcgm", other)]
    store(sessions, bodies, 1)
    with sessions() as session:
        after = {(g.host, g.gpu_index): (g.id, g.uuid) for g in session.scalars(select(GpuRow))}
    (key,) = [k for k, (_, uuid) in before.items() if uuid == old_uuid.group(1)]
    assert after[key] == (before[key][0], "GPU-new")
    assert {k: v for k, v in after.items() if k != key and k in before} == {
        k: v for k, v in before.items() if k != key
    }
    added = set(after) - set(before)
    assert added and all(host.startswith("b-") for host, _ in added)
    store(sessions, bodies, 2)
    with sessions() as session:
        again = {(g.host, g.gpu_index): (g.id, g.uuid) for g in session.scalars(select(GpuRow))}
    assert again == after
    sessions.kw["bind"].dispose()


def test_a_job_runs_health_is_one_statement_and_counts_as_before(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'k.db'}")
    ok = JobExecutionEvent(EVENT_JOB_EXECUTED, "scrape", None, None, retval=None)
    failed = JobExecutionEvent(
        EVENT_JOB_ERROR, "scrape", None, None, exception=ValueError("broken")
    )
    record_job_event(sessions, ok, lambda: 10.0)  # the row made
    with statements(sessions) as seen:
        record_job_event(sessions, failed, lambda: 20.0)
        record_job_event(sessions, ok, lambda: 30.0)
    assert [sql.split()[0] for sql in seen] == ["UPDATE", "UPDATE"]
    record_job_event(sessions, failed, lambda: 40.0)
    with sessions() as session:
        row = session.get(JobHealthRow, "scrape")
        assert row is not None
        assert (row.runs, row.failures, row.last_run_at, row.last_success_at) == (4, 2, 40.0, 30.0)
        assert row.last_error is not None and "broken" in row.last_error
    sessions.kw["bind"].dispose()


def test_a_membership_beat_is_one_statement(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'k.db'}")
    now = [100.0]
    cluster = Cluster(Config(database=f"sqlite:///{tmp_path / 'k.db'}"), sessions, lambda: now[0])
    cluster.beat()  # registered
    now[0] = 105.0
    with statements(sessions) as seen:
        cluster._record()
    assert [sql.split()[0] for sql in seen] == ["UPDATE"]
    with sessions() as session:
        row = session.get(CollectorRow, cluster.id)
        assert row is not None
        assert (row.started_at, row.last_seen_at) == (100.0, 105.0)
    sessions.kw["bind"].dispose()


def test_a_layout_made_in_a_round_that_is_undone_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh store's first round: the vLLM target's histogram layouts are added in the
    round's savepoint, then the database refuses the exporter's rows and the savepoint is
    undone, layouts with it. The vLLM target, stored again in its own savepoint, must not
    point at the undone layouts: the ids the store caches are forgotten on any rollback
    (kneepoint/store/db.py); a guard for the round's batch, which now also keeps GPUs."""
    real = collectors.collect.record_gpus

    def refuse(session: Session, target_id: int, ts: float, gpus: list) -> None:  # type: ignore[type-arg]
        real(session, target_id, ts, gpus)
        raise ValueError("value out of range for column fb_used_mib")

    monkeypatch.setattr(collectors.collect, "record_gpus", refuse)
    database = tmp_path / "k.db"
    sessions = open_store(f"sqlite:///{database}")
    fetched = [
        Fetched(Target(name="r", kind="vllm", url="http://127.0.0.1:9/r"), T0, 0.01,
                read(VLLM_032), None),
        Fetched(Target(name="n", kind="dcgm", url="http://127.0.0.1:9/n"), T0, 0.01,
                read(DCGM_L4), None),
    ]  # fmt: skip
    outcomes = {o.target: o for o in store_fetched(fetched, sessions)}
    assert outcomes["r"].ok and not outcomes["n"].ok
    sessions.kw["bind"].dispose()
    with sqlite3.connect(database) as connection:
        layouts = dict(connection.execute("SELECT id, bounds FROM histogram_layouts"))
        columns = [c[1] for c in connection.execute("PRAGMA table_info(replica_samples)")]
        (row,) = connection.execute("SELECT * FROM replica_samples").fetchall()
    used = {int(v.split("|")[0]) for c, v in zip(columns, row, strict=True)
            if c.startswith("hist_") and v}  # fmt: skip
    assert used and used <= set(layouts)
