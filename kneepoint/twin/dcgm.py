"""A dcgm-exporter twin: each GPU's counters follow the engine that runs on it.

Every second a sampler turns the engine's busy, compute and memory time into what DCGM
reports: GR_ENGINE_ACTIVE (busy), PIPE_TENSOR_ACTIVE (high in prefill), DRAM_ACTIVE (high in
decode), power from those, and the energy counter integrated from power. A sleeping engine's
GPU is idle (no activity, idle power) and holds only its CUDA context (SLEEP_RESIDENT_MIB):
vLLM's sleep mode frees the weights and the KV cache.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from kneepoint.twin.profiles import Gpu
from kneepoint.twin.stats import Stats

DRIVER = "570.124.06"
SLEEP_RESIDENT_MIB = 600.0  # CUDA context and allocator left on a sleeping engine's GPU


@dataclass
class GpuState:
    """One GPU: its profile, what runs on it, and its last sampled readings."""

    index: int
    profile: Gpu
    stats: Callable[[], Stats] | None = None  # the engine's stats, when a replica runs here
    sleep_level: Callable[[], int] | None = None  # the engine's sleep level (0: awake)
    memory_fraction: float = 0.0  # what vLLM preallocated (gpu_memory_utilization)
    pod: str | None = None
    uuid: str = field(default_factory=lambda: f"GPU-{uuid.uuid4()}")
    busy: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0
    power: float = 0.0
    energy_mj: float = 0.0
    temperature: float = 35.0
    # What the timeline reads (kneepoint/timeline.py): the last XID, and the clock-event
    # (throttle) reasons bitmask; None: not exported (no XID yet; the field not enabled).
    xid: int | None = None
    clock_events: int | None = None
    asleep: bool = False
    _last: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def fb_used_fraction(self) -> float:
        """Share of the framebuffer in use: what vLLM preallocated, or a sleeping engine's
        CUDA context."""
        if self.asleep:
            return min(self.memory_fraction, SLEEP_RESIDENT_MIB / (self.profile.memory_gib * 1024))
        return self.memory_fraction

    def sample(self, seconds: float, engine_speed: float = 1.0) -> None:
        """Advance by `seconds` of wall time (the engine ran `engine_speed` times faster)."""
        if self.stats is not None:
            stats = self.stats()
            now = (stats.busy_seconds, stats.compute_seconds, stats.memory_seconds)
            window = max(seconds * engine_speed, 1e-9)
            busy, compute, memory = ((a - b) / window for a, b in zip(now, self._last, strict=True))
            self._last = now
            self.busy = min(1.0, busy)
            self.tensor = min(1.0, 0.85 * compute)
            self.dram = min(1.0, 0.9 * memory)
        if self.sleep_level is not None:
            self.asleep = bool(self.sleep_level())
        gpu = self.profile
        load = 0.3 * self.busy + 0.4 * self.tensor + 0.3 * self.dram
        self.power = gpu.idle_watts + (gpu.tdp_watts - gpu.idle_watts) * load
        self.energy_mj += self.power * seconds * 1000
        target = 32.0 + 45.0 * load
        self.temperature += (target - self.temperature) * min(1.0, seconds / 20.0)


@dataclass
class GpuNode:
    host: str
    gpus: list[GpuState]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sample(self, seconds: float, engine_speed: float = 1.0) -> None:
        with self.lock:
            for gpu in self.gpus:
                gpu.sample(seconds, engine_speed)

    def render(self) -> bytes:
        with self.lock:
            return render(self.host, self.gpus).encode()


# (field, type, help, reading) in dcgm-exporter's default-counters.csv order.
FIELDS: tuple[tuple[str, str, str, Callable[[GpuState], float | None]], ...] = (
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
        lambda g: 1980.0 if g.busy > 0.05 else 345.0,
    ),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda g: 2619.0),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "Memory temperature (in C).",
        lambda g: round(g.temperature + 4) if g.profile.bandwidth_gbs > 1000 else 0.0,
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda g: round(g.temperature)),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda g: round(g.power, 3)),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        lambda g: round(g.energy_mj),
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", lambda g: 0.0),
    (
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        lambda g: float(round(100 * min(1.0, g.busy * 1.15))),
    ),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        lambda g: float(round(100 * g.dram)),
    ),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", lambda g: 0.0),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", lambda g: 0.0),
    (
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        lambda g: float(round(g.profile.memory_gib * 1024 * (1 - g.fb_used_fraction))),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        lambda g: float(round(g.profile.memory_gib * 1024 * g.fb_used_fraction)),
    ),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", lambda g: 470.0),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        lambda g: round(g.busy * 0.97, 6),
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        lambda g: round(g.tensor, 6),
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        lambda g: round(g.dram, 6),
    ),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
        lambda g: None if g.xid is None else float(g.xid),
    ),
    (
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "gauge",
        "Current clock throttle reasons.",
        lambda g: None if g.clock_events is None else float(g.clock_events),
    ),
)


def render(host: str, gpus: list[GpuState]) -> str:
    lines: list[str] = []
    for name, kind, doc, reading in FIELDS:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
        for gpu in gpus:
            value = reading(gpu)
            if value is not None:
                lines.append(f"{name}{{{_labels(host, gpu)}}} {_number(value)}")
    return "\n".join(lines) + "\n"


def _labels(host: str, gpu: GpuState) -> str:
    labels = {
        "gpu": str(gpu.index),
        "UUID": gpu.uuid,
        "pci_bus_id": f"00000000:{0x18 + gpu.index:02X}:00.0",
        "device": f"nvidia{gpu.index}",
        "modelName": gpu.profile.name,
        "Hostname": host,
        "DCGM_FI_DRIVER_VERSION": DRIVER,
    }
    if gpu.pod:
        labels |= {"container": "vllm", "namespace": "inference", "pod": gpu.pod}
    return ",".join(f'{key}="{value}"' for key, value in labels.items())


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6f}".rstrip("0")
