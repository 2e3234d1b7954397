"""Light twin targets for the scale bench: many vLLM replicas and dcgm-exporter nodes served by
one aiohttp process, one path per target, on loopback.

    .venv/bin/python bench/scale_twin.py --replicas 1000 --nodes 125 --gpus 8 --port 9000

A replica's body is the real vLLM 0.32 capture (../shared/fixtures) with its counters and
histogram counts scaled up with time (so every bucket stays monotonic in time and in `le`)
and its KV occupancy and queue gauges moving; replicas come in VARIANTS that grow at
different rates. A node's body is the DCGM twin's exposition (kneepoint/twin/dcgm.py) of
`--gpus` GPUs, its energy counter integrated from its power. Bodies are rendered at most
once a second per variant or node, so serving 1,000 targets costs the machine little.

`/r/{i}/metrics` is replica i, `/d/{i}/metrics` node i; `/stats` counts the scrapes served.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kneepoint.twin.dcgm import GpuState  # noqa: E402
from kneepoint.twin.dcgm import render as render_dcgm  # noqa: E402
from kneepoint.twin.profiles import gpu  # noqa: E402

CAPTURE = ROOT.parent / "shared" / "fixtures" / "vllm-0.32.0-cpu-prefix-caching.prom"
VARIANTS = 8
GROWTH = 600.0  # seconds for a counter of variant 0 to grow by its captured value
SAMPLE = re.compile(r"^([^{\s]+)(\{.*\})?\s+(\S+)$")
MOVING = {
    "vllm:kv_cache_usage_perc": (0.35, 0.55),  # a sine: mean, amplitude (clipped to 0..1)
    "vllm:num_requests_running": (12.0, 10.0),
    "vllm:num_requests_waiting": (2.0, 2.0),
}


def node_name(index: int) -> str:
    return f"node-{index:03d}"


def replica_name(index: int) -> str:
    return f"replica-{index:04d}"


class VllmTemplate:
    """The capture as text pieces and slots: counter slots grow, gauge slots move."""

    def __init__(self, text: str) -> None:
        types: dict[str, str] = {}
        self.pieces: list[str] = []
        self.slots: list[tuple[str, str, float]] = []  # (kind, name, captured value)
        chunk: list[str] = []
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, family, kind = line.split()
                types[family] = kind
            if line.startswith("#"):
                if line.startswith(("# HELP", "# TYPE")):
                    chunk.append(line + "\n")
                continue
            match = SAMPLE.match(line)
            if match is None:
                chunk.append(line + "\n")
                continue
            name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
            kind = _kind(name, types)
            if kind == "static":
                chunk.append(line + "\n")
                continue
            chunk.append(f"{name}{labels} ")
            self.pieces.append("".join(chunk))
            self.slots.append((kind, name, value))
            chunk = ["\n"]
        self.pieces.append("".join(chunk))

    def render(self, variant: int, t: float, started: float) -> bytes:
        grown = 1.0 + (t - started) * (1.0 + variant / VARIANTS) / GROWTH
        phase = 2 * math.pi * (t / 900.0 + variant / VARIANTS)
        values = []
        for kind, name, value in self.slots:
            if kind == "count":
                values.append(str(math.floor(value * grown)))
            elif kind == "grow":
                values.append(repr(value * grown))
            else:
                mean, amplitude = MOVING[name]
                moved = max(0.0, mean + amplitude * math.sin(phase))
                if name == "vllm:kv_cache_usage_perc":
                    moved = min(1.0, moved)
                else:
                    moved = float(round(moved))
                values.append(repr(moved))
        out = [self.pieces[0]]
        for value, piece in zip(values, self.pieces[1:], strict=True):
            out.append(value)
            out.append(piece)
        return "".join(out).encode()


def _kind(name: str, types: dict[str, str]) -> str:
    if name in MOVING:
        return "gauge"
    if name.endswith("_created"):
        return "static"
    for suffix in ("_bucket", "_count"):
        if name.endswith(suffix) and types.get(name[: -len(suffix)]) in ("histogram", "summary"):
            return "count"
    if name.endswith("_sum") and types.get(name[:-4]) in ("histogram", "summary"):
        return "grow"
    if name.endswith("_total") and types.get(name[:-6], types.get(name)) == "counter":
        return "count"
    return "static"


class Twin:
    def __init__(self, replicas: int, nodes: int, gpus: int) -> None:
        self.replicas, self.nodes, self.gpus = replicas, nodes, gpus
        self.template = VllmTemplate(CAPTURE.read_text())
        self.started = time.time()
        self.cache: dict[tuple[str, int], tuple[int, bytes]] = {}
        self.served = {"vllm": 0, "dcgm": 0}
        self.profile = gpu("h100-80gb")

    def replica(self, index: int) -> bytes:
        variant = index % VARIANTS
        return self._cached(
            "vllm", variant, lambda t: self.template.render(variant, t, self.started)
        )

    def node(self, index: int) -> bytes:
        return self._cached("dcgm", index, lambda t: self._render_node(index, t))

    def _cached(self, kind: str, key: int, render) -> bytes:  # type: ignore[no-untyped-def]
        now = time.time()
        second = int(now)
        hit = self.cache.get((kind, key))
        if hit is None or hit[0] != second:
            hit = (second, render(float(second)))
            self.cache[(kind, key)] = hit
        self.served[kind] += 1
        return hit[1]

    def _render_node(self, index: int, t: float) -> bytes:
        states = []
        for slot in range(self.gpus):
            replica = index * self.gpus + slot
            load = 0.5 + 0.4 * math.sin(2 * math.pi * (t / 900.0 + replica % VARIANTS / VARIANTS))
            state = GpuState(
                slot,
                self.profile,
                memory_fraction=0.9,
                pod=f"vllm-{replica}" if replica < self.replicas else None,
                uuid=f"GPU-{index:04d}-{slot:02d}",
                busy=load,
                tensor=0.6 * load,
                dram=0.7 * load,
            )
            state.power = self.profile.idle_watts + (
                self.profile.tdp_watts - self.profile.idle_watts
            ) * (0.3 * state.busy + 0.4 * state.tensor + 0.3 * state.dram)
            state.energy_mj = 1e9 + state.power * (t - self.started) * 1000
            state.temperature = 40.0 + 30.0 * load
            states.append(state)
        return render_dcgm(node_name(index), states).encode()


def application(twin: Twin) -> web.Application:
    async def replica(request: web.Request) -> web.Response:
        index = int(request.match_info["index"])
        if not 0 <= index < twin.replicas:
            raise web.HTTPNotFound()
        return web.Response(body=twin.replica(index), content_type="text/plain")

    async def node(request: web.Request) -> web.Response:
        index = int(request.match_info["index"])
        if not 0 <= index < twin.nodes:
            raise web.HTTPNotFound()
        return web.Response(body=twin.node(index), content_type="text/plain")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(twin.served)

    app = web.Application()
    app.router.add_get("/r/{index}/metrics", replica)
    app.router.add_get("/d/{index}/metrics", node)
    app.router.add_get("/stats", stats)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=125)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    twin = Twin(args.replicas, args.nodes, args.gpus)
    web.run_app(application(twin), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
