"""Fleet files for `kneepoint simulate --fleet`, and the command itself."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from collectors.engines.vllm import parse_vllm
from kneepoint.config import ConfigError
from kneepoint.twin import fleet as fleet_module
from kneepoint.twin.fleet import load_fleet
from tests.conftest import free_port


def example() -> str:
    """The fleet file shown in kneepoint/twin/fleet.py's docstring."""
    doc = fleet_module.__doc__ or ""
    return doc.split("\n\n", 1)[1]


def test_the_documented_fleet_file_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(example())
    spec = load_fleet(path)
    assert [r.name for r in spec.replicas] == [
        "qwen3-32b-a",
        "llama-8b-spec",
        "qwen3-4b-sgl",
        "qwen3-4b-c",
    ]
    assert spec.replicas[1].speculative is not None
    assert [r.engine for r in spec.replicas] == ["vllm", "vllm", "sglang", "vllm"]
    limited = spec.replicas[3]
    assert (limited.max_num_queued_reqs, limited.kv_offload_gib) == (32, 8)


BAD = {
    "an unknown GPU": ("nodes: [{name: n, gpus: [b200]}]\nreplicas: []", "nodes[0].gpus[0]"),
    "an unknown model": (
        "nodes: [{name: n, gpus: [l4]}]\nreplicas: [{name: r, model: gpt-5, node: n}]",
        "replicas[0].model",
    ),
    "a missing node": (
        "nodes: [{name: n, gpus: [l4]}]\nreplicas: [{name: r, model: qwen3-4b, node: m}]",
        "unknown node 'm'",
    ),
    "two replicas on one GPU": (
        "nodes: [{name: n, gpus: [l4]}]\nreplicas: [{name: a, model: qwen3-4b, node: n}, "
        "{name: b, model: qwen3-4b, node: n}]",
        "already runs a replica",
    ),
    "an unknown key": ("nodes: []\nreplicas: []\nspeedup: 2", "speedup: is not a known key"),
}


@pytest.mark.parametrize(("text", "message"), BAD.values(), ids=BAD.keys())
def test_a_bad_fleet_file_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_fleet(path)


def simulate(model: str, port: int, dcgm_port: int, *extra: str) -> list[str]:
    """`kneepoint simulate` of one replica on an L4."""
    return [
        sys.executable,
        "-m",
        "kneepoint.cli",
        "simulate",
        "--gpu",
        "l4",
        "--model",
        model,
        "--port",
        str(port),
        "--dcgm-port",
        str(dcgm_port),
        *extra,
    ]


def test_simulate_serves_a_replica_and_its_gpu_until_stopped() -> None:
    port, dcgm_port = free_port(), free_port()
    process = subprocess.Popen(
        simulate("qwen3-4b", port, dcgm_port, "--vllm-version", "0.8"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
                break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert parse_vllm(metrics).generation == "v1-0.8"
        assert "DCGM_FI_DEV_GPU_UTIL" in httpx.get(f"http://127.0.0.1:{dcgm_port}/metrics").text
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=30)
    assert f"replica qwen3-4b: http://127.0.0.1:{port}" in output


def test_simulate_refuses_a_model_that_does_not_fit() -> None:
    result = subprocess.run(
        simulate("qwen3-32b", free_port(), free_port()),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "does not fit on NVIDIA L4" in result.stderr
