"""The chaos run: a twin fleet behind flapping fronts, a webhook receiver that fails in every
way a chat platform does, and a real `kneepoint collect` (scrape, evaluate, deliver) killed
with SIGKILL every few minutes, for a bounded time, on loopback only. Then the faults stop, the
collector drains its outbox, and the run prints what happened:

    .venv/bin/python bench/chaos.py [--minutes 20] [--seed 1] [--out chaos.json]

- scrapes: requests the fronts answered with a body, and scrapes stored (a scrape in flight
  at a kill is lost with the process: it had not been committed);
- notifications: rows the outbox made due, delivered (a 2xx the receiver finished sending),
  duplicated (a row delivered more than once), lost (due, never delivered and not settled as
  superseded or expired), and the re-sends the outbox itself counted as possible duplicates;
- silent resolves: firing alerts resolved at an evaluation that had no value for them;
- the longest gap between two successful evaluations, and between two stored scrapes of a
  target that was up.

The collector's rules: `up < 1` for every target, to the receiver, so every flap is news.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import yaml
from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kneepoint.store.db import connect_store  # noqa: E402
from kneepoint.store.models import (  # noqa: E402
    AlertHistoryRow,
    GpuSampleRow,
    JobHealthRow,
    NotificationRow,
    ReplicaSampleRow,
)
from kneepoint.twin.fleet import Fleet, FleetSpec  # noqa: E402

FLEET = {
    "nodes": [{"name": "node-1", "gpus": ["l4", "l4"]}],
    "replicas": [
        {"name": "replica-a", "model": "qwen3-4b", "node": "node-1", "gpu_index": 0},
        {"name": "replica-b", "model": "qwen3-4b", "node": "node-1", "gpu_index": 1},
    ],
}
TARGET_FAULTS = ("503", "close", "hang", "garbage")
RECEIVER_FAULTS = ("500", "429", "hang", "trickle", "close")


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class Front:
    """A target's front: forwards to the twin, or fails the way it is told to."""

    upstream: str
    fault: str | None = None
    served: int = 0  # scrapes answered with the twin's body
    failed: int = 0
    server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        front = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fault = front.fault
                if fault is None:
                    body = httpx.get(front.upstream, timeout=5).content
                    front.served += 1
                    return self._answer(200, body)
                front.failed += 1
                if fault == "close":
                    self.close_connection = True
                    return None
                if fault == "hang":
                    time.sleep(8)  # past the target's timeout
                    return None
                if fault == "garbage":
                    return self._answer(200, b'vllm:kv_cache_usage_perc{le="x" 1\n\x00\n')
                return self._answer(503, b"unavailable")

            def _answer(self, status: int, body: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = serve(Handler)
        return f"http://127.0.0.1:{self.server.server_address[1]}/metrics"


@dataclass
class Receiver:
    """A webhook receiver: answers 2xx, or fails (randomly, or all of it in an outage)."""

    rng: random.Random
    fault_rate: float = 0.3
    outage: str | None = None
    acknowledged: Counter[str] = field(default_factory=Counter)  # key -> 2xx answers finished
    attempts: Counter[str] = field(default_factory=Counter)  # key -> requests seen
    statuses: dict[str, str] = field(default_factory=dict)  # key -> the notice's status
    history: dict[str, list[str]] = field(default_factory=dict)  # key -> what each try got
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def took(self, key: str, how: str) -> None:
        """A 2xx status line reached kneepoint: the platform has the message."""
        with self.lock:
            self.acknowledged[key] += 1
            self.history.setdefault(key, []).append(how)

    def saw(self, key: str, how: str) -> None:
        with self.lock:
            self.history.setdefault(key, []).append(how)

    def start(self) -> str:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                key = self.headers.get("Idempotency-Key") or str(hash(body))
                with receiver.lock:
                    receiver.attempts[key] += 1
                    receiver.statuses.setdefault(key, _status(body))
                    fault = receiver.outage
                    if fault is None and receiver.rng.random() < receiver.fault_rate:
                        fault = receiver.rng.choice(RECEIVER_FAULTS)
                if fault not in (None, "trickle"):
                    receiver.saw(key, fault)
                try:
                    if fault == "close":
                        self.close_connection = True
                        return
                    if fault == "hang":
                        time.sleep(40)  # past any send deadline
                        return
                    if fault == "trickle":  # a 200 whose body never ends: the status
                        self.send_response(200)  # line says the platform took it
                        self.send_header("Content-Length", "1000")
                        self.end_headers()
                        self.wfile.flush()
                        receiver.took(key, "trickle")
                        for _ in range(40):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            time.sleep(1)
                        return
                    if fault in ("500", "429"):
                        self.send_response(int(fault))
                        self.send_header("Retry-After", "2")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                    self.wfile.flush()
                except OSError:
                    receiver.saw(key, f"{fault or '200'}, cut")
                    return  # kneepoint gave up before the status line: not a delivery
                if fault is None:
                    receiver.took(key, "200")

            def log_message(self, *args: object) -> None:
                pass

        self.server = serve(Handler)
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"


def _status(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return "?"
    return str(data.get("status", "?")) if isinstance(data, dict) else "?"


@dataclass
class Collector:
    """`kneepoint collect` in a subprocess, killed with SIGKILL and started again."""

    config: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    kills: int = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kneepoint.cli", "collect", "--config", str(self.config)],
                stdout=out,
                stderr=out,
            )

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.kills += 1

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class EvaluationWatch:
    """Polls the alerts job's last success once a second: the longest gap between two."""

    sessions: object
    longest: float = 0.0
    last: float | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                with self.sessions() as session:  # type: ignore[operator]
                    row = session.get(JobHealthRow, "alerts")
                    seen = row.last_success_at if row else None
            except Exception:
                continue  # the database is busy or being migrated: look again
            if seen is None:
                continue
            if self.last is not None and seen > self.last:
                self.longest = max(self.longest, seen - self.last)
            if self.last is None or seen > self.last:
                self.last = seen
        if self.last is not None:
            self.longest = max(self.longest, time.time() - self.last)


def write_config(folder: Path, fronts: dict[str, tuple[str, str]], hook: str) -> Path:
    config = {
        "database": f"sqlite:///{folder / 'chaos.db'}",
        "scrape_interval": "5s",
        "evaluation_interval": "5s",
        "targets": [
            {"name": name, "kind": kind, "url": url, "timeout": "3s"}
            for name, (kind, url) in fronts.items()
        ],
        "channels": [{"name": "chaos", "type": "webhook", "url": hook}],
        "rules": [
            {
                "name": "chaos-target-down",
                "metric": "up",
                "op": "<",
                "threshold": 1,
                "for": "0s",
                "severity": "page",
                "channels": ["chaos"],
            }
        ],
    }
    path = folder / "kneepoint.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def chaos(minutes: float, seed: int, folder: Path) -> dict[str, object]:
    rng = random.Random(seed)
    fleet = Fleet(FleetSpec.model_validate(FLEET)).start()
    fronts = {t.name: Front(t.url) for t in fleet.targets()}
    kinds = {t.name: t.kind for t in fleet.targets()}
    receiver = Receiver(rng)
    config = write_config(
        folder, {name: (kinds[name], f.start()) for name, f in fronts.items()}, receiver.start()
    )
    subprocess.run(
        [sys.executable, "-m", "kneepoint.cli", "migrate", "--config", str(config)], check=True
    )
    sessions = connect_store(f"sqlite:///{folder / 'chaos.db'}")
    collector = Collector(config, folder / "collector.log")
    watch = EvaluationWatch(sessions)
    watcher = threading.Thread(target=watch.run, daemon=True)
    collector.start()
    watcher.start()
    began = time.monotonic()
    end = began + minutes * 60
    next_kill = began + rng.uniform(60, 240)
    next_flap = began + rng.uniform(5, 30)
    next_outage = began + rng.uniform(60, 180)
    outage_over = None
    flaps = outages = 0
    healing: dict[str, float] = {}
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_kill:
            collector.kill()
            time.sleep(rng.uniform(1, 4))
            collector.start()
            next_kill = now + rng.uniform(60, 240)
        if now >= next_flap:
            name = rng.choice(list(fronts))
            fronts[name].fault = rng.choice(TARGET_FAULTS)
            healing[name] = now + rng.uniform(10, 60)
            flaps += 1
            next_flap = now + rng.uniform(10, 45)
        for name, when in list(healing.items()):
            if now >= when:
                fronts[name].fault = None
                del healing[name]
        if outage_over is None and now >= next_outage:
            receiver.outage = rng.choice(("500", "hang", "close"))
            outage_over = now + rng.uniform(20, 90)
            outages += 1
        if outage_over is not None and now >= outage_over:
            receiver.outage, outage_over = None, None
            next_outage = now + rng.uniform(60, 180)
        time.sleep(0.5)
    # The faults stop; the collector runs on until its outbox is empty (or 10 minutes).
    for front in fronts.values():
        front.fault = None
    receiver.outage, receiver.fault_rate = None, 0.0
    drain_until = time.monotonic() + 600
    while time.monotonic() < drain_until:
        time.sleep(5)
        with sessions() as session:
            pending = session.scalar(
                select(func.count())
                .select_from(NotificationRow)
                .where(NotificationRow.state == "pending")
            )
        if not pending:
            break
    time.sleep(10)  # a last evaluation of the healed fleet, and its news delivered
    watch.stop.set()
    watcher.join()
    collector.stop()
    fleet.stop()
    return report(sessions, fronts, receiver, collector, watch, flaps, outages, minutes)


def report(
    sessions: object,
    fronts: dict[str, Front],
    receiver: Receiver,
    collector: Collector,
    watch: EvaluationWatch,
    flaps: int,
    outages: int,
    minutes: float,
) -> dict[str, object]:
    with sessions() as session:  # type: ignore[operator]
        rows = session.scalars(select(NotificationRow)).all()
        stored = int(session.scalar(select(func.count()).select_from(ReplicaSampleRow)) or 0)
        gpu_rounds = session.execute(select(GpuSampleRow.gpu_id, GpuSampleRow.ts).distinct()).all()
        silent = int(
            session.scalar(
                select(func.count())
                .select_from(AlertHistoryRow)
                .where(
                    AlertHistoryRow.before == "firing",
                    AlertHistoryRow.after == "resolved",
                    AlertHistoryRow.value.is_(None),
                )
            )
            or 0
        )
        resends = sum(int(row.resends or 0) for row in rows)
    states = Counter(row.state for row in rows)
    keys = {_key(row): row for row in rows}
    due = [row for row in rows if row.state not in ("muted",)]
    delivered = [row for row in due if receiver.acknowledged.get(_key(row), 0) > 0]
    dropped = [row for row in due if row.state in ("superseded", "expired")]
    lost = [
        row
        for row in due
        if receiver.acknowledged.get(_key(row), 0) == 0
        and row.state not in ("superseded", "expired")
    ]
    duplicated = sum(max(0, n - 1) for n in receiver.acknowledged.values())
    unknown = [key for key in receiver.acknowledged if key not in keys]
    gpus_per_node = 2
    return {
        "minutes": minutes,
        "collector_kills": collector.kills,
        "target_flaps": flaps,
        "receiver_outages": outages,
        "scrapes_served": sum(f.served for f in fronts.values()),
        "scrapes_failed_by_fault": sum(f.failed for f in fronts.values()),
        "scrapes_stored": stored + len(gpu_rounds) // gpus_per_node,
        "notifications": dict(states),
        "notifications_due": len(due),
        "delivered": len(delivered),
        "duplicated": duplicated,
        "counted_possible_duplicates": resends,
        "dropped_superseded_or_expired": len(dropped),
        "lost": len(lost),
        "lost_rows": [
            (row.id, row.state, row.last_error, receiver.history.get(_key(row), [])) for row in lost
        ][:20],
        "deliveries_of_unknown_rows": len(unknown),
        "silent_resolves": silent,
        "longest_evaluation_gap_seconds": round(watch.longest, 1),
    }


def _key(row: NotificationRow) -> str:
    return f"kneepoint-{row.id}-{int(row.created_at * 1000)}"  # as alerts/outbox.py keys it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--dir", type=Path, help="keep the database and logs here")
    args = parser.parse_args()
    folder = args.dir or Path(tempfile.mkdtemp(prefix="kneepoint-chaos-"))
    folder.mkdir(parents=True, exist_ok=True)
    figures = chaos(args.minutes, args.seed, folder)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print(f"database and collector log in {folder}", file=sys.stderr)


if __name__ == "__main__":
    main()
