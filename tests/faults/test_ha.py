"""High availability on a real PostgreSQL with real `kneepoint collect` processes: two, then
three collectors split a twin fleet (each target scraped by exactly one of them, the one
the rendezvous hash over the live members names), one leads; the leader is killed with
SIGKILL, another takes over within two evaluation intervals, and a loopback webhook
receives each firing alert once (collectors/cluster.py). A leader killed while a firing
alert's notification is still pending (its receiver answered 500), and one killed while it is
claimed (its receiver holds the request unanswered): the next leader delivers it, at least
once and at most once more than the outbox's `resends` count (alerts/outbox.py).

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

from collectors.cluster import owner
from kneepoint.cli import app
from kneepoint.store.db import connect_store
from kneepoint.store.membership import Member, membership
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
    """A loopback webhook receiver: every firing alert it accepted (answered 200), by
    fingerprint; every request's Idempotency-Key by the replicas of its firing alerts. A
    request carrying a replica in `refuse` is answered 500; one carrying a replica in `hold`
    gets no answer until `release` is set (`held` is set when one arrives)."""

    firing: list[tuple[str, str]] = field(default_factory=list)  # (fingerprint, replica)
    keys: dict[str, list[str]] = field(default_factory=dict)
    refuse: set[str] = field(default_factory=set)
    hold: set[str] = field(default_factory=set)
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    port: int = 0


@contextmanager
def receiving() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            alerts = [a for a in body.get("alerts", []) if a["status"] == "firing"]
            replicas = {alert["labels"]["replica"] for alert in alerts}
            for replica in replicas:
                state.keys.setdefault(replica, []).append(self.headers["Idempotency-Key"])
            if replicas & state.hold:
                state.held.set()
                state.release.wait(BOUND)
                return  # no answer: the connection is closed
            status = 500 if replicas & state.refuse else 200
            if status == 200:
                state.firing += [(a["fingerprint"], a["labels"]["replica"]) for a in alerts]
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with loopback(Handler) as port:
        state.port = port
        try:
            yield state
        finally:
            state.release.set()


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


def whole_rounds(hits: list[str], share: set[str]) -> int | None:
    """How many whole rounds `hits` (one collector's scrapes in the order the twin got them)
    hold, if they are that collector's rounds of `share` one after another, each target once
    a round (a collector's rounds never overlap; the window may cut a round at its start and
    one at its end); None if they are not."""
    if not share:
        return None if hits else 0
    size = len(share)
    for offset in range(size):
        head, rest = hits[:offset], hits[offset:]
        if len(set(head)) != len(head) or not set(head) <= share:
            continue
        chunks = [rest[i : i + size] for i in range(0, len(rest), size)]
        whole = [chunk for chunk in chunks if len(chunk) == size]
        tail = chunks[-1] if chunks and len(chunks[-1]) < size else []
        distinct_tail = len(set(tail)) == len(tail) and set(tail) <= share
        if distinct_tail and all(set(chunk) == share for chunk in whole):
            return len(whole)
    return None


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
                hits = twin.since(mark)
                seen: dict[str, set[str]] = {}
                for target, collector in hits:
                    seen.setdefault(target, set()).add(collector)
                assert seen == {t: {want[t]} for t in TARGETS}, f"{seen} {want}\n{tails()}"
                # And once a round: each collector's scrapes are whole rounds of its share.
                for name in names:
                    mine = [t for t, c in hits if c == name]
                    share = {t for t in TARGETS if want[t] == name}
                    rounds = whole_rounds(mine, share)
                    # A member that rendezvous hashing gave no target (about one run in 20
                    # with 10 targets over 3 random member ids) has no round to make.
                    assert rounds is not None and (rounds >= 1 or not share), (
                        name,
                        sorted(share),
                        mine,
                    )
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


def test_a_leader_killed_with_a_notification_pending_or_claimed_is_replaced_and_it_is_sent(
    tmp_path: Path, postgres: Callable[[], str]
) -> None:
    """Three collectors. A replica goes down; the receiver answers 500 to its alert's firing
    message, so the row is pending (retried after its backoff) when the leader is killed:
    the next leader sends it and the receiver accepts it once. A second replica goes down;
    the receiver holds its message unanswered, so the row is claimed (its lease running,
    `maybe_sent`) when that leader is killed in turn: the last collector sends it once the
    lease ends, and the receiver has it twice under one Idempotency-Key, the second counted
    in `resends`: at most 1 + resends, as the outbox promises. That lease is three send
    deadlines and a margin (90 s, alerts/outbox.py): the test ends it in the database rather
    than wait it out, as the next sender's clock would see it run out.

    The replicas that go down are scraped by a collector that lives on (the first recovers
    before the second kill): a target the killed one scraped goes stale (after 3 s at this
    test's 1 s interval) when the survivors take it over late on a loaded machine, and a
    firing alert whose data goes missing says so in a message of its own (alerts/lifecycle.py
    `went_missing`), which is another notification."""
    fleet = Fleet(FleetSpec.model_validate(SPEC)).start()
    processes: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}

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
            for name, config in configs.items():
                logs[name] = tmp_path / f"{name}.log"
                with logs[name].open("ab") as out:
                    processes[name] = subprocess.Popen(
                        [*KNEEPOINT, "collect", "--config", str(config)], stdout=out, stderr=out
                    )

            def alive() -> dict[str, Member]:
                """Live members by the test's name of their running process."""
                with sessions() as session:
                    found = membership(session, LEASE, time.time())
                pids = {p.pid: n for n, p in processes.items() if p.poll() is None}
                return {pids[m.pid]: m for m in found if m.live and m.pid in pids}

            def settled_members() -> tuple[str, dict[str, str]] | None:
                """When every running collector is live and one leads: the leader, and the
                collector that scrapes each replica."""
                found = alive()
                leaders = [n for n, m in found.items() if m.leader]
                running = {n for n, p in processes.items() if p.poll() is None}
                if set(found) != running or len(leaders) != 1:
                    return None
                ids = {m.id: n for n, m in found.items()}
                return leaders[0], {r: ids[owner(r, list(ids))] for r in REPLICAS}

            def row_of(replica: str) -> NotificationRow | None:
                """The firing notification of `replica`'s alert (failing if there are two)."""
                with sessions() as session:
                    rows = [
                        row
                        for row in session.scalars(select(NotificationRow))
                        if json.loads(row.notice)["replica"] == replica
                        and json.loads(row.notice)["status"] == "firing"
                    ]
                assert len(rows) <= 1, [(r.id, r.state, r.notice) for r in rows]
                return rows[0] if rows else None

            def evaluated_after(moment: float) -> bool:
                with sessions() as session:
                    row = session.get(JobHealthRow, "alerts")
                    return bool(row and row.last_success_at and row.last_success_at > moment)

            def kill(name: str) -> float:
                os.kill(processes[name].pid, signal.SIGKILL)
                assert processes[name].wait(10) == -signal.SIGKILL
                return time.time()

            def delivered(replica: str) -> list[str]:
                return [f for f, r in hook.firing if r == replica]

            def news(replica: str) -> list[tuple[str, str]]:
                """Each notification about `replica`: its status and its row's state."""
                with sessions() as session:
                    rows = session.scalars(select(NotificationRow).order_by(NotificationRow.id))
                    found = [(json.loads(r.notice), r.state) for r in rows]
                return [(n["status"], state) for n, state in found if n["replica"] == replica]

            def settled(replica: str) -> NotificationRow | None:
                row = row_of(replica)
                return row if row is not None and row.state != "pending" else None

            def pick(what: str, taken: set[str]) -> tuple[str, str]:
                """The leader, and a replica (not in `taken`) that another collector scrapes."""
                found = until(what, settled_members, tails)
                assert isinstance(found, tuple)
                leader, owners = found
                choice = [r for r in REPLICAS if owners[r] != leader and r not in taken]
                assert choice, f"the leader {leader} scrapes every replica: {owners}"
                return leader, choice[0]

            # 1. Pending: the receiver refused the message; the leader dies before its retry.
            first, down = pick("three collectors live, one leading", set())
            hook.refuse.add(down)
            twin.down.add(down)

            def refused_and_waiting() -> NotificationRow | None:
                row = row_of(down)
                waiting = (
                    row is not None
                    and row.state == "pending"
                    and row.attempts >= 1
                    and row.claimed_by is None
                    # its retry still some way off: the leader is killed before it
                    and row.next_attempt_at > time.time() + 2
                )
                return row if waiting else None

            pending = until(f"{down}'s message refused, pending", refused_and_waiting, tails)
            assert isinstance(pending, NotificationRow) and not pending.maybe_sent
            leading = settled_members()
            assert leading is not None and leading[0] == first, leading
            killed_at = kill(first)
            hook.refuse.clear()  # from now on the receiver accepts; the killed one sends nothing
            until(f"{down}'s message delivered after the kill", lambda: delivered(down), tails)
            until("an evaluation by the next leader", lambda: evaluated_after(killed_at), tails)
            sent = until(f"{down}'s row settled", lambda: settled(down), tails)
            assert isinstance(sent, NotificationRow)
            assert sent.id == pending.id and sent.state == "sent" and sent.attempts >= 2
            assert 1 <= len(delivered(down)) <= 1 + (sent.resends or 0), hook.firing
            key = f"kneepoint-{sent.id}-{int(sent.created_at * 1000)}"
            assert set(hook.keys[down]) == {key}  # the one row, refused then sent: no second
            # It recovers, and its resolution goes out before the next kill: no firing alert
            # is left on a replica the next killed leader may scrape (see the docstring).
            twin.down.discard(down)
            until(f"{down}'s resolution sent", lambda: ("resolved", "sent") in news(down), tails)

            # 2. Claimed: the receiver holds the message; the new leader dies mid-send.
            second, again = pick("two collectors live, one leading", {down})
            assert second != first
            hook.hold.add(again)
            twin.down.add(again)
            until(f"{again}'s message held at the receiver", hook.held.is_set, tails)
            killed_at = kill(second)
            hook.hold.clear()
            hook.release.set()
            claimed = row_of(again)
            assert claimed is not None and claimed.state == "pending" and claimed.claimed_by
            assert claimed.maybe_sent and claimed.claimed_until is not None
            assert claimed.claimed_until > time.time()  # the dead sender's lease still runs
            with sessions.begin() as session:  # ... until now (see the docstring)
                row = session.get(NotificationRow, claimed.id)
                assert row is not None
                row.claimed_until = time.time()
            until(f"{again}'s message delivered after the kill", lambda: delivered(again), tails)
            until("an evaluation by the last leader", lambda: evaluated_after(killed_at), tails)
            sent = until(f"{again}'s row settled", lambda: settled(again), tails)
            assert isinstance(sent, NotificationRow)
            assert sent.id == claimed.id and sent.state == "sent" and sent.resends == 1
            received = hook.keys[again]  # the held request and the one sent after the kill
            assert len(delivered(again)) >= 1 and len(received) <= 1 + sent.resends, received
            assert set(received) == {f"kneepoint-{sent.id}-{int(sent.created_at * 1000)}"}
            last = until("the last collector leading", settled_members, tails)
            assert isinstance(last, tuple) and last[0] not in (first, second)
            # Nothing else was sent or is waiting: one firing message each, one resolution.
            with sessions() as session:
                count = len(session.scalars(select(NotificationRow.id)).all())
            assert news(down) == [("firing", "sent"), ("resolved", "sent")]
            assert news(again) == [("firing", "sent")] and count == 3
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
    from collectors.jobs import record_job_event, standard_jobs
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
    from collectors.jobs import scrape_job
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
    from collectors.jobs import collect_round
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
