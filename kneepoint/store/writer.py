"""Write scrape outcomes: samples, GPU readings, failures, and each target's health."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import cast

from sqlalchemy import Table, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from kneepoint.samples import GpuSample, ReplicaSample
from kneepoint.secrets import SecretURL, redact_url, reveal, scrub
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
# Plain tables and statements built once, values passed as parameters: these run for every
# target on every scrape, and a cached compiled statement is several times cheaper than ORM
# objects or a statement with literal values.
_TARGETS = cast(Table, TargetRow.__table__)
_REPLICA_SAMPLES = cast(Table, ReplicaSampleRow.__table__)
_GPU_SAMPLES = cast(Table, GpuSampleRow.__table__)
_SCRAPE_ERRORS = cast(Table, ScrapeErrorRow.__table__)
_TARGET_BY_ID = _TARGETS.c.id == bindparam("target_id")


def ensure_targets(
    session: Session, targets: Iterable[tuple[str, str, str | SecretURL]]
) -> dict[str, int]:
    """Create or update a row per (name, kind, url); return ids by name. The URL is stored
    as it may be shown (user info and query values masked: kneepoint/secrets.py)."""
    rows = {row.name: row for row in session.scalars(select(TargetRow))}
    for name, kind, given in targets:
        url = redact_url(reveal(given))
        row = rows.get(name)
        if row is None:
            row = rows[name] = TargetRow(name=name, kind=kind, url=url, consecutive_failures=0)
            session.add(row)
        row.kind, row.url = kind, url
    session.flush()
    return {name: row.id for name, row in rows.items()}


def last_stored(session: Session) -> dict[int, float]:
    """Per target id: the time of the newest sample stored for it."""
    rows = session.execute(
        select(_TARGETS.c.id, _TARGETS.c.last_success_at).where(
            _TARGETS.c.last_success_at.is_not(None)
        )
    )
    return {target_id: ts for target_id, ts in rows}


def record_refused(session: Session, target_id: int, reason: str) -> None:
    """A sample refused for its time (not newer than the last stored): counted, and the
    reason shown, but the target's up/down is left as it is (it answered)."""
    session.execute(
        update(_TARGETS)
        .where(_TARGET_BY_ID)
        .values(samples_refused=func.coalesce(_TARGETS.c.samples_refused, 0) + 1),
        [{"target_id": target_id, "last_error": scrub(reason)[:_ERROR_LIMIT]}],
    )


def record_failure(session: Session, target_id: int, ts: float, error: str) -> None:
    message = scrub(error)[:_ERROR_LIMIT]  # no secret of the config, even if a message had one
    session.execute(
        update(_TARGETS)
        .where(_TARGET_BY_ID)
        .values(consecutive_failures=_TARGETS.c.consecutive_failures + 1),
        [{"target_id": target_id, "up": False, "last_scrape_at": ts, "last_error": message}],
    )
    session.execute(insert(_SCRAPE_ERRORS), [{"target_id": target_id, "ts": ts, "error": message}])


def record_replica(session: Session, target_id: int, ts: float, sample: ReplicaSample) -> None:
    record_replica_history(session, target_id, [(ts, sample)])


def record_replica_history(
    session: Session, target_id: int, samples: list[tuple[float, ReplicaSample]]
) -> None:
    """Store scrapes of one replica in one statement; its health follows the last one."""
    if not samples:
        return
    ts, last = samples[-1]
    cache = last.cache
    _mark_up(
        session,
        target_id,
        ts,
        {
            "generation": last.generation,
            "engine": last.engine,
            "unavailable": json.dumps(last.unavailable, sort_keys=True),
            "engines": last.engines,
            "model_names": json.dumps(last.model_names),
            "cache_dtype": cache.cache_dtype,
            "block_size": cache.block_size,
            "num_gpu_blocks": cache.num_gpu_blocks,
            "capacity_tokens": cache.capacity_tokens,
            "prefix_caching": cache.enable_prefix_caching,
            "gpu_memory_utilization": cache.gpu_memory_utilization,
        },
    )
    rows = [_replica_row(session, target_id, t, sample) for t, sample in samples]
    session.execute(insert(_REPLICA_SAMPLES), rows)


def _replica_row(
    session: Session, target_id: int, ts: float, sample: ReplicaSample
) -> dict[str, object]:
    row: dict[str, object] = {
        "target_id": target_id,
        "ts": ts,
        "resolution": 0,
        "engines": sample.engines,
        **sample.gauges,
        **sample.counters,
        "accepted_per_position": encode_floats(sample.accepted_per_position),
    }
    for name, histogram in sample.histograms.items():
        layout = _layout_id(session, encode_bounds(histogram.bounds))
        row[f"hist_{name}"] = encode_histogram(layout, histogram)
    return row


def record_gpus(session: Session, target_id: int, ts: float, gpus: list[GpuSample]) -> None:
    record_gpu_history(session, target_id, [(ts, gpu) for gpu in gpus], scraped_at=ts)


def record_gpu_history(
    session: Session,
    target_id: int,
    readings: list[tuple[float, GpuSample]],
    scraped_at: float | None = None,
) -> None:
    """Store GPU readings of one exporter in one statement; it was last scraped at
    `scraped_at` (default: the last reading)."""
    last = scraped_at if scraped_at is not None else max(ts for ts, _ in readings)
    _mark_up(session, target_id, last, {})
    ids: dict[tuple[str, int], int] = {}
    rows = []
    for ts, gpu in readings:
        key = (gpu.host, gpu.index)
        if key not in ids:
            ids[key] = _gpu_id(session, target_id, gpu)
        rows.append(
            {
                "gpu_id": ids[key],
                "ts": ts,
                "resolution": 0,
                "energy_mj": gpu.energy_mj,
                "xid_error": gpu.xid_error,
                **{reading: getattr(gpu, reading) for reading in GPU_READINGS},
            }
        )
    if rows:
        session.execute(insert(_GPU_SAMPLES), rows)


def _mark_up(session: Session, target_id: int, ts: float, details: dict[str, object]) -> None:
    values = {
        "up": True,
        "last_scrape_at": ts,
        "last_success_at": ts,
        "last_error": None,
        "consecutive_failures": 0,
        **details,
    }
    session.execute(update(_TARGETS).where(_TARGET_BY_ID), [{"target_id": target_id, **values}])


def _gpu_id(session: Session, target_id: int, gpu: GpuSample) -> int:
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
    return row.id


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
