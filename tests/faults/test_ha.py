"""High availability on a real PostgreSQL with real `kneepoint collect` processes: two, then
three collectors split a twin fleet (each target scraped by exactly one of them, the one
the rendezvous hash over the live members names), one leads; the leader is killed with
SIGKILL, another takes over within two evaluation intervals, and a loopback webhook
receives each firing alert once (collectors/cluster.py).

Who scraped what is counted on the fleet's side: the twin's expositions are served through
a counting server, and each collector's config (otherwise the same) sends its own
`X-Collector` header with every scrape."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from collectors.cluster import Member, membership, owner
from kneepoint.cli import app
from kneepoint.store.db import connect_store
from kneepoint.store.models import JobHealthRow, NotificationRow
from kneepoint.twin.fleet import Fleet, FleetSpec
from tests.conftest import MetricsServer, loopback, migrated
from tests.postgres import running_postgres

pytestmark = [pytest.mark.real, pytest.mark.timeout(240)]
KNEEPOINT = [sys.executable, "-m", "kneepoint.cli"]
SCRAPE = 1.0  # seconds
EVALUATION = 3.0  # seconds: the takeover bound is two of these
# Long enough that a beat delayed on a loaded machine does not count a live member gone: a
# killed one is seen gone by its lock, a stopped one by its deleted row, not by the lease.
LEASE = 9.0
BOUND = 45.0  # seconds any awaited change may take before the test fails naming it
REPLICAS = [f"r{i}" for i in range(9)]
SPEC = {
    "nodes": [{"name": "gpu-node", "gpus": ["l4"] * len(REPLICAS)}],
    "replicas": [
        {"name": name, "model": "qwen3-4b", "node": "gpu-node", "gpu_index": index}
        for index, name in enumerate(REPLICAS)
    ],
}
TARGETS = [*REPLICAS, "gpu-node"]


@pytest.fixture(scope="module")
def postgres() -> Iterator[Callable[[], str]]:
    with running_postgres() as fresh:
        yield fresh


@dataclass
class Counting:
    """The twin's /metrics, per target, behind a server that logs (target, collector)."""

    fleet: Fleet
    hits: list[tuple[str, str]] = field(default_factory=list)
    down: set[str] = field(default_factory=set)  # answered 500
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0

    def since(self, mark: int) -> list[tuple[str, str]]:
        with self.lock:
            return list(self.hits[mark:])

    def mark(self) -> int:
        with self.lock:
            return len(self.hits)


@contextmanager
def counting(fleet: Fleet) -> Iterator[Counting]:
    state = Counting(fleet)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            name = self.path.strip("/")
            with state.lock:
                state.hits.append((name, self.headers.get("X-Collector", "?")))
            if name in state.down:
                body, status = b"down", 500
            elif name in fleet.replicas:
                body, status = fleet.replicas[name].metrics(), 200
            else:
                body, status = fleet.nodes[name].render(), 200
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with loopback(Handler) as port:
        state.port = port
        yield state


@dataclass
class Receiver:
    """A loopback webhook receiver: every firing alert it was sent, by fingerprint."""

    firing: list[tuple[str, str]] = field(default_factory=list)  # (fingerprint, replica)
    port: int = 0


@contextmanager
def receiving() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            for alert in body.get("alerts", []):
                if alert["status"] == "firing":
                    state.firing.append((alert["fingerprint"], alert["labels"]["replica"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with loopback(Handler) as port:
        state.port = port
        yield state


def until(
    what: str, check: Callable[[], object], explain: Callable[[], str] = lambda: ""
) -> object:
    """Poll `check` until it is true (and return it); fail naming `what` after BOUND."""
    deadline = time.monotonic() + BOUND
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"not within {BOUND:.0f} s: {what}\n{explain()}"
        time.sleep(0.1)


def write_config(path: Path, url: str, twin: int, hook: int, collector: str) -> Path:
    targets = "".join(
        f"  - {{name: {name}, kind: {'dcgm' if name == 'gpu-node' else 'vllm'}, "
        f"url: 'http://127.0.0.1:{twin}/{name}', headers: {{X-Collector: {collector}}}}}\n"
        for name in TARGETS
    )
    path.write_text(
        f"database: '{url}'\n"
        f"scrape_interval: {SCRAPE:g}s\nevaluation_interval: {EVALUATION:g}s\n"
        f"collector: {{lease: {LEASE:g}s}}\n"
        f"channels: [{{name: hook, type: webhook, url: 'http://127.0.0.1:{hook}/hook'}}]\n"
        "rules: [{name: target-down, metric: up, op: '==', threshold: 0, for: 0s,"
        " severity: page, channels: [hook]}]\n"
        f"targets:\n{targets}"
    )
    return path


def test_collectors_split_the_targets_and_a_killed_leader_is_replaced(
    tmp_path: Path, postgres: Callable[[], str]
) -> None:
    fleet = Fleet(FleetSpec.model_validate(SPEC)).start()
    processes: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}

    def start(name: str, config: Path) -> None:
        logs[name] = tmp_path / f"{name}.log"
        with logs[name].open("ab") as out:
            processes[name] = subprocess.Popen(
                [*KNEEPOINT, "collect", "--config", str(config)], stdout=out, stderr=out
            )

    def tails() -> str:
        return "\n".join(f"--- {n}\n{p.read_text()[-1500:]}" for n, p in logs.items())

    try:
        with counting(fleet) as twin, receiving() as hook:
            url = postgres()
            configs = {
                name: write_config(tmp_path / f"{name}.yaml", url, twin.port, hook.port, name)
                for name in ("c1", "c2", "c3")
            }
            migrated(configs["c1"])
            sessions = connect_store(url)

            def members() -> list[Member]:
                with sessions() as session:
                    return membership(session, LEASE, time.time())

            def by_process() -> dict[str, Member]:
                """Live members by the test's name of their process."""
                pids = {p.pid: n for n, p in processes.items()}
                return {pids[m.pid]: m for m in members() if m.live and m.pid in pids}

            def live(*names: str) -> dict[str, Member] | None:
                found = by_process()
                leaders = [m for m in found.values() if m.leader]
                return found if set(found) == set(names) and len(leaders) == 1 else None

            def check_split(*names: str) -> dict[str, str]:
                """Each target scraped only by its owner among `names`, several rounds."""
                found = until(f"{names} live with one leader", lambda: live(*names), tails)
                assert isinstance(found, dict)
                ids = {m.id: n for n, m in found.items()}
                want = {t: ids[owner(t, list(ids))] for t in TARGETS}

                def settled() -> bool:
                    """Every member's row says it holds its share (so its rounds from now on
                    use this membership: a collector's rounds never overlap), and each
                    owner has scraped its targets."""
                    held = {n: m.targets for n, m in by_process().items()}
                    if held != {n: list(want.values()).count(n) for n in names}:
                        return False
                    last = {t: c for t, c in twin.since(max(0, twin.mark() - 60))}
                    return all(last.get(t) == want[t] for t in TARGETS)

                until("the owners scraping their targets", settled, tails)
                mark = twin.mark()
                until(
                    "three rounds of every target",
                    lambda: all(
                        sum(t == target for t, _ in twin.since(mark)) >= 3 for target in TARGETS
                    ),
                )
                seen: dict[str, set[str]] = {}
                for target, collector in twin.since(mark):
                    seen.setdefault(target, set()).add(collector)
                assert seen == {t: {want[t]} for t in TARGETS}, f"{seen} {want}\n{tails()}"
                return want

            start("c1", configs["c1"])
            start("c2", configs["c2"])
            two = check_split("c1", "c2")
            assert set(two.values()) <= {"c1", "c2"}
            start("c3", configs["c3"])
            three = check_split("c1", "c2", "c3")
            # Rendezvous hashing moved only targets to the newcomer.
            assert all(three[t] in (two[t], "c3") for t in TARGETS)
            # A target goes down: the leader notifies once.
            twin.down.add("r0")
            until("r0's alert delivered", lambda: any(r == "r0" for _, r in hook.firing), tails)

            def all_settled() -> bool:
                with sessions() as session:
                    states = session.scalars(select(NotificationRow.state)).all()
                return bool(states) and all(s != "pending" for s in states)

            until("the outbox settled", all_settled)

            # The leader is killed.
            leader = next(n for n, m in by_process().items() if m.leader)
            killed_at = time.time()
            os.kill(processes[leader].pid, signal.SIGKILL)
            processes[leader].wait(10)
            others = tuple(n for n in ("c1", "c2", "c3") if n != leader)

            def evaluated_since_kill() -> float | None:
                with sessions() as session:
                    row = session.get(JobHealthRow, "alerts")
                    return row.last_success_at if row and row.last_success_at else None

            first = until(
                "an evaluation after the kill",
                lambda: (evaluated_since_kill() or 0) > killed_at and evaluated_since_kill(),
            )
            assert isinstance(first, float)
            takeover = first - killed_at
            print(f"\ntakeover: first evaluation {takeover:.2f} s after SIGKILL of the leader")
            assert takeover <= 2 * EVALUATION, tails()
            check_split(*others)  # the dead one's targets went to the others
            gone = [m for m in members() if m.pid == processes[leader].pid]
            assert gone and not gone[0].live and not gone[0].leader

            # A second target goes down after the takeover: the new leader notifies once.
            twin.down.add("r1")
            until("r1's alert delivered", lambda: any(r == "r1" for _, r in hook.firing), tails)
            until("the outbox settled again", all_settled)
            with sessions() as session:
                resends = sum(r or 0 for r in session.scalars(select(NotificationRow.resends)))
            for replica in ("r0", "r1"):
                sent = [f for f, r in hook.firing if r == replica]
                assert 1 <= len(sent) <= 1 + resends, (replica, hook.firing)
            assert {r for _, r in hook.firing} == {"r0", "r1"}

            # `kneepoint health --json` shows the members and the leader.
            shown = CliRunner().invoke(app, ["health", "--config", str(configs["c1"]), "--json"])
            report = json.loads(shown.stdout)
            rows = {r["pid"]: r for r in report["collectors"]}
            now_leading = next(m for m in by_process().values() if m.leader)
            assert report["leader"] == now_leading.id
            assert not rows[processes[leader].pid]["live"]
            assert all(rows[processes[n].pid]["live"] for n in others)

            # A clean stop (SIGTERM) leaves the membership: the last one holds every target.
            stopping, staying = others
            processes[stopping].terminate()
            assert processes[stopping].wait(20) == 0, tails()
            assert all(m.pid != processes[stopping].pid for m in members())
            until(
                f"{staying} alone, holding every target",
                lambda: (
                    [(n, m.targets) for n, m in by_process().items()] == [(staying, len(TARGETS))]
                ),
                tails,
            )
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
        fleet.stop()


def test_rendezvous_moves_only_the_targets_of_the_member_that_joins_or_leaves() -> None:
    targets = [f"replica-{i}" for i in range(300)]
    members = ["host-a:1:aa", "host-b:2:bb", "host-c:3:cc"]
    before = {t: owner(t, members) for t in targets}
    joined = {t: owner(t, [*members, "host-d:4:dd"]) for t in targets}
    left = {t: owner(t, members[:2]) for t in targets}
    assert {joined[t] for t in targets if joined[t] != before[t]} == {"host-d:4:dd"}
    assert {before[t] for t in targets if left[t] != before[t]} == {"host-c:3:cc"}
    # Each member holds a share: no member takes none of 300 (a bad hash would).
    assert all(list(before.values()).count(m) > 50 for m in members)


def test_a_follower_skips_leader_jobs_without_a_trace_in_job_health(
    tmp_path: Path, postgres: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In one process, two Cluster members of one PostgreSQL database: one leads; the
    follower's leader-only job returns NOT_LEADER and job_health records nothing for it;
    the Collector health page shows both and the leader; when the leader leaves, the
    follower leads at its next try."""
    from apscheduler.events import EVENT_JOB_EXECUTED, JobExecutionEvent
    from streamlit.testing.v1 import AppTest

    import alerts.evaluate  # noqa: F401  AppTest puts app/screens (with alerts.py) first
    from collectors.cluster import NOT_LEADER, Cluster
    from collectors.schedule import record_job_event, standard_jobs
    from kneepoint.config import load_config

    config_file = tmp_path / "k.yaml"
    config_file.write_text(f"database: '{postgres()}'\ncollector: {{lease: 30s}}\n")
    config = load_config(migrated(config_file))
    sessions = connect_store(config.database)
    first, second = Cluster(config, sessions, time.time), Cluster(config, sessions, time.time)
    try:
        first.beat()
        second.beat()
        assert first.is_leader() and not second.is_leader()
        jobs = standard_jobs(config, sessions, time.time, second)
        evaluation = next(j for j in jobs if j.id == "alerts")
        result = evaluation.func()
        assert result is NOT_LEADER
        event = JobExecutionEvent(EVENT_JOB_EXECUTED, "alerts", None, None, retval=result)
        record_job_event(sessions, event, time.time)
        with sessions() as session:
            assert session.get(JobHealthRow, "alerts") is None
            found = {m.id: m for m in membership(session, config.collector.lease, time.time())}
        assert found[first.id].leader and found[first.id].live
        assert not found[second.id].leader and found[second.id].live
        monkeypatch.setenv("KNEEPOINT_CONFIG", str(config_file))
        root = Path(__file__).resolve().parents[2]
        page = AppTest.from_file(str(root / "app/screens/health.py"), default_timeout=60).run()
        assert not page.exception, [e.value for e in page.exception]
        # The Collectors table for people (app/tables.py): "Collector", "Leader" in yes/no.
        table = next(f.value for f in page.dataframe if "Leader" in f.value.columns)
        assert dict(zip(table["Collector"], table["Leader"], strict=True)) == {
            first.id: "yes",
            second.id: "no",
        }
        assert any(first.id in caption.value for caption in page.caption)
        first.leave()
        assert second.is_leader()
        with sessions() as session:
            found = {m.id: m for m in membership(session, config.collector.lease, time.time())}
        assert list(found) == [second.id] and found[second.id].leader
    finally:
        first.leave()
        second.leave()


def test_on_sqlite_one_collector_scrapes_everything_and_is_shown_without_a_leader(
    tmp_path: Path, metrics_server: MetricsServer
) -> None:
    from collectors.cluster import Cluster
    from collectors.schedule import scrape_job
    from kneepoint.config import load_config
    from tests.conftest import VLLM_032, Route

    metrics_server.routes = {f"/{n}": Route(VLLM_032.read_bytes()) for n in ("a", "b", "c")}
    config_file = tmp_path / "k.yaml"
    config_file.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\ntargets:\n"
        + "".join(
            f"  - {{name: {n}, kind: vllm, url: '{metrics_server.url(f'/{n}')}'}}\n"
            for n in ("a", "b", "c")
        )
    )
    config = load_config(migrated(config_file))
    sessions = connect_store(config.database)
    cluster = Cluster(config, sessions, time.time)
    assert cluster.is_leader()  # no election: every collector runs every job
    scrape_job(config, sessions, time.time, cluster)
    cluster.beat()
    assert metrics_server.hits == {"/a": 1, "/b": 1, "/c": 1}
    result = CliRunner().invoke(app, ["health", "--json", "--config", str(config_file)])
    report = json.loads(result.output)
    assert report["leader"] is None
    (shown,) = report["collectors"]
    assert shown["id"] == cluster.id and shown["live"] and shown["targets"] == 3
    cluster.leave()
    result = CliRunner().invoke(app, ["health", "--json", "--config", str(config_file)])
    assert json.loads(result.output)["collectors"] == []


def test_in_prometheus_mode_each_collector_reads_and_stores_its_share(
    tmp_path: Path, postgres: Callable[[], str]
) -> None:
    """Two members of one PostgreSQL database reading a real Prometheus that scrapes the
    twin: each round stores only the member's own targets, and the two cover them all."""
    import httpx

    from collectors.cluster import Cluster
    from collectors.schedule import collect_round
    from kneepoint.config import Config, PrometheusSource
    from kneepoint.secrets import SecretURL
    from kneepoint.store.models import TargetRow
    from tests.real.prometheus_server import running_prometheus

    fleet = Fleet(FleetSpec.model_validate(SPEC)).start()
    try:
        targets = fleet.targets()
        jobs = {
            kind: [
                t.url.reveal().removeprefix("http://").removesuffix("/metrics")
                for t in targets
                if t.kind == kind
            ]
            for kind in ("vllm", "dcgm")
        }
        with running_prometheus(tmp_path / "prometheus", jobs, "1s") as url:
            database = postgres()
            config_file = tmp_path / "k.yaml"
            config_file.write_text(f"database: '{database}'\n")
            migrated(config_file)
            config = Config(
                database=SecretURL(database),
                targets=targets,
                prometheus=PrometheusSource(
                    url=SecretURL(url),
                    vllm_selector='{job="vllm"}',
                    dcgm_selector='{job="dcgm"}',
                ),
            )
            sessions = connect_store(config.database)

            def scraped_all() -> bool:
                found = httpx.get(f"{url}/api/v1/query", params={"query": "up == 1"}).json()
                return len(found["data"]["result"]) == len(targets)

            until("Prometheus scraping every target", scraped_all)
            members = [Cluster(config, sessions, time.time) for _ in range(2)]
            try:
                for member in members:
                    member.beat()
                ids = [m.id for m in members]
                rounds = [
                    {o.target for o in collect_round(config, sessions, time.time, m) if o.ok}
                    for m in members
                ]
            finally:
                for member in members:
                    member.leave()
            for member_id, stored in zip(ids, rounds, strict=True):
                assert stored == {t.name for t in targets if owner(t.name, ids) == member_id}
            assert rounds[0] | rounds[1] == {t.name for t in targets}
            with sessions() as session:
                assert all(
                    row.last_success_at is not None for row in session.scalars(select(TargetRow))
                )
    finally:
        fleet.stop()
