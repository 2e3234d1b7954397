"""Write scrape outcomes: samples, GPU readings, failures, and each target's health."""

from __future__ import annotations

import json
from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from kneepoint.samples import GpuSample, ReplicaSample
from kneepoint.store.codec import encode_bounds, encode_floats, encode_histogram
from kneepoint.store.models import (
    GPU_READINGS,
    GpuRow,
    GpuSampleRow,
    HistogramLayoutRow,
    ReplicaSampleRow,
    ScrapeErrorRow,
    TargetRow,
)

_ERROR_LIMIT = 500


def ensure_targets(session: Session, targets: Iterable[tuple[str, str, str]]) -> dict[str, int]:
    """Create or update a row per (name, kind, url); return ids by name."""
    rows = {row.name: row for row in session.scalars(select(TargetRow))}
    for name, kind, url in targets:
        row = rows.get(name)
        if row is None:
            row = rows[name] = TargetRow(name=name, kind=kind, url=url, consecutive_failures=0)
            session.add(row)
        row.kind, row.url = kind, url
    session.flush()
    return {name: row.id for name, row in rows.items()}


def record_failure(session: Session, target_id: int, ts: float, error: str) -> None:
    target = session.get_one(TargetRow, target_id)
    message = error[:_ERROR_LIMIT]
    target.up, target.last_scrape_at, target.last_error = False, ts, message
    target.consecutive_failures = (target.consecutive_failures or 0) + 1
    session.add(ScrapeErrorRow(target_id=target_id, ts=ts, error=message))


def _mark_up(session: Session, target_id: int, ts: float) -> TargetRow:
    target = session.get_one(TargetRow, target_id)
    target.up, target.last_scrape_at, target.last_success_at = True, ts, ts
    target.last_error, target.consecutive_failures = None, 0
    return target


def record_replica(session: Session, target_id: int, ts: float, sample: ReplicaSample) -> None:
    target = _mark_up(session, target_id, ts)
    target.generation, target.engines = sample.generation, sample.engines
    target.model_names = json.dumps(sample.model_names)
    cache = sample.cache
    target.cache_dtype, target.block_size = cache.cache_dtype, cache.block_size
    target.num_gpu_blocks, target.capacity_tokens = cache.num_gpu_blocks, cache.capacity_tokens
    target.prefix_caching = cache.enable_prefix_caching
    target.gpu_memory_utilization = cache.gpu_memory_utilization
    row = ReplicaSampleRow(target_id=target_id, ts=ts, resolution=0, engines=sample.engines)
    for name, value in (*sample.gauges.items(), *sample.counters.items()):
        setattr(row, name, value)
    row.accepted_per_position = encode_floats(sample.accepted_per_position)
    for name, histogram in sample.histograms.items():
        layout = _layout_id(session, encode_bounds(histogram.bounds))
        setattr(row, f"hist_{name}", encode_histogram(layout, histogram))
    session.add(row)


def record_gpus(session: Session, target_id: int, ts: float, gpus: list[GpuSample]) -> None:
    _mark_up(session, target_id, ts)
    for gpu in gpus:
        identity = _gpu_row(session, target_id, gpu)
        row = GpuSampleRow(
            gpu_id=identity.id,
            ts=ts,
            resolution=0,
            energy_mj=gpu.energy_mj,
            xid_error=gpu.xid_error,
        )
        for reading in GPU_READINGS:
            setattr(row, reading, getattr(gpu, reading))
        session.add(row)


def _gpu_row(session: Session, target_id: int, gpu: GpuSample) -> GpuRow:
    row = session.scalar(
        select(GpuRow).where(
            GpuRow.target_id == target_id, GpuRow.host == gpu.host, GpuRow.gpu_index == gpu.index
        )
    )
    if row is None:
        row = GpuRow(target_id=target_id, host=gpu.host, gpu_index=gpu.index)
        session.add(row)
    row.uuid, row.model, row.pod, row.namespace = gpu.uuid, gpu.model, gpu.pod, gpu.namespace
    session.flush()
    return row


def _layout_id(session: Session, bounds: str) -> int:
    cache: dict[str, int] = session.info.setdefault("histogram_layouts", {})
    if bounds in cache:
        return cache[bounds]
    row = session.scalar(select(HistogramLayoutRow).where(HistogramLayoutRow.bounds == bounds))
    if row is None:
        row = HistogramLayoutRow(bounds=bounds)
        session.add(row)
        session.flush()
    cache[bounds] = row.id
    return row.id
