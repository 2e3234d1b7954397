"""The chaos run: a twin fleet behind flapping fronts, a webhook receiver that fails in every
way a chat platform does, and a real `kneepoint collect` (scrape, evaluate, deliver) that is
killed with SIGKILL, has its database locked by another connection, its disk filled, and its
wall clock stepped back and forward, for a bounded time, on loopback only. Then the faults
stop, the collector drains its outbox, and the run prints what happened:

    .venv/bin/python bench/chaos.py [--minutes 20] [--seed 1] [--interval 5] [--out chaos.json]

How each fault is made:

- kill: SIGKILL, then a new `kneepoint collect` 1-4 s later;
- target flaps: a front answers 503, drops the connection, hangs past the timeout or sends a
  body that does not parse;
- receiver faults: three requests in ten at random (500, 429, hang, a trickled 200, a dropped
  connection), plus whole outages;
- database locked: another connection holds `BEGIN EXCLUSIVE` for longer than the
  collector's busy timeout (twice the scrape interval) and than a round can take (the
  target timeout plus two intervals);
- disk full: as root, the database lives on a 64 MiB tmpfs that is filled to the last byte
  (ENOSPC, as tests/faults/test_storage.py does) and freed; otherwise the collector's
  RLIMIT_FSIZE soft limit is set to one byte with prlimit(2) (every write fails with EFBIG)
  and raised again;
- clock steps: the collector runs under bench/chaos_clock.py, whose `time.time()` is offset by
  what the run writes to a file; steps of 5-15 scrape intervals, back or forward.

Counting rules (the store's and the receiver's own records, never timing):

- Rows. Every request a front gets has a serial; a body it serves carries it (vLLM:
  `process_start_time_seconds` = 1e9 + serial, stored in replica_samples.process_start_time;
  DCGM: `DCGM_FI_DEV_XID_ERRORS` = serial for each GPU, stored in gpu_samples.xid_error).
  A served body is expected as 1 row (replica) or one per GPU (node). One that is not stored
  is excused only by a recorded cause: it was the last request of its target that a
  collector process made before it was killed or stopped (in flight); a storage fault
  overlapped the time between its request and its target's next request by the same process
  (the round's write falls in there: rounds of a process never overlap); the clock had been
  stepped back between the previous request and it, by less than the refusal window (the
  store counts these in targets.samples_refused); or the front took more than half the
  target's timeout to answer (the collector may have given up on it, and recorded a scrape
  error). Anything else is lost. A node's serial stored for some GPUs and not others is lost.
- Notifications: rows the outbox made due, delivered (a 2xx status line reached kneepoint,
  as the outbox counts it), duplicated, lost (due, never delivered, not superseded or
  expired); firing alerts with no news at the receiver (an alert whose newest notification
  row was not delivered, or a firing transition in alert_history with no firing row carrying
  it); resolutions without a recovery (a resolved transition with no value, or below the
  rule's threshold).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kneepoint.store.db import connect_store  # noqa: E402
from kneepoint.store.models import (  # noqa: E402
    RAW,
    AlertHistoryRow,
    GpuRow,
    GpuSampleRow,
    JobHealthRow,
    NotificationRow,
    ReplicaSampleRow,
    TargetRow,
)
from kneepoint.twin.fleet import Fleet, FleetSpec  # noqa: E402

FLEET = {
    "nodes": [{"name": "node-1", "gpus": ["l4", "l4"]}],
    "replicas": [
        {"name": "replica-a", "model": "qwen3-4b", "node": "node-1", "gpu_index": 0},
        {"name": "replica-b", "model": "qwen3-4b", "node": "node-1", "gpu_index": 1},
    ],
}
GPUS_PER_NODE = 2
TARGET_FAULTS = ("503", "close", "hang", "garbage")
RECEIVER_FAULTS = ("500", "429", "hang", "trickle", "close")
RULE = "chaos-target-down"  # the run's rule, to the receiver; built-in rules have no channel
EPISODES = ("kill", "lock", "disk", "clock-back", "clock-forward")
TRACER_BASE = 1_000_000_000
FIRE = "firing"
TARGET_TIMEOUT = 10.0  # generous: a loaded machine's slow answer is not a fault of ours
HANG = 15.0  # a hanging front or receiver: past the target's timeout and the send deadline
XID = re.compile(rb"^# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n", re.M)
GPU_LABELS = re.compile(rb"^DCGM_FI_DEV_GPU_UTIL(\{[^}]*\}) ", re.M)


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def traced(kind: str, body: bytes, serial: int) -> bytes:
    """The body with the request's serial in a quantity the store keeps per sample."""
    if kind == "dcgm":
        lines = b"".join(
            b"DCGM_FI_DEV_XID_ERRORS%s %d\n" % (labels, serial)
            for labels in GPU_LABELS.findall(body)
        )
        return XID.sub(lambda m: m.group(0) + lines, body, count=1)
    return body + b"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %d\n" % (
        TRACER_BASE + serial
    )


@dataclass
class Request:
    """One request a front got: its serial, the collector process (generation) that was
    running, when it came (the run's monotonic clock), how it was answered and how long
    the front took."""

    serial: int
    generation: int
    at: float
    outcome: str = "?"
    took: float = 0.0


@dataclass
class Front:
    """A target's front: forwards to the twin with the serial traced in, or fails the way it
    is told to."""

    upstream: str
    kind: str
    generation: Callable[[], int]
    fault: str | None = None
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def served(self) -> list[Request]:
        return [r for r in self.requests if r.outcome == "served"]

    def start(self) -> str:
        front = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                began = time.monotonic()
                with front.lock:
                    request = Request(len(front.requests) + 1, front.generation(), began)
                    front.requests.append(request)
                fault = front.fault
                request.outcome = fault or "served"
                if fault is None:
                    body = httpx.get(front.upstream, timeout=30).content
                    self._answer(200, traced(front.kind, body, request.serial))
                elif fault == "close":
                    self.close_connection = True
                elif fault == "hang":
                    time.sleep(HANG)
                elif fault == "garbage":
                    self._answer(200, b'vllm:kv_cache_usage_perc{le="x" 1\n\x00\n')
                else:
                    self._answer(503, b"unavailable")
                request.took = time.monotonic() - began

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
    """A webhook receiver: answers 2xx, or fails (randomly, or all of it in an outage).
    It records, per Idempotency-Key, every try and what it got, and the alerts each
    message carried."""

    rng: random.Random
    fault_rate: float = 0.3
    outage: str | None = None
    acknowledged: Counter[str] = field(default_factory=Counter)  # key -> 2xx status lines
    attempts: Counter[str] = field(default_factory=Counter)  # key -> requests seen
    statuses: dict[str, str] = field(default_factory=dict)  # key -> the message's status
    fingerprints: dict[str, list[str]] = field(default_factory=dict)  # key -> its alerts
    history: dict[str, list[str]] = field(default_factory=dict)  # key -> what each try got
    faults: Counter[str] = field(default_factory=Counter)  # random faults answered, by kind
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
                status, fingerprints = _parsed(body)
                with receiver.lock:
                    receiver.attempts[key] += 1
                    receiver.statuses.setdefault(key, status)
                    receiver.fingerprints.setdefault(key, fingerprints)
                    fault = receiver.outage
                    if fault is None and receiver.rng.random() < receiver.fault_rate:
                        fault = receiver.rng.choice(RECEIVER_FAULTS)
                        receiver.faults[fault] += 1
                if fault not in (None, "trickle"):
                    receiver.saw(key, fault)
                try:
                    if fault == "close":
                        self.close_connection = True
                        return
                    if fault == "hang":
                        time.sleep(HANG)  # past the send deadline (10 s)
                        return
                    if fault == "trickle":  # a 200 whose body never ends: the status
                        self.send_response(200)  # line says the platform took it
                        self.send_header("Content-Length", "1000")
                        self.end_headers()
                        self.wfile.flush()
                        receiver.took(key, "trickle")
                        for _ in range(int(HANG)):
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


def _parsed(body: bytes) -> tuple[str, list[str]]:
    """The webhook message's status and the fingerprints of the alerts it carries."""
    try:
        data = json.loads(body)
    except ValueError:
        return "?", []
    if not isinstance(data, dict):
        return "?", []
    alerts = data.get("alerts") or []
    prints = [str(a.get("fingerprint")) for a in alerts if isinstance(a, dict)]
    return str(data.get("status", "?")), prints


@dataclass
class Collector:
    """`kneepoint collect` in a subprocess under the steppable clock, killed with SIGKILL
    and started again. Each process is a generation: [start, end) on the run's clock."""

    config: Path
    log: Path
    clock_file: Path
    process: subprocess.Popen[bytes] | None = None
    generation: int = 0
    kills: int = 0
    exits: list[int] = field(default_factory=list)  # return codes of unasked exits
    ends: dict[int, float] = field(default_factory=dict)  # generation -> when it ended
    starts: dict[int, float] = field(default_factory=dict)

    def start(self) -> None:
        with self.log.open("ab") as out:
            out.write(f"=== generation {self.generation + 1}\n".encode())
            out.flush()
            self.generation += 1
            self.starts[self.generation] = time.monotonic()
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "bench" / "chaos_clock.py"),
                    str(self.clock_file),
                    "collect",
                    "--config",
                    str(self.config),
                ],
                stdout=out,
                stderr=out,
            )

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.ends[self.generation] = time.monotonic()
        self.kills += 1

    def check(self) -> None:
        """A collector that exited by itself is a finding: recorded, and started again."""
        if self.process is not None and self.process.poll() is not None:
            self.ends[self.generation] = time.monotonic()
            self.exits.append(self.process.returncode)
            self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.ends[self.generation] = time.monotonic()


@dataclass
class EvaluationWatch:
    """Polls the alerts job's last success once a second: the longest gap between two (on
    the collector's clock, whose steps show here too)."""

    sessions: sessionmaker[Session]
    longest: float = 0.0
    last: float | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                with self.sessions() as session:
                    row = session.get(JobHealthRow, "alerts")
                    seen = row.last_success_at if row else None
            except Exception:
                continue  # the database is locked or its disk full: look again
            if seen is None:
                continue
            if self.last is not None and seen > self.last:
                self.longest = max(self.longest, seen - self.last)
            if self.last is None or seen > self.last:
                self.last = seen


@dataclass
class Episode:
    """A fault the run made, on its monotonic clock: [start, end]; for a clock step, `end`
    is when the collector applied it and `size` its seconds (negative: back)."""

    kind: str
    start: float
    end: float
    size: float = 0.0
    detail: str = ""


class Disk:
    """The database's disk, made full and freed again: a filled tmpfs as root, otherwise
    the collector's RLIMIT_FSIZE soft limit."""

    def __init__(self, folder: Path, how: str) -> None:
        self.folder = folder / "db"
        self.folder.mkdir(exist_ok=True)
        self.how = how
        if how in ("auto", "tmpfs") and os.geteuid() == 0:
            mounted = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=64m,mode=0755", "tmpfs", str(self.folder)],
                capture_output=True,
                text=True,
            )
            if mounted.returncode == 0:
                self.how = "tmpfs"
            elif how == "tmpfs":
                raise SystemExit(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
        if self.how != "tmpfs":
            self.how = "rlimit"
        self.filler = self.folder / "filler"

    def fill(self, pid: int) -> str:
        if self.how == "tmpfs":
            fill(self.filler)
            return "tmpfs filled"
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
        return "RLIMIT_FSIZE 1 byte"

    def free(self, pid: int | None) -> None:
        if self.how == "tmpfs":
            self.filler.unlink(missing_ok=True)
        elif pid is not None:
            try:
                limits = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
                resource.prlimit(pid, resource.RLIMIT_FSIZE, limits)
            except ProcessLookupError:
                pass  # killed meanwhile: its successor never had the limit

    def unmount(self, keep: Path) -> None:
        if self.how == "tmpfs":
            for name in ("chaos.db", "chaos.db-wal", "chaos.db-shm"):
                if (self.folder / name).exists():
                    shutil.copy2(self.folder / name, keep / name)
            subprocess.run(["umount", "-l", str(self.folder)], check=False)


def fill(path: Path) -> None:
    """Write zeros to `path` until the filesystem takes not one more byte (as
    tests/faults/test_storage.py does)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        size = 1 << 20
        while size:
            try:
                os.write(descriptor, b"\0" * size)
            except OSError:
                size //= 2
    finally:
        os.close(descriptor)


def write_config(
    folder: Path, database: Path, fronts: dict[str, tuple[str, str]], hook: str, interval: float
) -> Path:
    config = {
        # A busy timeout of two intervals: a lock held for longer fails rounds.
        "database": f"sqlite:///{database}?timeout={2 * interval:g}",
        "scrape_interval": f"{interval:g}s",
        "evaluation_interval": f"{interval:g}s",
        "targets": [
            {"name": name, "kind": kind, "url": url, "timeout": f"{TARGET_TIMEOUT:g}s"}
            for name, (kind, url) in fronts.items()
        ],
        "channels": [{"name": "chaos", "type": "webhook", "url": hook}],
        "rules": [
            {
                "name": RULE,
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


class Clock:
    """The collector's clock offset, written to the file bench/chaos_clock.py follows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ack = path.with_name(path.name + ".ack")
        self.offset = 0.0
        path.write_text("0.0")

    def step(self, by: float, collector: Collector) -> float:
        """Step by `by` seconds; return when the running collector applied it (or a new
        one started, which reads the file first)."""
        self.ack.unlink(missing_ok=True)
        self.offset += by
        generation = collector.generation
        self.path.write_text(repr(self.offset))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if float(self.ack.read_text()) == self.offset:
                    break
            except (OSError, ValueError):
                pass
            collector.check()
            if collector.generation != generation:
                break
            time.sleep(0.02)
        return time.monotonic()


def chaos(
    minutes: float, seed: int, folder: Path, interval: float = 5.0, disk: str = "auto"
) -> dict[str, Any]:
    """Run the chaos for `minutes` with scrapes and evaluations every `interval` seconds;
    return the figures (see `report`)."""
    rng = random.Random(seed)
    fleet = Fleet(FleetSpec.model_validate(FLEET)).start()
    store = Disk(folder, disk)
    database = store.folder / "chaos.db"
    clock = Clock(folder / "clock-offset")
    collector: Collector | None = None

    def generation() -> int:
        return collector.generation if collector is not None else 0

    fronts = {t.name: Front(str(t.url), t.kind, generation) for t in fleet.targets()}
    receiver = Receiver(rng)
    config = write_config(
        folder,
        database,
        {name: (f.kind, f.start()) for name, f in fronts.items()},
        receiver.start(),
        interval,
    )
    subprocess.run(
        [sys.executable, "-m", "kneepoint.cli", "migrate", "--config", str(config)],
        check=True,
        cwd=ROOT,
    )
    sessions = connect_store(f"sqlite:///{database}")
    collector = Collector(config, folder / "collector.log", clock.path)
    watch = EvaluationWatch(sessions)
    watcher = threading.Thread(target=watch.run, daemon=True)
    collector.start()
    watcher.start()
    episodes: list[Episode] = []
    flaps: Counter[str] = Counter()
    outages: Counter[str] = Counter()
    began = time.monotonic()
    end = began + minutes * 60
    # Each kind of episode at least once, in a shuffled order, then at random; one at a
    # time, so that every missing row has one cause to look at.
    plan = list(EPISODES)
    rng.shuffle(plan)
    next_episode = began + interval * rng.uniform(3, 6)
    next_flap = began + interval * rng.uniform(1, 6)
    next_outage = began + interval * rng.uniform(4, 12)
    outage_over: float | None = None
    healing: dict[str, float] = {}
    try:
        while time.monotonic() < end:
            now = time.monotonic()
            collector.check()
            if now >= next_episode:
                kind = plan.pop(0) if plan else rng.choice(EPISODES)
                episodes.append(episode(kind, rng, interval, collector, clock, store))
                gap = interval * rng.uniform(4, 12)
                if plan:  # room left for every kind not made yet
                    gap = min(gap, (end - time.monotonic()) / (len(plan) + 1))
                next_episode = time.monotonic() + gap
            if now >= next_flap:
                name = rng.choice(list(fronts))
                fronts[name].fault = rng.choice(TARGET_FAULTS)
                flaps[fronts[name].fault or ""] += 1
                healing[name] = now + interval * rng.uniform(2, 12)
                next_flap = now + interval * rng.uniform(2, 9)
            for name, when in list(healing.items()):
                if now >= when:
                    fronts[name].fault = None
                    del healing[name]
            if outage_over is None and now >= next_outage:
                receiver.outage = rng.choice(("500", "hang", "close"))
                outages[receiver.outage] += 1
                outage_over = now + interval * rng.uniform(4, 18)
            if outage_over is not None and now >= outage_over:
                receiver.outage, outage_over = None, None
                next_outage = now + interval * rng.uniform(12, 36)
            time.sleep(0.2)
        # A machine so loaded that a kind was not made in time: made now, so that every run
        # has every kind of fault.
        for kind in plan:
            episodes.append(episode(kind, rng, interval, collector, clock, store))
        if not flaps:
            name = rng.choice(list(fronts))
            fronts[name].fault = "503"
            flaps["503"] += 1
            time.sleep(3 * interval)
        if not outages:
            receiver.outage = "500"
            outages["500"] += 1
            time.sleep(3 * interval)
        # No alert fired in a short run (its flaps fell on the node, or on faults of the
        # collector): a replica down until one does, so that every run judges news.
        if not fired(sessions):
            name = next(n for n, f in fronts.items() if f.kind != "dcgm")
            fronts[name].fault = "503"
            flaps["503"] += 1
            waited = time.monotonic() + 120
            while not fired(sessions) and time.monotonic() < waited:
                collector.check()
                time.sleep(interval)
        # The faults stop; the collector runs on until its outbox is empty (or 10 minutes).
        for front in fronts.values():
            front.fault = None
        receiver.outage, receiver.fault_rate = None, 0.0
        calm = time.monotonic()
        drained = None
        while time.monotonic() < calm + 600:
            time.sleep(1)
            collector.check()
            try:
                with sessions() as session:
                    pending = session.scalar(
                        select(func.count())
                        .select_from(NotificationRow)
                        .where(NotificationRow.state == "pending")
                    )
            except Exception:
                continue
            if not pending and time.monotonic() > calm + 3 * interval:
                drained = time.monotonic() - calm
                break
        time.sleep(3 * interval)  # a last evaluation of the healed fleet, its news delivered
        watch.stop.set()
        watcher.join()
        collector.stop()
        # The raw records, to count again by other rules later.
        records = {
            "requests": {
                name: [(r.serial, r.generation, r.at, r.outcome, r.took) for r in f.requests]
                for name, f in fronts.items()
            },
            "episodes": [(e.kind, e.start, e.end, e.size, e.detail) for e in episodes],
            "generation_ends": collector.ends,
            "receiver": {
                "acknowledged": receiver.acknowledged,
                "history": receiver.history,
                "statuses": receiver.statuses,
            },
        }
        (folder / "records.json").write_text(json.dumps(records))
        figures = report(
            sessions, fronts, receiver, collector, watch, episodes, flaps, outages, minutes
        )
        figures["interval_seconds"] = interval
        figures["disk_full_by"] = store.how
        figures["outbox_drained_seconds_after_faults"] = (
            round(drained, 1) if drained is not None else None
        )
        return figures
    finally:
        collector.stop()
        fleet.stop()
        sessions.kw["bind"].dispose()
        store.unmount(folder)


def fired(sessions: sessionmaker[Session]) -> bool:
    """Whether the run's rule has fired yet (False while the database cannot be read)."""
    try:
        with sessions() as session:
            return bool(
                session.scalar(
                    select(func.count())
                    .select_from(AlertHistoryRow)
                    .where(AlertHistoryRow.rule == RULE, AlertHistoryRow.after == "firing")
                )
            )
    except Exception:
        return False


def episode(
    kind: str,
    rng: random.Random,
    interval: float,
    collector: Collector,
    clock: Clock,
    disk: Disk,
) -> Episode:
    """Make one fault happen, and return what was made and when."""
    start = time.monotonic()
    if kind == "kill":
        collector.kill()
        time.sleep(rng.uniform(1, 4))
        collector.start()
        return Episode(kind, start, time.monotonic())
    if kind.startswith("clock"):
        size = interval * rng.uniform(5, 15) * (-1 if kind == "clock-back" else 1)
        applied = clock.step(size, collector)
        return Episode(kind, start, applied, size)
    # Longer than the busy timeout (2 intervals) and than a round can take (a hanging
    # target holds one for its timeout), so that some round's write meets the fault.
    held = max(interval * rng.uniform(3, 6), TARGET_TIMEOUT + 2 * interval)
    if kind == "lock":
        holder = sqlite3.connect(disk.folder / "chaos.db", isolation_level=None, timeout=60)
        try:
            holder.execute("BEGIN EXCLUSIVE")
            locked = time.monotonic()
            time.sleep(held)
            holder.execute("ROLLBACK")
        finally:
            holder.close()
        detail = f"held {time.monotonic() - locked:.1f}s"
        return Episode(kind, start, time.monotonic(), detail=detail)
    assert kind == "disk"
    assert collector.process is not None
    pid = collector.process.pid
    how = disk.fill(pid)
    time.sleep(held)
    disk.free(pid)
    return Episode(kind, start, time.monotonic(), detail=how)


def stored_serials(session: Session) -> dict[str, Counter[int]]:
    """Target name -> serial -> rows stored with it (raw rows only)."""
    names = dict(session.execute(select(TargetRow.id, TargetRow.name)).all())
    found: dict[str, Counter[int]] = defaultdict(Counter)
    for target_id, value in session.execute(
        select(ReplicaSampleRow.target_id, ReplicaSampleRow.process_start_time).where(
            ReplicaSampleRow.resolution == RAW
        )
    ):
        if value is not None:
            found[names[target_id]][int(value) - TRACER_BASE] += 1
    for target_id, value in session.execute(
        select(GpuRow.target_id, GpuSampleRow.xid_error)
        .join(GpuRow, GpuRow.id == GpuSampleRow.gpu_id)
        .where(GpuSampleRow.resolution == RAW)
    ):
        if value is not None:
            found[names[target_id]][int(value)] += 1
    return found


def refusal_windows(episodes: list[Episode]) -> list[tuple[float, float]]:
    """When the collector's clock may have refused samples (read a time not above the
    highest it had read before), on the run's clock: from a step back's start until the
    highest clock value reached before it, less the offset after it. Each step took effect
    between its episode's start and end (the collector's acknowledgement), so the highest
    value before step i is at most max over earlier pieces j of (the end of the step that
    closed piece j + piece j's offset): an upper bound, so a window never ends too early."""
    windows: list[tuple[float, float]] = []
    offset = 0.0
    highest = -math.inf
    for one in episodes:
        if not one.kind.startswith("clock"):
            continue
        highest = max(highest, one.end + offset)
        offset += one.size
        if highest - offset > one.start:
            windows.append((one.start, highest - offset))
    return windows


def account_rows(
    fronts: dict[str, Front],
    stored: dict[str, Counter[int]],
    episodes: list[Episode],
    ends: dict[int, float],
) -> dict[str, Any]:
    """Every served body: stored whole, excused by a recorded cause, or lost."""
    storage = [e for e in episodes if e.kind in ("lock", "disk")]
    refusals = refusal_windows(episodes)
    expected = stored_rows = 0
    excused: Counter[str] = Counter()
    refused_serials = 0
    lost: list[dict[str, Any]] = []
    unknown = 0
    for name, front in fronts.items():
        per = GPUS_PER_NODE if front.kind == "dcgm" else 1
        served = {r.serial for r in front.served}
        unknown += sum(n for serial, n in stored[name].items() if serial not in served)
        by_generation: dict[int, list[Request]] = defaultdict(list)
        for request in front.requests:
            by_generation[request.generation].append(request)
        for generation, requests in by_generation.items():
            requests.sort(key=lambda r: r.at)
            for position, request in enumerate(requests):
                if request.outcome != "served":
                    continue
                expected += per
                rows = stored[name].get(request.serial, 0)
                stored_rows += min(rows, per)
                if rows == per:
                    continue
                last = position == len(requests) - 1
                after = requests[position + 1].at if not last else ends.get(generation, 1e18)
                before = requests[position - 1].at if position else -1e18
                if rows:
                    cause = None  # part of a round: no fault excuses that
                elif last:
                    cause = "in flight when its process was killed or stopped"
                elif any(e.start <= after and e.end >= request.at for e in storage):
                    cause = "its round's write met a storage fault"
                elif any(s <= request.at and e >= before for s, e in refusals):
                    cause = "refused: the clock had stepped back"
                elif request.took > TARGET_TIMEOUT / 2:
                    cause = "answered late (the collector may have given up)"
                else:
                    cause = None
                if cause is None:
                    lost.append(
                        {
                            "target": name,
                            "serial": request.serial,
                            "generation": generation,
                            "rows": rows,
                            "of": per,
                        }
                    )
                else:
                    excused[cause] += per - rows
                    refused_serials += cause.startswith("refused")
    return {
        "rows_expected": expected,
        "rows_stored": stored_rows,
        "rows_not_stored_excused": dict(excused),
        # Never more than the store counted in targets.samples_refused (one per target's
        # refused round), or the window excused a row the clock did not refuse.
        "serials_excused_as_refused": refused_serials,
        "rows_lost": sum(int(one["of"]) - int(one["rows"]) for one in lost),
        "lost_row_serials": lost[:20],
        "rows_stored_from_no_served_body": unknown,
    }


def account_notifications(session: Session, receiver: Receiver, threshold: float) -> dict[str, Any]:
    rows = session.scalars(select(NotificationRow).order_by(NotificationRow.id)).all()
    everything = session.scalars(select(AlertHistoryRow).order_by(AlertHistoryRow.id)).all()
    # The built-in rules (collector-stale, …) send to no channel: shown, not judged.
    others = Counter(f"{c.rule}: {c.after}" for c in everything if c.rule != RULE)
    history = [change for change in everything if change.rule == RULE]
    states = Counter(row.state for row in rows)
    due = [row for row in rows if row.state != "muted"]
    delivered = [row for row in due if receiver.acknowledged.get(_key(row), 0) > 0]
    dropped = [row for row in due if row.state in ("superseded", "expired")]
    lost = [
        row
        for row in due
        if receiver.acknowledged.get(_key(row), 0) == 0
        and row.state not in ("superseded", "expired")
    ]
    keys = {_key(row) for row in rows}
    # Each alert's news: the rows carrying it, oldest first.
    carrying: dict[str, list[NotificationRow]] = defaultdict(list)
    for row in due:
        for fingerprint in (row.alert_keys or row.fingerprint).split():
            carrying[fingerprint].append(row)
    firing_transitions: Counter[str] = Counter(c.fingerprint for c in history if c.after == FIRE)
    by_id = {row.id: row for row in rows}
    episodes = firing_episodes(history)
    news: Counter[str] = Counter()
    no_news: list[tuple[str, float, list[tuple[int, str, str | None]]]] = []
    for fingerprint, replica, began, ended in episodes:
        mine = episode_rows(rows, fingerprint, began, ended)
        firing = [row for row in mine if json.loads(row.notice).get("status") == FIRE]
        if any(receiver.acknowledged.get(_key(row), 0) for row in firing):
            news["firing delivered"] += 1
        elif firing and all(_dropped_by_design(row, by_id) for row in firing):
            news["superseded by its resolution, or muted when made"] += 1
        else:  # its firing never reached the receiver, and not by design
            no_news.append((replica, began, [(row.id, row.state, row.last_error) for row in mine]))
    # The newest news of each alert must have reached the receiver.
    for fingerprint, carried in carrying.items():
        if receiver.acknowledged.get(_key(carried[-1]), 0) == 0:
            newest = carried[-1]
            no_news.append((fingerprint, newest.created_at, [(newest.id, "newest", None)]))
    resolved_without_value = [
        (change.replica, change.ts)
        for change in history
        if change.before == "firing"
        and change.after == "resolved"
        and (change.value is None or change.value < threshold)
    ]
    # Resolved messages the receiver got for an alert the store never saw recover.
    recovered = {
        change.fingerprint
        for change in history
        if change.after == "resolved" and change.value is not None and change.value >= threshold
    }
    resolved_unexplained = sorted(
        {
            fingerprint
            for key, count in receiver.acknowledged.items()
            if count and receiver.statuses.get(key) == "resolved"
            for fingerprint in receiver.fingerprints.get(key, [])
            if fingerprint not in recovered
        }
    )
    return {
        "notifications": dict(states),
        "notifications_due": len(due),
        "delivered": len(delivered),
        "duplicated": sum(max(0, n - 1) for n in receiver.acknowledged.values()),
        "counted_possible_duplicates": sum(int(row.resends or 0) for row in rows),
        "dropped_superseded_or_expired": len(dropped),
        "lost": len(lost),
        "lost_rows": [
            (row.id, row.state, row.last_error, receiver.history.get(_key(row), [])) for row in lost
        ][:20],
        "deliveries_of_unknown_rows": len([k for k in receiver.acknowledged if k not in keys]),
        "firing_transitions": sum(firing_transitions.values()),
        "built_in_rule_transitions": dict(others),
        "firing_episodes": len(episodes),
        "firing_episodes_by_news": dict(news),
        "firing_alerts_without_news": no_news[:20],
        "silent_resolves": len(resolved_without_value),
        "resolved_sent_without_recovery": resolved_unexplained,
    }


def firing_episodes(history: list[AlertHistoryRow]) -> list[tuple[str, str, float, float]]:
    """(fingerprint, replica, start, end) of each time an alert began firing (from anything
    but firing) until it resolved (or the run's end)."""
    open_: dict[str, tuple[str, float]] = {}
    found: list[tuple[str, str, float, float]] = []
    for change in history:
        if change.after == FIRE and change.before != FIRE:
            open_[change.fingerprint] = (change.replica, change.ts)
        elif change.after != FIRE and change.fingerprint in open_:
            replica, began = open_.pop(change.fingerprint)
            found.append((change.fingerprint, replica, began, change.ts))
    found += [(fp, replica, began, math.inf) for fp, (replica, began) in open_.items()]
    return found


def episode_rows(
    rows: Sequence[NotificationRow], fingerprint: str, began: float, ended: float
) -> list[NotificationRow]:
    """The rows carrying an alert's news from when it began firing until it ended. A clock
    stepped back between the two gives the end an earlier time than the start (history is
    read in commit order, by id): the window never closes before it opens, so it always
    holds the firing row, made at `began`."""
    return [
        row
        for row in rows
        if fingerprint in (row.alert_keys or row.fingerprint).split()
        and began <= row.created_at <= max(began, ended)
    ]


def _dropped_by_design(row: NotificationRow, by_id: dict[int, NotificationRow]) -> bool:
    """A firing row not sent by design: muted when it was made (silenced or inhibited), or
    superseded by a newer row that is not itself muted (its resolution, or a newer firing)
    and was itself delivered or dropped by design. A firing superseded by a muted row was
    news that nobody got."""
    if row.state == "muted":
        return True
    if row.state != "superseded" or not (row.last_error or "").startswith("superseded by #"):
        return False
    newer = by_id.get(int((row.last_error or "").removeprefix("superseded by #")))
    if newer is None or newer.state not in ("sent", "superseded"):
        return False
    return newer.state == "sent" or _dropped_by_design(newer, by_id)


def recovery(
    fronts: dict[str, Front], stored: dict[str, Counter[int]], episodes: list[Episode]
) -> dict[str, float]:
    """Per kind of episode, the longest time from its end to the first request after it
    whose body was stored (the collector storing again)."""
    stored_at = sorted(
        r.at for name, front in fronts.items() for r in front.served if stored[name].get(r.serial)
    )
    longest: dict[str, float] = {}
    for one in episodes:
        after = next((at for at in stored_at if at >= one.end), None)
        if after is not None:
            longest[one.kind] = max(longest.get(one.kind, 0.0), round(after - one.end, 1))
    return longest


def report(
    sessions: sessionmaker[Session],
    fronts: dict[str, Front],
    receiver: Receiver,
    collector: Collector,
    watch: EvaluationWatch,
    episodes: list[Episode],
    flaps: Counter[str],
    outages: Counter[str],
    minutes: float,
) -> dict[str, Any]:
    with sessions() as session:
        stored = stored_serials(session)
        refused = int(session.scalar(select(func.sum(TargetRow.samples_refused))) or 0)
        integrity = session.connection().exec_driver_sql("PRAGMA integrity_check").scalar()
        notifications = account_notifications(session, receiver, 1.0)
    faults = Counter(e.kind for e in episodes)
    return {
        "minutes": minutes,
        "faults": {
            "collector_kills": collector.kills,
            "database_locks": faults["lock"],
            "disk_full": faults["disk"],
            "clock_steps_back": faults["clock-back"],
            "clock_steps_forward": faults["clock-forward"],
            "target_flaps": dict(flaps),
            "receiver_outages": dict(outages),
            "receiver_random_faults": dict(receiver.faults),
        },
        "episodes": [
            (e.kind, round(e.start, 1), round(e.end - e.start, 1), round(e.size, 1), e.detail)
            for e in episodes
        ],
        "collector_exits_unasked": collector.exits,
        "scrapes_served": sum(len(f.served) for f in fronts.values()),
        "scrapes_failed_by_fault": sum(len(f.requests) - len(f.served) for f in fronts.values()),
        **account_rows(fronts, stored, episodes, collector.ends),
        "samples_refused_recorded": refused,
        "integrity_check": integrity,
        **notifications,
        "longest_evaluation_gap_seconds": round(watch.longest, 1),
        "recovery_seconds_by_fault": recovery(fronts, stored, episodes),
    }


def recount(folder: Path) -> dict[str, Any]:
    """A kept run's notifications judged again by the rules above, from its database and
    the receiver's records in records.json."""
    records = json.loads((folder / "records.json").read_text())["receiver"]
    receiver = Receiver(random.Random(0))
    receiver.acknowledged.update(records["acknowledged"])
    receiver.statuses.update(records["statuses"])
    sessions = connect_store(f"sqlite:///{folder / 'chaos.db'}")
    with sessions() as session:
        for row in session.scalars(select(NotificationRow)):
            receiver.fingerprints[_key(row)] = (row.alert_keys or row.fingerprint).split()
        return account_notifications(session, receiver, 1.0)


def _key(row: NotificationRow) -> str:
    return f"kneepoint-{row.id}-{int(row.created_at * 1000)}"  # as alerts/outbox.py keys it


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--interval", type=float, default=5.0, help="scrape/evaluate seconds")
    parser.add_argument("--disk", choices=("auto", "tmpfs", "rlimit"), default="auto")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--dir", type=Path, help="keep the database and logs here")
    parser.add_argument("--recount", type=Path, help="judge a kept run's notifications again")
    args = parser.parse_args()
    if args.recount:
        print(json.dumps(recount(args.recount), indent=2, default=str))
        return
    folder = args.dir or Path(tempfile.mkdtemp(prefix="kneepoint-chaos-"))
    folder.mkdir(parents=True, exist_ok=True)
    figures = chaos(args.minutes, args.seed, folder, args.interval, args.disk)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print(f"database and collector log in {folder}", file=sys.stderr)


if __name__ == "__main__":
    main()
