"""Kubernetes discovery end to end, for direct scraping: a local stand-in of the Kubernetes
API (no real API server can run here) lists pods that point at real twin replicas and a
twin dcgm-exporter; scrape rounds follow the pods added and removed between them, GPUs
join their replicas by dcgm-exporter's pod labels, `kneepoint report` and an alert
evaluation cover the discovered replicas, a removed replica is shown as gone with its
history kept, its GPU unassigned, and an API outage keeps the targets found."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

import alerts.evaluate  # the package: AppTest puts app/screens (alerts.py) first
from alerts.lifecycle import FIRING
from collectors.discovery import current
from collectors.jobs import collect_round
from kneepoint.cli import app
from kneepoint.config import load_config
from kneepoint.status import build_status, stale_after
from kneepoint.store import queries
from kneepoint.store.db import open_store
from kneepoint.store.models import RAW
from kneepoint.twin.fleet import Fleet, FleetSpec
from tests.collectors.kubernetes_api import KubernetesApi, kubeconfig, pod
from tests.conftest import migrated

OVERVIEW = Path(__file__).resolve().parents[2] / "app" / "screens" / "overview.py"
TOKEN = "kp-fleet-token-3d9e0c71"
NAMES = ("a", "b", "c")
SPEC = {
    "nodes": [{"name": "gpu-node-1", "gpus": ["l4", "l4", "l4"]}],
    "replicas": [
        {"name": name, "model": "qwen3-4b", "node": "gpu-node-1", "gpu_index": index}
        for index, name in enumerate(NAMES)
    ],
}


def port(url: str) -> int:
    found = urlsplit(url).port
    assert found is not None
    return found


def test_rounds_follow_the_pods_and_a_removed_replica_is_gone_with_its_history(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = Fleet(FleetSpec.model_validate(SPEC)).start()
    try:
        gpu_pods = {n: fleet.nodes["gpu-node-1"].gpus[i].pod for i, n in enumerate(NAMES)}
        # The twin's DCGM exposition labels each GPU with namespace `inference` and its pod.
        replica_pods = {
            n: pod(
                str(gpu_pods[n]),
                "inference",
                {"app": "vllm", "model": "qwen3-4b"},
                port(fleet.url(n)),
            )
            for n in NAMES
        }
        exporter = pod(
            "dcgm-exporter-x7k2p",
            "gpu-operator",
            {"app": "nvidia-dcgm-exporter"},
            port(fleet.url("gpu-node-1")),
            port_name="metrics",
        )
        with KubernetesApi(TOKEN) as api:
            api.pods = [replica_pods["a"], replica_pods["b"], exporter]
            path = tmp_path / "kneepoint.yaml"
            path.write_text(
                f"database: sqlite:///{tmp_path / 'k.db'}\n"
                "scrape_interval: 10s\n"
                "discovery:\n  kubernetes:\n"
                f"    kubeconfig: '{kubeconfig(tmp_path / 'kube.yaml', api.url, TOKEN)}'\n"
                "    replicas: {namespaces: [inference], selector: 'app=vllm', port: metrics,"
                " name: '{namespace}.{pod}'}\n"
                "    gpu_nodes: {namespaces: [gpu-operator], selector: 'app=nvidia-dcgm-exporter',"
                " port: metrics, name: 'dcgm-{node}'}\n"
                # A rule every replica with data breaks: it fires for each replica evaluated.
                "rules: [{name: kv-seen, metric: kv_cache_occupancy, op: '>=', threshold: 0,"
                " for: 0s, severity: info}]\n"
            )
            config = load_config(migrated(path))
            sessions = open_store(config.database)
            replica = {n: f"inference.{gpu_pods[n]}" for n in NAMES}
            # The rounds' own clock: a second apart, then a pause longer than a stale
            # target's limit before the last rounds (no waiting on the wall clock).
            # The rounds' own clock, in the recent past: a second apart, then a pause
            # longer than a stale target's limit before the last rounds, which end a few
            # seconds before now (no waiting on the wall clock).
            start, pause = time.time(), stale_after(config) + 30
            moments = iter(
                [start - pause, start - pause + 1, start - pause + 2, start - 3, start - 2]
            )
            clock_now = [next(moments)]

            def round_() -> dict[str, bool]:
                outcomes = collect_round(config, sessions, lambda: clock_now[0])
                return {o.target: o.ok for o in outcomes}

            first = round_()
            assert first == {replica["a"]: True, replica["b"]: True, "dcgm-gpu-node-1": True}
            clock_now[0] = next(moments)
            assert round_() == first
            api.pods = [replica_pods["b"], replica_pods["c"], exporter]  # c added, a removed
            clock_now[0] = next(moments)
            third = round_()
            assert third == {replica["b"]: True, replica["c"]: True, "dcgm-gpu-node-1": True}
            # `kneepoint report` and the alerts job's evaluation over the targets found now
            # (b and c; a removed, its rows still in the store).
            reported = CliRunner().invoke(
                app, ["report", "--config", str(path), "--out", str(tmp_path / "report")]
            )
            with sessions.begin() as session:
                evaluated = alerts.evaluate.evaluate_once(session, current(config), time.time())
            clock_now[0] = next(moments)
            api.stop()  # the API goes away: the targets found are kept
            with caplog.at_level(logging.WARNING):
                assert round_() == third
                clock_now[0] = next(moments)
                assert round_() == third
            now = time.time()
            with sessions() as session:
                rows = queries.targets(session)
                status = build_status(session, current(config), now, 600.0)
                history = queries.replica_frame(
                    session, 0.0, now, [rows[replica["a"]].id], coarsest=RAW
                )
            # `kneepoint status` and the app's overview see the discovered replicas and the
            # gone one too.
            result = CliRunner().invoke(app, ["status", "--json", "--config", str(path)])
            monkeypatch.setenv("KNEEPOINT_CONFIG", str(path))
            overview = AppTest.from_file(str(OVERVIEW), default_timeout=60).run()
    finally:
        fleet.stop()

    assert {auth for _, _, auth in api.requests} == {f"Bearer {TOKEN}"}
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("discovery")]
    assert len(warnings) == 1, warnings
    assert "cannot be read" in warnings[0] and "the 3 targets found before are kept" in warnings[0]
    assert TOKEN not in caplog.text
    # The removed replica was scraped twice, not since, and its samples stay.
    assert len(history) == 2
    assert [r["name"] for r in status["replicas"]] == [replica["b"], replica["c"]]
    assert all(r["up"] is True for r in status["replicas"])
    assert [(g["name"], g["kind"], g["state"]) for g in status["gone"]] == [
        (replica["a"], "replica", "gone")
    ]
    assert status["gone"][0]["gone_since"] == status["gone"][0]["last_success_at"]
    # GPUs joined by the DCGM exposition's pod labels; the gone pod's GPU unassigned, shown.
    by_pod = {g["pod"]: g["replica"] for g in status["gpus"]}
    assert by_pod == {gpu_pods["a"]: None, gpu_pods["b"]: replica["b"], gpu_pods["c"]: replica["c"]}
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert [r["name"] for r in shown["replicas"]] == [replica["b"], replica["c"]]
    assert [g["name"] for g in shown["gone"]] == [replica["a"]]
    assert not overview.exception and not overview.error
    assert reported.exit_code == 0, reported.output
    (summary,) = (tmp_path / "report").glob("kneepoint-report-*.md")
    sections = [line[3:] for line in summary.read_text().splitlines() if line.startswith("## ")]
    assert sorted(s for s in sections if s.startswith("inference.")) == [replica["b"], replica["c"]]
    assert sorted(
        c.alert.replica for c in evaluated if c.alert.rule == "kv-seen" and c.after == FIRING
    ) == [replica["b"], replica["c"]]
    assert [m.label for m in overview.metric].count("KV occupancy") == 2
    captions = [c.value for c in overview.caption]
    assert any(c.startswith("Gone, their history kept: " + replica["a"]) for c in captions)
