"""A fleet of twin replicas and GPU nodes from a small YAML, run as real HTTP servers.

host: 127.0.0.1
nodes:
  - {name: gpu-node-1, port: 9401, gpus: [h100-80gb, h100-80gb, l4, l4]}
replicas:
  - {name: qwen3-32b-a, port: 8101, model: qwen3-32b, node: gpu-node-1, gpu_index: 0}
  - name: llama-8b-spec
    port: 8102
    model: llama-3.1-8b
    node: gpu-node-1
    gpu_index: 1
    speculative: {tokens: 3, acceptance: 0.7, draft_cost: 0.08}
  # A replica is vLLM (vllm_version, default the newest) or, with engine: sglang, SGLang
  # (sglang_version, default the newest): the same engine model, SGLang's metrics and API.
  - {name: qwen3-4b-sgl, model: qwen3-4b, node: gpu-node-1, gpu_index: 2, engine: sglang}
  # vLLM 0.32's options: queue limits (load shedding, HTTP 503) and a CPU KV offload tier.
  - {name: qwen3-4b-c, model: qwen3-4b, node: gpu-node-1, gpu_index: 3,
     max_num_queued_reqs: 32, kv_offload_gib: 8}
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from kneepoint.config import ConfigError, Strict, Target, describe
from kneepoint.secrets import SecretURL
from kneepoint.twin.dcgm import GpuNode, GpuState
from kneepoint.twin.profiles import GPUS, MODELS, gpu, model
from kneepoint.twin.replica import Replica
from kneepoint.twin.server import TwinServer
from kneepoint.twin.sglang import NEWEST as SGLANG_NEWEST
from kneepoint.twin.sglang import VERSIONS as SGLANG_VERSIONS
from kneepoint.twin.simulated_engine import EngineConfig

Port = Annotated[int, Field(ge=0, le=65535)]


class Speculative(Strict):
    tokens: Annotated[int, Field(ge=1, le=8)] = 3
    acceptance: Annotated[float, Field(ge=0.0, le=1.0)] = 0.7
    draft_cost: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1


class NodeSpec(Strict):
    name: str
    port: Port = 0
    gpus: list[Literal[tuple(GPUS)]]  # type: ignore[valid-type]


class ReplicaSpec(Strict):
    name: str
    port: Port = 0
    model: Literal[tuple(MODELS)]  # type: ignore[valid-type]
    node: str
    gpu_index: Annotated[int, Field(ge=0)] = 0
    engine: Literal["vllm", "sglang"] = "vllm"
    vllm_version: Literal["0.32", "0.10", "0.8", "0.5"] = "0.32"
    sglang_version: Literal[SGLANG_VERSIONS] = SGLANG_NEWEST  # type: ignore[valid-type]
    max_num_seqs: Annotated[int, Field(ge=1)] = 256
    max_num_batched_tokens: Annotated[int, Field(ge=16)] = 2048
    max_model_len: Annotated[int, Field(ge=64)] = 32768
    gpu_memory_utilization: Annotated[float, Field(gt=0.1, le=0.99)] = 0.9
    fp8_weights: bool = False
    fp8_kv_cache: bool = False
    prefix_caching: bool = True
    speculative: Speculative | None = None
    # vLLM 0.32's queue limits (None: unlimited): arrivals past them get HTTP 503.
    max_num_queued_reqs: Annotated[int, Field(ge=1)] | None = None
    max_num_queued_tokens: Annotated[int, Field(ge=1)] | None = None
    kv_offload_gib: Annotated[float, Field(ge=0)] = 0.0  # --kv-offloading-size (CPU tier)
    pod: str | None = None


class FleetSpec(Strict):
    host: str = "127.0.0.1"
    speed: Annotated[float, Field(gt=0)] = 1.0  # engine seconds per wall second
    nodes: list[NodeSpec]
    replicas: list[ReplicaSpec]

    @model_validator(mode="after")
    def _placement(self) -> FleetSpec:
        nodes = {node.name: node for node in self.nodes}
        placed: set[tuple[str, int]] = set()
        for index, replica in enumerate(self.replicas):
            node = nodes.get(replica.node)
            if node is None:
                raise ValueError(f"replicas[{index}].node names unknown node {replica.node!r}")
            if replica.gpu_index >= len(node.gpus):
                raise ValueError(
                    f"replicas[{index}].gpu_index: {replica.node} has {len(node.gpus)} GPUs"
                )
            if (replica.node, replica.gpu_index) in placed:
                raise ValueError(
                    f"replicas[{index}]: GPU {replica.node}/{replica.gpu_index} "
                    "already runs a replica"
                )
            placed.add((replica.node, replica.gpu_index))
        names = [r.name for r in self.replicas] + [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("replica and node names must be unique")
        return self


def engine_config(spec: ReplicaSpec, gpu_key: str) -> EngineConfig:
    drafter = spec.speculative
    return EngineConfig(
        gpu=gpu(gpu_key),
        model=model(spec.model),
        fp8_weights=spec.fp8_weights,
        fp8_kv_cache=spec.fp8_kv_cache,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_model_len=spec.max_model_len,
        enable_prefix_caching=spec.prefix_caching,
        num_speculative_tokens=drafter.tokens if drafter else 0,
        spec_acceptance_rate=drafter.acceptance if drafter else 0.0,
        spec_draft_cost=drafter.draft_cost if drafter else 0.1,
        max_num_queued_reqs=spec.max_num_queued_reqs,
        max_num_queued_tokens=spec.max_num_queued_tokens,
        kv_offload_gib=spec.kv_offload_gib,
    )


def load_fleet(path: str | Path) -> FleetSpec:
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        return FleetSpec.model_validate(raw)
    except OSError as error:
        raise ConfigError(f"cannot read fleet {path}: {error.strerror or error}") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error
    except ValidationError as error:
        raise ConfigError(f"{path}: {describe(error)}") from None


class Fleet:
    """The running fleet: a server per replica and per node, and the GPU sampler."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.replicas: dict[str, Replica] = {}
        self.nodes: dict[str, GpuNode] = {}
        self.servers: dict[str, TwinServer] = {}
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="twin-dcgm", daemon=True)
        for node_spec in spec.nodes:
            gpus = [GpuState(index, gpu(key)) for index, key in enumerate(node_spec.gpus)]
            self.nodes[node_spec.name] = GpuNode(node_spec.name, gpus)
        gpu_keys = {node_spec.name: node_spec.gpus for node_spec in spec.nodes}
        for seed, replica in enumerate(spec.replicas):
            state = self.nodes[replica.node].gpus[replica.gpu_index]
            config = engine_config(replica, gpu_keys[replica.node][replica.gpu_index])
            twin = Replica(
                replica.name,
                MODELS[replica.model].name,
                config,
                replica.vllm_version,
                speed=spec.speed,
                seed=seed,
                sglang_version=replica.sglang_version if replica.engine == "sglang" else None,
            )
            self.replicas[replica.name] = twin
            state.stats = lambda twin=twin: twin.engine.stats  # type: ignore[misc]
            state.sleep_level = lambda twin=twin: twin.engine.sleep_level  # type: ignore[misc]
            state.memory_fraction = replica.gpu_memory_utilization
            state.pod = replica.pod or f"{replica.name}-0"

    def start(self) -> Fleet:
        host = self.spec.host
        for spec in self.spec.replicas:
            self.replicas[spec.name].start()
            self.servers[spec.name] = TwinServer(self.replicas[spec.name], host, spec.port).start()
        for node_spec in self.spec.nodes:
            node = self.nodes[node_spec.name]
            self.servers[node_spec.name] = TwinServer(node, host, node_spec.port).start()
        self._sampler.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for server in self.servers.values():
            server.stop()
        for replica in self.replicas.values():
            replica.stop()

    def url(self, name: str) -> str:
        return self.servers[name].url

    def targets(self) -> list[Target]:
        """kneepoint targets for this fleet: each replica, with its GPU, and each node."""
        targets = [
            Target(
                name=spec.name,
                kind=spec.engine,
                url=SecretURL(f"{self.url(spec.name)}/metrics"),
                gpus=[f"{spec.node}/{spec.gpu_index}"],
            )
            for spec in self.spec.replicas
        ]
        targets += [
            Target(name=node.name, kind="dcgm", url=SecretURL(f"{self.url(node.name)}/metrics"))
            for node in self.spec.nodes
        ]
        return targets

    def _sample(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(1.0):
            now = time.monotonic()
            for node in self.nodes.values():
                node.sample(now - last, self.spec.speed)
            last = now


def single_replica(
    gpu_key: str,
    model_key: str,
    port: int,
    dcgm_port: int,
    host: str = "127.0.0.1",
    **replica: object,
) -> FleetSpec:
    """One replica on one GPU node: what `kneepoint simulate --gpu … --model …` serves."""
    try:
        return FleetSpec.model_validate(
            {
                "host": host,
                "nodes": [{"name": "gpu-node", "port": dcgm_port, "gpus": [gpu_key]}],
                "replicas": [
                    {
                        "name": model_key,
                        "port": port,
                        "model": model_key,
                        "node": "gpu-node",
                        **replica,
                    }
                ],
            }
        )
    except ValidationError as error:
        raise ConfigError(describe(error)) from None
