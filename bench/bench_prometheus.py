"""Side by side with a real Prometheus: the same fleet-twin targets (by default 50: 40 vLLM
replicas, 10 dcgm-exporters with 4 GPUs each, light agent traffic) scraped by kneepoint's
collector and by Prometheus at the same interval for the same minutes, each evaluating the
same rules.

    .venv/bin/python bench/bench_prometheus.py [--targets 50] [--minutes 3] [--interval 5]
        [--evaluation 15] [--sessions 10] [--live 8] [--source DIR] [--profile FILE]
        [--stages ROUNDS]

`--targets N`: a fifth of them dcgm-exporters, the rest vLLM replicas spread over their GPUs
(500: 100 nodes, 400 replicas). The twin (servers, engines, agent traffic: `--sessions`
concurrent agent sessions in all, so a large fleet is lightly loaded) runs in a child
process: `--live N` replicas (default 8; 0: all) are simulated and take the traffic, and the
others serve a copy of one of theirs, every body rendered at most once per interval and all
served from one event loop (CopyServer), so that 500 targets fit on 2 cores. kneepoint's
collector is `kneepoint collect` in its own process, every job of it running (scrape, alert
evaluation every `--evaluation` seconds, rollups, delivery, the cluster beat), with a config
of the twin's targets, the built-in rules and two SLOs; Prometheus gets the rules `kneepoint
alerts export` writes for that config, evaluated at the same interval. `--source DIR` runs
the collector (and the export) of another checkout, e.g. a `git worktree` of an older
commit, with this bench.

Prints CPU per target-scrape of each whole process tree (utime + stime of every process in
it, from /proc, over the measured span) and their ratio; the share of the collector's CPU
each job took (thread CPU clock around each job run) and the rest (the scheduler, job-health
records); bytes stored per target-day for each. Storage: kneepoint's database growth at full
resolution (before rollups); Prometheus's chunk bytes in a snapshot block of its head (index
bytes, a per-block cost, reported apart). `--profile FILE` writes a cProfile of the
collector's job runs (CPU time of their threads) to FILE after the run; `--stages ROUNDS`
then runs that many more rounds in this process, timing each stage of a collection round
(fetch, parse, normalize, store) on the thread's CPU clock.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import yaml
from aiohttp import web
from sqlalchemy.orm import Session, sessionmaker

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
SLOW = 120.0  # seconds for an answer of Prometheus's API: a loaded machine took over 5 s


def _source() -> Path:
    """--source DIR, read before the imports below so that they come from that tree."""
    for position, argument in enumerate(sys.argv):
        if argument == "--source" and position + 1 < len(sys.argv):
            return Path(sys.argv[position + 1]).resolve()
        if argument.startswith("--source="):
            return Path(argument.split("=", 1)[1]).resolve()
    return ROOT


SOURCE = _source()
sys.path[:0] = [str(SOURCE), str(BENCH)]

from collector_process import (  # noqa: E402
    job_cpu,
    kneepoint,
    start_collector,
    stop_collector,
    tree_cpu,
    wait_for_rows,
    write_config,
)

import collectors.collect  # noqa: E402
import collectors.dcgm  # noqa: E402
import collectors.engines.vllm  # noqa: E402
from collectors.collect import store_fetched  # noqa: E402
from collectors.scrape import fetch_all  # noqa: E402
from kneepoint.config import Config, load_config  # noqa: E402
from kneepoint.store.db import open_store  # noqa: E402
from kneepoint.twin.fleet import Fleet, FleetSpec  # noqa: E402
from kneepoint.twin.server import METRICS_TYPE, TwinServer  # noqa: E402
from kneepoint.twin.traffic import Group, Traffic  # noqa: E402
from tests.conftest import free_port  # noqa: E402

if TYPE_CHECKING:
    from multiprocessing.connection import Connection


def fleet_spec(targets: int = 50) -> FleetSpec:
    """`targets` twin targets: a fifth GPU nodes (dcgm-exporters), the rest vLLM replicas,
    one per GPU, spread evenly over the nodes."""
    if targets < 2:
        raise ValueError("--targets must be at least 2 (a replica and its GPU node)")
    node_count = max(1, targets // 5)
    replica_count = targets - node_count
    per_node = math.ceil(replica_count / node_count)
    nodes = [{"name": f"node-{n}", "gpus": ["l4"] * per_node} for n in range(node_count)]
    replicas = [
        {
            "name": f"replica-{i // per_node}-{i % per_node}",
            "model": "qwen3-4b",
            "node": f"node-{i // per_node}",
            "gpu_index": i % per_node,
        }
        for i in range(replica_count)
    ]
    return FleetSpec.model_validate({"nodes": nodes, "replicas": replicas})


def serve_twin(
    targets: int, sessions: float, pipe: Connection, live: int = 0, interval: float = 5.0
) -> None:
    """The child process: the twin fleet and its traffic, until the parent says stop. With
    `live` (0: all), only that many replicas are simulated and take the traffic; the others
    serve a copy of one of theirs (serve_copies)."""
    fleet = Fleet(fleet_spec(targets))
    names = [r.name for r in fleet.spec.replicas]
    simulated = names if live <= 0 or live >= len(names) else names[:live]
    for name in simulated:
        fleet.replicas[name].start()
        fleet.servers[name] = TwinServer(fleet.replicas[name], fleet.spec.host, 0).start()
    if simulated == names:  # every target served by its own twin server, as before
        for node in fleet.spec.nodes:
            fleet.servers[node.name] = TwinServer(
                fleet.nodes[node.name], fleet.spec.host, 0
            ).start()
        fleet._sampler.start()
        served: list[tuple[str, str, str, list[str]]] = [
            (t.name, t.kind, t.url.reveal(), t.gpus) for t in fleet.targets()
        ]
        copies = None
    else:
        fleet._sampler.start()
        copies = CopyServer(fleet, simulated, interval).start()
        served = copies.targets()
    traffic = Traffic(
        [Group("Qwen/Qwen3-4B", [fleet.url(name) for name in simulated], sessions)],
        day_seconds=600,
    ).start()
    pipe.send(served)
    pipe.recv()  # stop
    traffic.stop()
    if copies is not None:
        copies.stop()
    for server in fleet.servers.values():
        server.stop()
    for name in simulated:  # the others' threads never started
        fleet.replicas[name].stop()


class CopyServer:
    """Every target of a large twin fleet on one aiohttp event loop (a listening socket per
    target, so each has its own address as before), its body rendered at most once per
    `interval` and shared by both scrapers: rendering a twin replica's vLLM exposition costs
    tens of milliseconds, so 400 replicas scraped by kneepoint and Prometheus every 5 s
    rendered live took more than these 2 cores (their scrapes timed out). Replica i serves
    the body of simulated replica i mod len(simulated); each GPU node renders its own."""

    def __init__(self, fleet: Fleet, simulated: list[str], interval: float) -> None:
        self.fleet, self.interval = fleet, interval
        self.sources: dict[str, Callable[[], bytes]] = {}
        replicas = fleet.spec.replicas
        for index, spec in enumerate(replicas):
            twin = fleet.replicas[simulated[index % len(simulated)]]
            self.sources[spec.name] = twin.metrics
        for node in fleet.spec.nodes:
            self.sources[node.name] = fleet.nodes[node.name].render
        self.rendered: dict[Callable[[], bytes], tuple[float, bytes]] = {}
        self.ports: dict[int, str] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="copies", daemon=True)
        self.runner: web.AppRunner | None = None

    def body(self, name: str) -> bytes:
        source = self.sources[name]
        at, body = self.rendered.get(source, (-math.inf, b""))
        if time.monotonic() - at >= self.interval:
            body = source()
            self.rendered[source] = (time.monotonic(), body)
        return body

    async def metrics(self, request: web.Request) -> web.Response:
        port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
        return web.Response(
            body=self.body(self.ports[port]), headers={"Content-Type": METRICS_TYPE}
        )

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        for name in self.sources:
            sock = socket.create_server((self.fleet.spec.host, 0), backlog=256)
            self.ports[sock.getsockname()[1]] = name
            await web.SockSite(self.runner, sock).start()

    def start(self) -> CopyServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result()
        return self

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def targets(self) -> list[tuple[str, str, str, list[str]]]:
        """(name, kind, url, gpus) of every target, as Fleet.targets gives them."""
        urls = {name: f"http://{self.fleet.spec.host}:{port}/metrics" for port, name in
                self.ports.items()}  # fmt: skip
        return [
            (spec.name, spec.engine, urls[spec.name], [f"{spec.node}/{spec.gpu_index}"])
            for spec in self.fleet.spec.replicas
        ] + [(node.name, "dcgm", urls[node.name], []) for node in self.fleet.spec.nodes]


def directory_bytes(path: Path, pattern: str = "**/*") -> int:
    return sum(f.stat().st_size for f in path.glob(pattern) if f.is_file())


def process_cpu(pid: int) -> float:
    """A process's CPU seconds (user + system) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stages(config: Config, sessions: sessionmaker[Session], rounds: int, interval: float) -> str:
    """`rounds` more rounds, with the collection thread's CPU seconds in each stage: fetch
    (scrape.fetch_all), parse (parse_exposition), normalize (the rest of normalizing), store
    (store_fetched less normalizing); per target-scrape, in ms."""
    spent = dict.fromkeys(("fetch", "parse", "normalize", "store"), 0.0)
    originals: list[tuple[object, str, object]] = []

    def timed(module: object, name: str, stage: str) -> None:
        original = getattr(module, name)

        def wrapper(*args: object, **kwargs: object) -> object:
            began = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                spent[stage] += time.thread_time() - began

        originals.append((module, name, original))
        setattr(module, name, wrapper)

    timed(collectors.engines.vllm, "parse_exposition", "parse")
    timed(collectors.dcgm, "parse_exposition", "parse")
    timed(collectors.collect, "normalize", "normalize")
    try:
        for _ in range(rounds):
            time.sleep(interval)
            began = time.thread_time()
            fetched = fetch_all(list(config.targets))
            middle = time.thread_time()
            store_fetched(fetched, sessions)
            spent["fetch"] += middle - began
            spent["store"] += time.thread_time() - middle
    finally:
        for module, name, original in originals:
            setattr(module, name, original)
    spent["store"] -= spent["normalize"]
    spent["normalize"] -= spent["parse"]
    scrapes = len(config.targets) * rounds
    shares = ", ".join(f"{stage} {value / scrapes * 1000:.3f}" for stage, value in spent.items())
    return f"stages, ms per target-scrape over {rounds} more rounds: {shares}"


def _gist(error: str) -> str:
    """An error without the target's address, so that one reason counts once."""
    return re.sub(r"https?://\S+", "URL", error)[:120]


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def stored_scrapes(database: Path, since: float, until: float) -> tuple[int, int, Counter[str]]:
    """Target-scrapes the collector stored in [since, until): replica samples plus node
    (dcgm) scrapes, and the scrape errors it recorded, by their gist."""
    import sqlite3

    with sqlite3.connect(database, timeout=30) as connection:
        replicas = connection.execute(
            "SELECT count(*) FROM replica_samples WHERE ts >= ? AND ts < ?", (since, until)
        ).fetchone()[0]
        nodes = connection.execute(
            "SELECT count(*) FROM (SELECT DISTINCT g.target_id, s.ts FROM gpu_samples s "
            "JOIN gpus g ON g.id = s.gpu_id WHERE s.ts >= ? AND s.ts < ?)",
            (since, until),
        ).fetchone()[0]
        errors = connection.execute(
            "SELECT error FROM scrape_errors WHERE ts >= ? AND ts < ?", (since, until)
        ).fetchall()
    return replicas + nodes, len(errors), Counter(_gist(e) for (e,) in errors)


def checkpoint(database: Path) -> None:
    """Fold the WAL into the database file, so that its size is the data's."""
    import sqlite3

    with sqlite3.connect(database, timeout=30) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")


@dataclass
class Collector:
    """One collector under measurement: its checkout, folder, process and what it spent."""

    source: Path
    folder: Path
    process: subprocess.Popen[bytes] | None = None
    jobs_before: dict[str, Any] = field(default_factory=dict)
    jobs_after: dict[str, Any] = field(default_factory=dict)
    cpu_before: float = 0.0
    cpu: float = 0.0
    db_before: int = 0
    db_bytes: int = 0
    stored: int = 0
    failed: int = 0
    why: Counter[str] = field(default_factory=Counter)

    @property
    def database(self) -> Path:
        return self.folder / "k.db"

    @property
    def jobs_file(self) -> Path:
        return self.folder / "jobs.json"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--evaluation", type=float, default=15.0, help="rule evaluation, s")
    parser.add_argument("--targets", type=int, default=50)
    parser.add_argument("--sessions", type=float, default=10.0)
    parser.add_argument(
        "--live", type=int, default=8, help="replicas simulated (0: all); the rest serve copies"
    )
    parser.add_argument(
        "--source",
        type=Path,
        action="append",
        help="a collector's checkout (repeat: each runs at once, side by side)",
    )
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--stages", type=int, default=0, help="rounds timed stage by stage")
    args = parser.parse_args()
    binary = shutil.which("prometheus")
    if binary is None:
        sys.exit("no prometheus binary: apt-get install prometheus")
    ours_end, twin_end = multiprocessing.get_context("fork").Pipe()
    twin = multiprocessing.get_context("fork").Process(
        target=serve_twin,
        args=(args.targets, args.sessions, twin_end, args.live, args.interval),
        daemon=True,
    )
    twin.start()
    twin_targets = ours_end.recv()
    folder = Path(tempfile.mkdtemp(prefix="kneepoint-bench-prom-"))
    sources = [path.resolve() for path in args.source or [ROOT]]
    collectors = [
        Collector(source, folder if len(sources) == 1 else folder / f"collector-{n}")
        for n, source in enumerate(sources)
    ]
    for collector in collectors:
        collector.folder.mkdir(exist_ok=True)
        config_file = write_config(collector.folder, twin_targets, args.interval, args.evaluation)
        kneepoint(collector.source, "migrate", "--config", str(config_file))
    # The rules Prometheus evaluates: those the first checkout exports.
    config_file = collectors[0].folder / "kneepoint.yaml"
    rules = kneepoint(sources[0], "alerts", "export", "--format", "prometheus", "--config",
                      str(config_file))  # fmt: skip
    (folder / "rules.yml").write_text(rules)
    rule_count = sum(len(group.get("rules", [])) for group in yaml.safe_load(rules)["groups"])
    settings = load_config(config_file)
    port = free_port()
    interval = f"{args.interval:g}s"
    jobs = {
        kind: [
            url.removeprefix("http://").removesuffix("/metrics")
            for _name, target_kind, url, _gpus in twin_targets
            if target_kind == kind
        ]
        for kind in ("vllm", "dcgm")
    }
    config = {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": f"{args.evaluation:g}s",
        },
        "rule_files": [str(folder / "rules.yml")],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": hosts}]} for job, hosts in jobs.items()
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    prometheus = subprocess.Popen(
        [
            binary,
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-admin-api",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for n, collector in enumerate(collectors):
        collector.process = start_collector(
            collector.source,
            collector.folder / "kneepoint.yaml",
            collector.jobs_file,
            profile=args.profile if n == 0 else None,
        )
    try:
        while not ready(url):
            time.sleep(0.5)
        # Targets known, tables warm: a round's worth of replica samples stored (the first
        # rounds of a large fleet on a loaded machine can time out: minutes, not seconds).
        for collector in collectors:
            wait_for_rows(collector.database, len(jobs["vllm"]), timeout=600)
        time.sleep(args.interval * 2)  # both have scraped every target; rules evaluated
        loaded = httpx.get(f"{url}/api/v1/rules", timeout=SLOW).json()["data"]["groups"]
        prometheus_rules = sum(len(group["rules"]) for group in loaded)
        for collector in collectors:
            # Measured as after the run: a WAL file counted before and truncated after made
            # the growth of a short run negative.
            checkpoint(collector.database)
            collector.db_before = directory_bytes(collector.folder, "k.db*")
            assert collector.process is not None
            collector.jobs_before = job_cpu(collector.process, collector.jobs_file)
        began = time.time()
        theirs_before = tree_cpu(prometheus.pid)
        for collector in collectors:
            assert collector.process is not None
            collector.cpu_before = tree_cpu(collector.process.pid)
        time.sleep(args.minutes * 60)
        theirs = tree_cpu(prometheus.pid) - theirs_before
        for collector in collectors:
            assert collector.process is not None
            collector.cpu = tree_cpu(collector.process.pid) - collector.cpu_before
        elapsed = time.time() - began
        for collector in collectors:
            assert collector.process is not None
            collector.jobs_after = job_cpu(collector.process, collector.jobs_file)
        up = httpx.get(f"{url}/api/v1/query", params={"query": "sum(up)"}, timeout=SLOW).json()
        prometheus_up = float(up["data"]["result"][0]["value"][1])
        evaluations = sum(
            float(line.rsplit(" ", 1)[1])
            for line in httpx.get(f"{url}/metrics", timeout=SLOW).text.splitlines()
            if line.startswith("prometheus_rule_group_iterations_total{")
        )
        for collector in collectors:
            assert collector.process is not None
            stop_collector(collector.process, collector.jobs_file)
            collector.stored, collector.failed, collector.why = stored_scrapes(
                collector.database, began, began + elapsed
            )
            checkpoint(collector.database)
            collector.db_bytes = directory_bytes(collector.folder, "k.db*") - collector.db_before
        sessions = open_store(settings.database)
        breakdown = stages(settings, sessions, args.stages, args.interval) if args.stages else ""
        snapshot = httpx.post(f"{url}/api/v1/admin/tsdb/snapshot", timeout=SLOW).json()["data"][
            "name"
        ]
        block = folder / "tsdb" / "snapshots" / snapshot
        chunk_bytes = directory_bytes(block, "*/chunks/*")
        index_bytes = directory_bytes(block, "*/index")
    finally:
        for collector in collectors:
            if collector.process is not None and collector.process.poll() is None:
                stop_collector(collector.process, collector.jobs_file)
        prometheus.terminate()
        prometheus.wait()
        ours_end.send("stop")
        twin.join(timeout=30)
        if sys.exc_info()[0] is not None:  # failed: nothing to print, leave no folder
            shutil.rmtree(folder, ignore_errors=True)
    targets = len(twin_targets)
    scrapes = targets * elapsed / args.interval  # each scheduled every interval
    theirs_ms = theirs / scrapes * 1000
    for collector in collectors:
        if len(collectors) > 1:
            print(f"== the collector of {collector.source} ==")
        report(collector, args, targets, elapsed, scrapes, theirs_ms, prometheus_up)
        if collector is collectors[0]:
            print(
                f"rules: kneepoint's built-in rules and {len(settings.slos)} SLOs evaluated "
                f"every {args.evaluation:g}s; Prometheus: the {rule_count} rules `kneepoint "
                f"alerts export` wrote ({prometheus_rules} loaded, {evaluations:g} group "
                "evaluations since its start)"
            )
        per_day = 86400 / elapsed / targets
        print(
            f"bytes per target-day at {interval}: kneepoint "
            f"{collector.db_bytes * per_day / 1e6:.2f} MB, Prometheus "
            f"{chunk_bytes * per_day / 1e6:.2f} MB of chunks (ratio "
            f"{collector.db_bytes / chunk_bytes:.1f}×; its index, per block: "
            f"{index_bytes / 1e6:.2f} MB)"
        )
        if collector.why:
            print(
                "kneepoint's failed scrapes:",
                "; ".join(f"{n}× {w}" for w, n in collector.why.most_common(3)),
            )
    if breakdown:
        print(breakdown)
    shutil.rmtree(folder, ignore_errors=True)


def report(
    collector: Collector,
    args: argparse.Namespace,
    targets: int,
    elapsed: float,
    scrapes: float,
    theirs_ms: float,
    prometheus_up: float,
) -> None:
    """One collector's lines: scrapes, CPU against Prometheus, each job's share."""
    interval = f"{args.interval:g}s"
    ours = collector.cpu
    ours_ms = ours / scrapes * 1000
    print(
        f"{targets} targets every {interval} for {elapsed / 60:.1f} min "
        f"({round(elapsed / args.interval)} rounds); kneepoint: {collector.failed} failed "
        f"target-scrapes, Prometheus: {prometheus_up:g} targets up"
    )
    print(f"kneepoint stored {collector.stored} target-scrapes in the measured span")
    # Both figures are each whole process tree's, from /proc (the line's last part says so
    # in the words the README and tests/test_benches.py have read since it was the thread's).
    print(
        f"CPU per target-scrape: kneepoint {ours_ms:.2f} ms, Prometheus {theirs_ms:.2f} ms "
        f"(ratio {ours_ms / theirs_ms:.2f}×; kneepoint's whole process: {ours_ms:.2f} ms)"
    )
    before, after = collector.jobs_before, collector.jobs_after
    spent = {job: after["cpu"].get(job, 0.0) - before["cpu"].get(job, 0.0) for job in after["cpu"]}
    runs = {job: after["runs"].get(job, 0) - before["runs"].get(job, 0) for job in after["runs"]}
    if ours > 0 and spent:
        shares = [
            f"{job} {seconds / ours:.0%} ({seconds / scrapes * 1000:.3f} ms, {runs[job]} runs)"
            for job, seconds in sorted(spent.items(), key=lambda item: -item[1])
        ]
        rest = ours - sum(spent.values())
        shares.append(f"the rest {rest / ours:.0%} ({rest / scrapes * 1000:.3f} ms)")
        print("kneepoint's CPU by job, per target-scrape:", "; ".join(shares))
    if "gc" in after:  # Python's cyclic garbage collector, within the jobs' time above
        collected = [
            (done - begun, n_done - n_begun)
            for done, begun, n_done, n_begun in zip(
                after["gc"], before["gc"], after["gc_runs"], before["gc_runs"], strict=True
            )
        ]
        print(
            "of which Python's garbage collector: "
            + "; ".join(
                f"generation {g} {seconds / ours:.1%} ({n} runs)"
                for g, (seconds, n) in enumerate(collected)
            )
        )


if __name__ == "__main__":
    main()
