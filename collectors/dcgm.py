"""Normalize a dcgm-exporter /metrics scrape into one GpuSample per GPU."""

from __future__ import annotations

from collectors.parse import (
    MAX_SERIES,
    ParsedScrape,
    ScrapeFormatError,
    SeriesCache,
    checked,
    label_index,
    parse_exposition,
)
from kneepoint.samples import GpuSample

# DCGM writes "blank" (no reading) as huge sentinel values, e.g. DCGM_FP64_BLANK = 1.4e26
# and DCGM_INT64_BLANK = 9223372036854775792: anything this large is not a measurement.
SENTINEL_FLOOR = 9.2e18
# GPU indices accepted from the `gpu` label: the largest NVLink domains hold 72 GPUs per rack
# and a host far fewer; a bigger number is a broken label, not a GPU.
MAX_GPU_INDEX = 1023

# GpuSample field -> (DCGM field, scale). Ratios stay 0..1; GPU_UTIL is a percentage.
FIELDS: dict[str, tuple[str, float]] = {
    "utilization": ("DCGM_FI_DEV_GPU_UTIL", 0.01),
    "gr_engine_active": ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0),
    "sm_active": ("DCGM_FI_PROF_SM_ACTIVE", 1.0),
    "tensor_active": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1.0),
    "dram_active": ("DCGM_FI_PROF_DRAM_ACTIVE", 1.0),
    "power_watts": ("DCGM_FI_DEV_POWER_USAGE", 1.0),
    "energy_mj": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1.0),
    "temperature_c": ("DCGM_FI_DEV_GPU_TEMP", 1.0),
    "memory_temperature_c": ("DCGM_FI_DEV_MEMORY_TEMP", 1.0),
    "fb_used_mib": ("DCGM_FI_DEV_FB_USED", 1.0),
    "fb_free_mib": ("DCGM_FI_DEV_FB_FREE", 1.0),
    "xid_error": ("DCGM_FI_DEV_XID_ERRORS", 1.0),
    # Not in the exporter's default set: stored where enabled (the timeline's throttling).
    "clock_events": ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1.0),
}
# Fields DCGM renamed, read under either name: the throttle reasons are "clock event
# reasons" from DCGM 3.3.
RENAMED: dict[str, tuple[str, float]] = {
    "clock_events": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1.0),
}


def parse_dcgm(text: str, default_host: str, max_series: int = MAX_SERIES) -> list[GpuSample]:
    """Parse one dcgm-exporter body; `default_host` names GPUs whose series carry no host."""
    parsed = parse_exposition(text, _is_dcgm, max_series=max_series, cache=_SERIES)
    return normalize_dcgm(parsed, default_host)


def _is_dcgm(name: str) -> bool:
    return name.startswith("DCGM_FI_")


# What earlier scrapes decided about each series line (parse.SeriesCache).
_SERIES = SeriesCache()


def normalize_dcgm(parsed: ParsedScrape, default_host: str) -> list[GpuSample]:
    if not parsed.samples:
        raise ScrapeFormatError("no DCGM_FI_* series found; is this a dcgm-exporter endpoint?")
    gpus: dict[tuple[str, int], GpuSample] = {}
    # The GPU of each label set, by the dict's identity: a GPU's fields share one label
    # text, so the parser gives them one dict (parse._LABEL_SETS), and its labels are read
    # once, not once per field. The dicts live as long as `parsed`, so no id is reused.
    seen: dict[int, GpuSample | None] = {}
    for field, (name, scale) in [*FIELDS.items(), *RENAMED.items()]:
        for labels, value in parsed.series(name):
            key = id(labels)
            if key in seen:
                gpu = seen[key]
            else:
                gpu = seen[key] = _gpu(gpus, name, labels, default_host)
            if gpu is None or value >= SENTINEL_FLOOR:
                continue
            setattr(gpu, field, value * scale)
    for gpu in gpus.values():
        # GDDR cards (L4, T4, RTX) report no memory temperature and show 0 °C for it.
        if gpu.memory_temperature_c == 0:
            gpu.memory_temperature_c = None
        # XID_ERRORS holds the last XID code; 0 means none has happened.
        if gpu.xid_error == 0:
            gpu.xid_error = None
    return checked(sorted(gpus.values(), key=lambda gpu: (gpu.host, gpu.index)))


def _gpu(
    gpus: dict[tuple[str, int], GpuSample], name: str, labels: dict[str, str], default_host: str
) -> GpuSample | None:
    if "gpu" not in labels:
        return None
    host = labels.get("Hostname") or labels.get("hostname") or default_host
    index = label_index(
        name, "gpu", labels["gpu"], MAX_GPU_INDEX + 1, "a GPU index", "MAX_GPU_INDEX"
    )
    key = (host, index)
    gpu = gpus.get(key)
    if gpu is None:
        gpu = gpus[key] = GpuSample(host=host, index=key[1])
    gpu.uuid = gpu.uuid or labels.get("UUID")
    gpu.model = gpu.model or labels.get("modelName")
    gpu.pod = gpu.pod or labels.get("pod") or labels.get("exported_pod")
    gpu.namespace = gpu.namespace or labels.get("namespace") or labels.get("exported_namespace")
    return gpu
