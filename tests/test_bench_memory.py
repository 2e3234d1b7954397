"""bench/bench_memory.py's summary figures and the `docker run` it gives compose's and the
Helm chart's collector."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_memory import HELM_POD, container_run, floors, slope_per_hour  # noqa: E402


def test_floors_are_each_blocks_smallest_sample_in_time_order() -> None:
    # A trim's dip inside a block is its floor, whatever the peaks around it.
    points = [(0.0, 300.0), (300.0, 280.0), (599.0, 340.0), (600.0, 310.0), (1250.0, 305.0)]
    assert floors(points) == [280.0, 310.0, 305.0]
    assert floors([]) == []


def test_slope_is_mib_per_hour() -> None:
    assert slope_per_hour([(0.0, 100.0), (1800.0, 110.0), (3600.0, 120.0)]) == 20.0
    assert slope_per_hour([(0.0, 100.0)]) == 0.0


def test_the_containers_run_as_compose_and_the_chart_run_the_collector() -> None:
    config = Path("/data/c0/kneepoint.yaml")
    compose = container_run("kneepoint:0.1.0", "c", config, ["kneepoint", "collect"], [])
    # compose's volume and variable, and the database's folder at the path the config names
    assert "/data/c0/kneepoint.yaml:/etc/kneepoint/kneepoint.yaml:ro" in compose
    assert "KNEEPOINT_CONFIG=/etc/kneepoint/kneepoint.yaml" in compose
    assert "/data/c0:/data/c0" in compose
    assert compose[-3:] == ["kneepoint:0.1.0", "kneepoint", "collect"]
    assert "MALLOC_ARENA_MAX" not in " ".join(compose)  # the image's own ENV sets it
    helm = container_run("kneepoint:0.1.0", "h", config, ["kneepoint", "collect"], HELM_POD)
    for option in ("--read-only", "999:999", "1g", "ALL", "no-new-privileges"):
        assert option in helm
    assert helm.index("--read-only") < helm.index("kneepoint:0.1.0")  # options, not args
