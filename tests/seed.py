"""A seeded store for page tests: two replicas with an hour of scrapes, a GPU node, a dead one."""

from __future__ import annotations

import copy
from pathlib import Path

from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import parse_vllm
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets, record_failure, record_gpus, record_replica
from tests.conftest import DCGM_T4, VLLM_032, read


def seed(folder: Path, now: float, minutes: int = 60, base_url: str = "http://127.0.0.1:9") -> Path:
    """Write kneepoint.yaml and its database under `folder`; return the config path.

    The targets live under `base_url` at /a, /b, /down and /gpus, so a test can serve them."""
    config_file = folder / "kneepoint.yaml"
    config_file.write_text(f"""
database: sqlite:///{folder / "kneepoint.db"}
scrape_interval: 5s
targets:
  - {{name: replica-a, kind: vllm, url: "{base_url}/a", gpus: ["cp-bm14r7/0"], timeout: 2s}}
  - {{name: replica-b, kind: vllm, url: "{base_url}/b", timeout: 2s}}
  - {{name: replica-down, kind: vllm, url: "{base_url}/down", timeout: 2s}}
  - {{name: gpu-node, kind: dcgm, url: "{base_url}/gpus", timeout: 2s}}
""")
    config = load_config(config_file)
    sessions = open_store(config.database)
    base = parse_vllm(read(VLLM_032))
    gpus = parse_dcgm(read(DCGM_T4), default_host="gpu-node")
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for step in range(minutes * 4):
            ts = now - (minutes * 60) + step * 15
            for offset, name in enumerate(("replica-a", "replica-b")):
                sample = copy.deepcopy(base)
                sample.counters["generation_tokens"] = step * 900.0 * (offset + 1)
                sample.counters["prompt_tokens"] = step * 4000.0
                sample.gauges["kv_cache_usage"] = (step % 40) / 40
                sample.gauges["requests_running"] = float(step % 32)
                sample.gauges["requests_waiting"] = float(max(0, step % 40 - 30))
                record_replica(session, ids[name], ts, sample)
            record_gpus(session, ids["gpu-node"], ts, gpus)
        record_failure(session, ids["replica-down"], now - 5, "cannot connect: connection refused")
    return config_file
