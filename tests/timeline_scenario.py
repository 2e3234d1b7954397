"""A twin replica's history with every change the timeline must show once: restarted,
reconfigured (fewer GPU memory, an FP8 KV cache: blocks and dtype), upgraded (its
exposition switched to another vLLM generation), given an XID and throttled, each at a
known round. Its scrapes are rendered by the twin (kneepoint/twin) and normalized and
stored by the collector's own code (collectors.collect.store_fetched), on a test clock.

Used by tests/kneepoint/test_timeline.py (events, CLI, alert message) and
tests/real/test_timeline_browser.py (the chart markers in Chromium)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from collectors.collect import store_fetched
from collectors.scrape import Fetched
from kneepoint.config import Config
from kneepoint.store.db import open_store
from kneepoint.twin.dcgm import GpuNode, GpuState
from kneepoint.twin.exposition import Snapshot, render
from kneepoint.twin.profiles import gpu, model
from kneepoint.twin.simulated_engine import Engine, EngineConfig

STEP = 15.0
RESTART, RECONFIGURE, UPGRADE, XID, THROTTLE, FIRE = 40, 80, 120, 140, 160, 170  # rounds
ROUNDS = (RESTART, RECONFIGURE, UPGRADE, XID, THROTTLE, FIRE)
XID_CODE = 79
HW_THERMAL, SW_POWER_CAP = 0x40, 0x4
REPLICA = "r1"


@dataclass
class TwinReplica:
    """A twin vLLM engine stepped by the test, and the GPU it runs on."""

    config: EngineConfig
    version: str = "0.32"

    def __post_init__(self) -> None:
        self.engine = Engine(self.config)
        self.node = GpuNode("node1", [GpuState(0, self.config.gpu, memory_fraction=0.9)])

    def work(self) -> None:
        for _ in range(2):
            self.engine.add(list(range(256)), 16)
        while not self.engine.idle:
            self.engine.step()

    def scrape(self) -> str:
        snapshot = Snapshot(self.engine, "qwen3-4b", 0.0, self.config.gpu_memory_utilization)
        return render(snapshot, self.version).decode()


def write_config(folder: Path) -> Path:
    """kneepoint.yaml for the replica (its GPU is node1/0) and an alert rule with a channel
    (nothing listens at its addresses: the stored history is all there is)."""
    path = folder / "kneepoint.yaml"
    path.write_text(
        f"database: sqlite:///{folder / 'k.db'}\n"
        "targets:\n"
        f"  - {{name: {REPLICA}, kind: vllm, url: 'http://127.0.0.1:9/metrics', gpus: [node1/0]}}\n"
        "  - {name: node1, kind: dcgm, url: 'http://127.0.0.1:9/dcgm'}\n"
        "channels:\n  - {name: ops, type: slack, url: 'http://127.0.0.1:9/hook'}\n"
        "rules:\n"
        "  - {name: kv-high, metric: kv_cache_occupancy, op: '>', threshold: 0.5,"
        " severity: page, channels: [ops]}\n"
    )
    return path


def store_history(config: Config, start: float) -> dict[int, float]:
    """Store rounds 0..FIRE, STEP seconds apart from `start`; return each change's time by
    its round."""
    sessions = open_store(config.database)
    replica = TwinReplica(EngineConfig(gpu("l4"), model("qwen3-4b")))
    for k in range(FIRE + 1):
        if k == RESTART:
            replica.engine = Engine(replica.config)
        if k == RECONFIGURE:  # a new process: less GPU memory, an FP8 KV cache
            replica.config = replace(replica.config, gpu_memory_utilization=0.8, fp8_kv_cache=True)
            replica.engine = Engine(replica.config)
        if k == UPGRADE:  # the same engine's exposition as another vLLM generation
            replica.version = "0.10"
        if k == XID:
            replica.node.gpus[0].xid = XID_CODE
        if k == THROTTLE:
            replica.node.gpus[0].clock_events = HW_THERMAL | SW_POWER_CAP
        replica.work()
        replica.node.sample(STEP)
        ts = start + k * STEP
        fetched = [
            Fetched(config.target(REPLICA), ts, 0.01, replica.scrape(), None),
            Fetched(config.target("node1"), ts, 0.01, replica.node.render().decode(), None),
        ]
        outcomes = store_fetched(fetched, sessions)
        assert all(outcome.ok for outcome in outcomes), outcomes
    return {k: start + k * STEP for k in ROUNDS}


def expected(at: dict[int, float]) -> set[tuple[str, float]]:
    """Each change the history holds: (kind, time), each exactly once."""
    return {
        ("restart", at[RESTART]),
        ("restart", at[RECONFIGURE]),  # a new configuration is a new process
        ("config_change", at[RECONFIGURE]),
        ("upgrade", at[UPGRADE]),
        ("gpu_xid", at[XID]),
        ("gpu_throttle", at[THROTTLE]),
        ("gpu_power_cap", at[THROTTLE]),
    }
