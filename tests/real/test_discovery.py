"""Discovery through a real Prometheus (Debian's) that finds twin replicas by file-based
service discovery: targets added to and removed from its file while it runs become and stop
being kneepoint replicas, a removed one keeps its history, and GPUs are joined to replicas
by the `pod`/`namespace` labels of the twin's DCGM exposition (no `gpus:` lists); the
removed one is shown as gone in the status."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from collectors.discovery import with_discovered
from collectors.jobs import collect_round
from kneepoint.config import load_config
from kneepoint.status import build_status
from kneepoint.store import queries
from kneepoint.store.db import open_store
from kneepoint.store.models import RAW, TargetRow
from kneepoint.twin.fleet import Fleet, FleetSpec
from tests.conftest import migrated
from tests.real.prometheus_server import running_prometheus

pytestmark = [pytest.mark.real, pytest.mark.timeout(300)]
BOUND = 90.0  # seconds any one change may take to show (Prometheus's discovery is ~5 s)
NAMES = ("a", "b", "c")
SPEC = {
    "nodes": [{"name": "gpu-node-1", "gpus": ["l4", "l4", "l4"]}],
    "replicas": [
        {"name": name, "model": "qwen3-4b", "node": "gpu-node-1", "gpu_index": index}
        for index, name in enumerate(NAMES)
    ],
}


def until(what: str, check: Callable[[], bool], work: Callable[[], object] = lambda: None) -> None:
    """Do `work` until `check` holds; fail naming `what` after BOUND seconds."""
    deadline = time.monotonic() + BOUND
    while not check():
        assert time.monotonic() < deadline, f"not within {BOUND:.0f} s: {what}"
        work()
        time.sleep(0.5)


def prometheus_scrapes(url: str, job: str) -> set[str]:
    """The instances Prometheus scrapes for `job` now, healthy: its own truth."""
    data = httpx.get(f"{url}/api/v1/targets", params={"state": "active"}).json()["data"]
    return {
        t["labels"]["instance"]
        for t in data["activeTargets"]
        if t["labels"]["job"] == job and t["health"] == "up"
    }


def test_replicas_follow_prometheus_targets_and_gpus_join_by_pod(tmp_path: Path) -> None:
    fleet = Fleet(FleetSpec.model_validate(SPEC)).start()
    try:
        instance = {name: fleet.url(name).removeprefix("http://") for name in NAMES}
        pods = {name: fleet.nodes["gpu-node-1"].gpus[i].pod for i, name in enumerate(NAMES)}
        sd_file = tmp_path / "vllm.json"

        def serve(names: tuple[str, ...]) -> None:
            groups: list[dict[str, Any]] = [
                {"targets": [instance[n]], "labels": {"namespace": "inference", "pod": pods[n]}}
                for n in names
            ]
            sd_file.with_suffix(".tmp").write_text(json.dumps(groups))
            sd_file.with_suffix(".tmp").replace(sd_file)  # whole, as Prometheus must read it

        serve(("a", "b"))
        vllm_sd = {
            "job_name": "vllm",
            "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "1s"}],
        }
        node = fleet.url("gpu-node-1").removeprefix("http://")
        with running_prometheus(tmp_path / "prometheus", {"dcgm": [node]}, "1s", [vllm_sd]) as url:
            path = tmp_path / "kneepoint.yaml"
            path.write_text(
                f"database: sqlite:///{tmp_path / 'k.db'}\n"
                "scrape_interval: 1s\n"
                f"prometheus: {{url: '{url}', vllm_selector: '{{job=\"vllm\"}}', "
                "dcgm_selector: '{job=\"dcgm\"}'}\n"
                "discovery:\n  prometheus:\n"
                "    replicas: {jobs: [vllm], name: '{namespace}.{pod}'}\n"
                "    gpu_nodes: {jobs: [dcgm], name: 'dcgm-{instance}'}\n"
            )
            config = load_config(migrated(path))
            sessions = open_store(config.database)
            replica = {n: f"inference.{pods[n]}" for n in NAMES}

            def stored() -> dict[str, TargetRow]:
                with sessions() as session:
                    return queries.targets(session)

            def read(*names: str) -> bool:
                rows = stored()
                return all(
                    name in rows and rows[name].last_success_at is not None for name in names
                )

            def round_() -> None:
                collect_round(config, sessions)

            until(
                "Prometheus scrapes a and b",
                lambda: prometheus_scrapes(url, "vllm") == {instance["a"], instance["b"]},
            )
            until("kneepoint reads a and b", lambda: read(replica["a"], replica["b"]), round_)
            assert replica["c"] not in stored(), "c is not in Prometheus yet"

            serve(("b", "c"))  # c added, a removed
            until(
                "Prometheus scrapes b and c only",
                lambda: prometheus_scrapes(url, "vllm") == {instance["b"], instance["c"]},
            )
            until("kneepoint reads c", lambda: read(replica["c"]), round_)
            a_last = stored()[replica["a"]].last_scrape_at
            current = with_discovered(config)
            for _ in range(3):
                round_()

            def gone() -> list[str]:
                with sessions() as session:
                    found = build_status(session, current, time.time(), 600.0)["gone"]
                return [entry["name"] for entry in found]

            # a is shown as gone once it has not been read for a stale target's limit.
            until("a shows as gone", lambda: gone() == [replica["a"]], round_)
            now = time.time()
            with sessions() as session:
                status = build_status(session, current, now, 600.0)
                rows = queries.targets(session)
                history = queries.replica_frame(
                    session, 0.0, now, [rows[replica["a"]].id], coarsest=RAW
                )
    finally:
        fleet.stop()

    names = {t.name: t.kind for t in current.targets}
    assert names == {replica["b"]: "vllm", replica["c"]: "vllm", f"dcgm-{node}": "dcgm"}
    # The removed replica is no longer read, and its history stays in the store.
    assert rows[replica["a"]].last_scrape_at == a_last
    assert len(history) > 0
    assert [r["name"] for r in status["replicas"]] == [replica["b"], replica["c"]]
    assert [(g["name"], g["state"]) for g in status["gone"]] == [(replica["a"], "gone")]
    # Every GPU of the node is shown, joined to its replica by the pod label, and the one
    # whose pod is no longer a target is unassigned, not lost.
    by_pod = {g["pod"]: g["replica"] for g in status["gpus"]}
    assert by_pod == {pods["a"]: None, pods["b"]: replica["b"], pods["c"]: replica["c"]}
    for entry in status["replicas"]:
        assert entry["up"] is True, f"{entry['name']} is not up"
