"""Side by side with a real Prometheus: the same fleet-twin targets (by default 50: 40 vLLM
replicas, 10 dcgm-exporters with 4 GPUs each, light agent traffic) scraped by kneepoint's
collector and by Prometheus at the same interval for the same minutes.

    .venv/bin/python bench/bench_prometheus.py [--targets 50] [--minutes 3] [--interval 5]
        [--sessions 10] [--profile FILE] [--stages ROUNDS]

`--targets N`: a fifth of them dcgm-exporters, the rest vLLM replicas spread over their GPUs
(500: 100 nodes, 400 replicas). The twin (servers, engines, agent traffic: `--sessions`
concurrent agent sessions in all, so a large fleet is lightly loaded) runs in a child
process, so kneepoint's process holds nothing but the collector.

Prints CPU seconds per target-scrape and bytes stored per target-day for each, and their
ratios. kneepoint's CPU is its collection thread's (HTTP, parse, normalize, store), with its
whole process's beside it; Prometheus's is its process's, from /proc. Storage: kneepoint's
database growth at full resolution (before rollups); Prometheus's chunk bytes in a snapshot
block of its head (index bytes, a per-block cost, reported apart). `--profile FILE` writes a
cProfile of kneepoint's rounds (CPU time of the thread, not wall time) to FILE after the run;
`--stages ROUNDS` runs that many more rounds after the side by side, timing each stage (fetch,
parse, normalize, store) on the collection thread's CPU clock.
"""

from __future__ import annotations

import argparse
import cProfile
import math
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import yaml
from sqlalchemy.orm import Session, sessionmaker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import collectors.collect  # noqa: E402
import collectors.dcgm  # noqa: E402
import collectors.vllm  # noqa: E402
from collectors.collect import collect_once, store_fetched  # noqa: E402
from collectors.scrape import fetch_all  # noqa: E402
from kneepoint.config import Config, Target  # noqa: E402
from kneepoint.secrets import SecretURL  # noqa: E402
from kneepoint.store.db import open_store  # noqa: E402
from kneepoint.twin.fleet import Fleet, FleetSpec  # noqa: E402
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


def serve_twin(targets: int, sessions: float, pipe: Connection) -> None:
    """The child process: the twin fleet and its traffic, until the parent says stop."""
    fleet = Fleet(fleet_spec(targets)).start()
    traffic = Traffic(
        [Group("Qwen/Qwen3-4B", [fleet.url(r.name) for r in fleet.spec.replicas], sessions)],
        day_seconds=600,
    ).start()
    pipe.send([(t.name, t.kind, t.url.reveal(), t.gpus) for t in fleet.targets()])
    pipe.recv()  # stop
    traffic.stop()
    fleet.stop()


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

    timed(collectors.vllm, "parse_exposition", "parse")
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--targets", type=int, default=50)
    parser.add_argument("--sessions", type=float, default=10.0)
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--stages", type=int, default=0, help="rounds timed stage by stage")
    args = parser.parse_args()
    binary = shutil.which("prometheus")
    if binary is None:
        sys.exit("no prometheus binary: apt-get install prometheus")
    ours_end, twin_end = multiprocessing.get_context("fork").Pipe()
    twin = multiprocessing.get_context("fork").Process(
        target=serve_twin, args=(args.targets, args.sessions, twin_end), daemon=True
    )
    twin.start()
    targets = [
        Target(name=name, kind=kind, url=SecretURL(url), gpus=gpus)
        for name, kind, url, gpus in ours_end.recv()
    ]
    folder = Path(tempfile.mkdtemp(prefix="kneepoint-bench-prom-"))
    port = free_port()
    interval = f"{args.interval:g}s"
    jobs = {
        kind: [
            t.url.reveal().removeprefix("http://").removesuffix("/metrics")
            for t in targets
            if t.kind == kind
        ]
        for kind in ("vllm", "dcgm")
    }
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
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
    try:
        while not ready(url):
            time.sleep(0.5)
        settings = Config(database=f"sqlite:///{folder / 'k.db'}", targets=targets)
        sessions = open_store(settings.database)
        collect_once(settings, sessions)  # targets known, tables warm
        time.sleep(args.interval * 2)  # Prometheus has scraped every target once
        # Measured as after the run: a WAL file counted before and truncated after made the
        # growth of a short run negative.
        with sessions() as session:
            session.connection().exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        db_before = directory_bytes(folder, "k.db*")
        profile = cProfile.Profile(time.thread_time) if args.profile else None
        cpu_before, began = process_cpu(prometheus.pid), time.time()
        own_before = process_cpu(os.getpid())
        ours, rounds, failed = 0.0, 0, 0
        why: Counter[str] = Counter()
        while time.time() - began < args.minutes * 60:
            started = time.thread_time()
            if profile is not None:
                profile.enable()
            outcomes = collect_once(settings, sessions)
            if profile is not None:
                profile.disable()
            ours += time.thread_time() - started
            failed += sum(not outcome.ok for outcome in outcomes)
            why.update(_gist(o.error) for o in outcomes if o.error is not None)
            rounds += 1
            time.sleep(max(0.0, began + rounds * args.interval - time.time()))
        elapsed = time.time() - began
        theirs = process_cpu(prometheus.pid) - cpu_before
        own_process = process_cpu(os.getpid()) - own_before
        up = httpx.get(f"{url}/api/v1/query", params={"query": "sum(up)"}).json()
        prometheus_up = float(up["data"]["result"][0]["value"][1])
        with sessions() as session:
            session.connection().exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        db_bytes = directory_bytes(folder, "k.db*") - db_before
        breakdown = stages(settings, sessions, args.stages, args.interval) if args.stages else ""
        snapshot = httpx.post(f"{url}/api/v1/admin/tsdb/snapshot").json()["data"]["name"]
        block = folder / "tsdb" / "snapshots" / snapshot
        chunk_bytes = directory_bytes(block, "*/chunks/*")
        index_bytes = directory_bytes(block, "*/index")
    finally:
        prometheus.terminate()
        prometheus.wait()
        ours_end.send("stop")
        twin.join(timeout=30)
    scrapes = len(targets) * rounds
    prometheus_scrapes = len(targets) * elapsed / args.interval
    per_day = 86400 / elapsed / len(targets)
    ours_ms, theirs_ms = ours / scrapes * 1000, theirs / prometheus_scrapes * 1000
    print(
        f"{len(targets)} targets every {interval} for {elapsed / 60:.1f} min ({rounds} rounds); "
        f"kneepoint: {failed} failed target-scrapes, Prometheus: {prometheus_up:g} targets up"
    )
    print(
        f"CPU per target-scrape: kneepoint {ours_ms:.2f} ms, Prometheus {theirs_ms:.2f} ms "
        f"(ratio {ours_ms / theirs_ms:.2f}×; kneepoint's whole process: "
        f"{own_process / scrapes * 1000:.2f} ms)"
    )
    print(
        f"bytes per target-day at {interval}: kneepoint {db_bytes * per_day / 1e6:.2f} MB, "
        f"Prometheus {chunk_bytes * per_day / 1e6:.2f} MB of chunks "
        f"(ratio {db_bytes / chunk_bytes:.1f}×; its index, per block: {index_bytes / 1e6:.2f} MB)"
    )
    if why:
        print("kneepoint's failed scrapes:", "; ".join(f"{n}× {w}" for w, n in why.most_common(3)))
    if breakdown:
        print(breakdown)
    shutil.rmtree(folder, ignore_errors=True)
    if profile is not None:
        profile.dump_stats(args.profile)


if __name__ == "__main__":
    main()
