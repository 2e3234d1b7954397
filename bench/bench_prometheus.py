"""Side by side with a real Prometheus: the same 50 fleet-twin targets (40 vLLM replicas,
10 dcgm-exporters with 4 GPUs each, light agent traffic) scraped by kneepoint's collector and
by Prometheus at the same interval for the same minutes.

    .venv/bin/python bench/bench_prometheus.py [--minutes 3] [--interval 5]

Prints CPU seconds per target-scrape and bytes stored per target-day for each, and their
ratios. kneepoint's CPU is its collection thread's (HTTP, parse, normalize, store; the twin
servers run in other threads); Prometheus's is its process's, from /proc. Storage:
kneepoint's database growth at full resolution (before rollups); Prometheus's chunk bytes
in a snapshot block of its head (index bytes, a per-block cost, reported apart).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collectors.collect import collect_once  # noqa: E402
from kneepoint.config import Config  # noqa: E402
from kneepoint.store.db import open_store  # noqa: E402
from kneepoint.twin.fleet import Fleet, FleetSpec  # noqa: E402
from kneepoint.twin.traffic import Group, Traffic  # noqa: E402
from tests.conftest import free_port  # noqa: E402

NODES, GPUS_PER_NODE = 10, 4


def fleet_spec() -> FleetSpec:
    nodes = [{"name": f"node-{n}", "gpus": ["l4"] * GPUS_PER_NODE} for n in range(NODES)]
    replicas = [
        {"name": f"replica-{n}-{g}", "model": "qwen3-4b", "node": f"node-{n}", "gpu_index": g}
        for n in range(NODES)
        for g in range(GPUS_PER_NODE)
    ]
    return FleetSpec.model_validate({"nodes": nodes, "replicas": replicas})


def directory_bytes(path: Path, pattern: str = "**/*") -> int:
    return sum(f.stat().st_size for f in path.glob(pattern) if f.is_file())


def process_cpu(pid: int) -> float:
    """A process's CPU seconds (user + system) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    binary = shutil.which("prometheus")
    if binary is None:
        sys.exit("no prometheus binary: apt-get install prometheus")
    fleet = Fleet(fleet_spec()).start()
    folder = Path(tempfile.mkdtemp(prefix="kneepoint-bench-prom-"))
    traffic = Traffic(
        [Group("Qwen/Qwen3-4B", [fleet.url(r.name) for r in fleet.spec.replicas], 10.0)],
        day_seconds=600,
    ).start()
    targets = fleet.targets()
    port = free_port()
    interval = f"{args.interval:g}s"
    jobs = {
        kind: [
            t.url.removeprefix("http://").removesuffix("/metrics")
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
        db_before = directory_bytes(folder, "k.db*")
        cpu_before, began = process_cpu(prometheus.pid), time.time()
        ours, rounds = 0.0, 0
        while time.time() - began < args.minutes * 60:
            started = time.thread_time()
            collect_once(settings, sessions)
            ours += time.thread_time() - started
            rounds += 1
            time.sleep(max(0.0, began + rounds * args.interval - time.time()))
        elapsed = time.time() - began
        theirs = process_cpu(prometheus.pid) - cpu_before
        with sessions() as session:
            session.connection().exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        db_bytes = directory_bytes(folder, "k.db*") - db_before
        snapshot = httpx.post(f"{url}/api/v1/admin/tsdb/snapshot").json()["data"]["name"]
        block = folder / "tsdb" / "snapshots" / snapshot
        chunk_bytes = directory_bytes(block, "*/chunks/*")
        index_bytes = directory_bytes(block, "*/index")
    finally:
        traffic.stop()
        prometheus.terminate()
        prometheus.wait()
        fleet.stop()
    scrapes = len(targets) * rounds
    prometheus_scrapes = len(targets) * elapsed / args.interval
    per_day = 86400 / elapsed / len(targets)
    ours_ms, theirs_ms = ours / scrapes * 1000, theirs / prometheus_scrapes * 1000
    print(f"{len(targets)} targets every {interval} for {elapsed / 60:.1f} min ({rounds} rounds)")
    print(
        f"CPU per target-scrape: kneepoint {ours_ms:.2f} ms, Prometheus {theirs_ms:.2f} ms "
        f"(ratio {ours_ms / theirs_ms:.1f}×)"
    )
    print(
        f"bytes per target-day at {interval}: kneepoint {db_bytes * per_day / 1e6:.2f} MB, "
        f"Prometheus {chunk_bytes * per_day / 1e6:.2f} MB of chunks "
        f"(ratio {db_bytes / chunk_bytes:.1f}×; its index, per block: {index_bytes / 1e6:.2f} MB)"
    )
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
