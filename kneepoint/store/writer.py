"""Write scrape outcomes: samples, GPU readings, failures, and each target's health."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, insert, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from kneepoint.samples import GpuSample, ReplicaSample
from kneepoint.secrets import SecretURL, redact_url, reveal, scrub
from kneepoint.store.codec import encode_bounds, encode_floats, encode_histogram
from kneepoint.store.configs import ADD_IF_CHANGED, changes
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
# Plain tables and statements built once, values passed as parameters, run on the session's
# connection: these run for every target on every scrape, and a cached compiled statement is
# several times cheaper than ORM objects, a statement with literal values, or the ORM
# session's execute path.
_TARGETS = cast(Table, TargetRow.__table__)
_REPLICA_SAMPLES = cast(Table, ReplicaSampleRow.__table__)
_GPU_SAMPLES = cast(Table, GpuSampleRow.__table__)
_GPUS = cast(Table, GpuRow.__table__)
_SCRAPE_ERRORS = cast(Table, ScrapeErrorRow.__table__)
_TARGET_BY_ID = _TARGETS.c.id == bindparam("target_id")
_GPU_BY_ID = _GPUS.c.id == bindparam("gpu_id")
_GPU_IDENTITY = ("uuid", "model", "pod", "namespace")
_MARK_UP = update(_TARGETS).where(_TARGET_BY_ID)
_ADD_REPLICA_SAMPLES = insert(_REPLICA_SAMPLES)
_ADD_GPU_SAMPLES = insert(_GPU_SAMPLES)
_QUEUE = "kneepoint_queued_rows"  # session.info key of batch()'s queue
_GPUS_OF_TARGET = select(
    _GPUS.c.id, _GPUS.c.host, _GPUS.c.gpu_index, *(_GPUS.c[name] for name in _GPU_IDENTITY)
).where(_GPUS.c.target_id == bindparam("target_id"))
_ALL_GPUS = select(
    _GPUS.c.target_id,
    _GPUS.c.id,
    _GPUS.c.host,
    _GPUS.c.gpu_index,
    *(_GPUS.c[name] for name in _GPU_IDENTITY),
)
_GPUS_READ = "kneepoint_gpus_read"  # session.info key: every GPU row, read once per batch()
# An exporter's GPUs as stored: (host, index) -> (id, (uuid, model, pod, namespace)).
StoredGpus = dict[tuple[str, int], tuple[int, tuple[Any, ...]]]


@contextmanager
def batch(session: Session) -> Iterator[None]:
    """Within the block, the rows record_replica and record_gpus write (samples and each
    target's health) are queued, then written when it ends, one statement per table and set
    of columns: a round of 500 targets is a handful of executemany statements, not a
    thousand statements. If the block raises, nothing queued is written."""
    queued: dict[tuple[object, tuple[str, ...]], list[dict[str, object]]] = {}
    session.info[_QUEUE] = queued
    try:
        yield
    finally:
        del session.info[_QUEUE]
        session.info.pop(_GPUS_READ, None)
    connection = session.connection()
    for (statement, _), rows in queued.items():
        connection.execute(statement, rows)  # type: ignore[call-overload]


def _write(session: Session, statement: object, rows: list[dict[str, object]]) -> None:
    """Execute `statement` for `rows` now, or queue them in the open batch()."""
    if not rows:  # an empty executemany would run the statement once, without parameters
        return
    queued = session.info.get(_QUEUE)
    if queued is None:
        session.connection().execute(statement, rows)  # type: ignore[call-overload]
        return
    for row in rows:
        queued.setdefault((statement, tuple(row)), []).append(row)


@dataclass(frozen=True)
class Stored:
    """What a round needs of the targets table, read in one query (round_targets): ids by
    name, the time of each target's newest stored sample and its stored engine, by id."""

    ids: dict[str, int]
    newest: dict[int, float]
    engines: dict[int, str | None]


_TARGET_STATE = select(
    _TARGETS.c.id,
    _TARGETS.c.name,
    _TARGETS.c.kind,
    _TARGETS.c.url,
    _TARGETS.c.last_success_at,
    _TARGETS.c.engine,
)


def round_targets(session: Session, targets: Iterable[tuple[str, str, str | SecretURL]]) -> Stored:
    """ensure_targets, each target's newest sample time and its stored engine, from one
    read of the targets table (a collection round made three). A target created here has
    no sample and no engine yet, so the read before its insert gives what the three reads
    after it gave."""
    rows = session.connection().execute(_TARGET_STATE).all()
    ids = _ensure(session, targets, rows)
    newest = {row[0]: row[4] for row in rows if row[4] is not None}
    return Stored(ids, newest, {row[0]: row[5] for row in rows})


def ensure_targets(
    session: Session, targets: Iterable[tuple[str, str, str | SecretURL]]
) -> dict[str, int]:
    """Create or update a row per (name, kind, url); return ids by name (of every stored
    target). The URL is stored as it may be shown (user info and query values masked:
    kneepoint/secrets.py). One query when nothing changed."""
    rows = session.connection().execute(_TARGET_STATE).all()
    return _ensure(session, targets, rows)


def _ensure(
    session: Session,
    targets: Iterable[tuple[str, str, str | SecretURL]],
    stored: Sequence[Sequence[Any]],
) -> dict[str, int]:
    """ensure_targets on the `stored` rows of the targets table (id, name, kind, url first)."""
    connection = session.connection()
    rows = {row[1]: (row[0], row[2], row[3]) for row in stored}
    ids = {name: row[0] for name, row in rows.items()}
    for name, kind, given in targets:
        url = _shown(reveal(given))
        row = rows.get(name)
        if row is None:
            inserted = connection.execute(
                insert(_TARGETS).values(
                    name=name, kind=kind, url=url, consecutive_failures=0, samples_refused=0
                )
            )
            ids[name] = _new_id(inserted)
            rows[name] = (ids[name], kind, url)
        elif (row[1], row[2]) != (kind, url):
            connection.execute(
                update(_TARGETS).where(_TARGET_BY_ID),
                [{"target_id": row[0], "kind": kind, "url": url}],
            )
            rows[name] = (row[0], kind, url)
    return ids


def _new_id(result: CursorResult[Any]) -> int:
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


@lru_cache(maxsize=1024)
def _bounds_text(bounds: tuple[float, ...]) -> str:
    return encode_bounds(bounds)


@lru_cache(maxsize=4096)
def _shown(url: str) -> str:
    return redact_url(url)


def record_refused(session: Session, target_id: int, reason: str) -> None:
    """A sample refused for its time (not newer than the last stored): counted, and the
    reason shown, but the target's up/down is left as it is (it answered)."""
    session.connection().execute(
        update(_TARGETS)
        .where(_TARGET_BY_ID)
        .values(samples_refused=func.coalesce(_TARGETS.c.samples_refused, 0) + 1),
        [{"target_id": target_id, "last_error": scrub(reason)[:_ERROR_LIMIT]}],
    )


def record_failure(session: Session, target_id: int, ts: float, error: str) -> None:
    message = scrub(error)[:_ERROR_LIMIT]  # no secret of the config, even if a message had one
    connection = session.connection()
    connection.execute(
        update(_TARGETS)
        .where(_TARGET_BY_ID)
        .values(consecutive_failures=_TARGETS.c.consecutive_failures + 1),
        [{"target_id": target_id, "up": False, "last_scrape_at": ts, "last_error": message}],
    )
    connection.execute(
        insert(_SCRAPE_ERRORS), [{"target_id": target_id, "ts": ts, "error": message}]
    )


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
            "lora_adapters": None if last.lora is None else json.dumps(last.lora, sort_keys=True),
        },
    )
    rows = [_replica_row(session, target_id, t, sample) for t, sample in samples]
    _write(session, _ADD_REPLICA_SAMPLES, rows)
    _write(session, ADD_IF_CHANGED, changes(target_id, samples))  # the timeline's history


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
        layout = _layout_id(session, _bounds_text(histogram.bounds))
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
    ids = _gpu_ids(session, target_id, [gpu for _, gpu in readings])
    rows = []
    for ts, gpu in readings:
        rows.append(
            {
                "gpu_id": ids[(gpu.host, gpu.index)],
                "ts": ts,
                "resolution": 0,
                "energy_mj": gpu.energy_mj,
                "xid_error": gpu.xid_error,
                "clock_events": gpu.clock_events,
                **{reading: getattr(gpu, reading) for reading in GPU_READINGS},
            }
        )
    if rows:
        _write(session, _ADD_GPU_SAMPLES, rows)


def _mark_up(session: Session, target_id: int, ts: float, details: dict[str, object]) -> None:
    values = {
        "up": True,
        "last_scrape_at": ts,
        "last_success_at": ts,
        "last_error": None,
        "consecutive_failures": 0,
        **details,
    }
    _write(session, _MARK_UP, [{"target_id": target_id, **values}])


def _stored_gpus(session: Session, target_id: int) -> StoredGpus:
    """An exporter's stored GPUs. Within batch() (a collection round), every exporter's are
    read in one query, the first time one is asked for, and kept to the batch's end: a
    round of 100 exporters made 100 queries. _gpu_ids keeps them as it changes the rows."""
    connection = session.connection()
    if _QUEUE not in session.info:  # outside a round: this exporter's rows only
        return {
            (host, index): (gpu_id, tuple(identity))
            for gpu_id, host, index, *identity in connection.execute(
                _GPUS_OF_TARGET, {"target_id": target_id}
            )
        }
    read: dict[int, StoredGpus] | None = session.info.get(_GPUS_READ)
    if read is None:
        read = session.info[_GPUS_READ] = {}
        for owner, gpu_id, host, index, *identity in connection.execute(_ALL_GPUS):
            read.setdefault(owner, {})[(host, index)] = (gpu_id, tuple(identity))
    return read.setdefault(target_id, {})


def _gpu_ids(session: Session, target_id: int, gpus: list[GpuSample]) -> dict[tuple[str, int], int]:
    """Ids of an exporter's GPUs by (host, index), in one query (none within a round after
    its first exporter): rows are added for new GPUs, and a GPU's identity (UUID, model,
    pod) follows its first reading here when it changed."""
    connection = session.connection()
    stored = _stored_gpus(session, target_id)
    ids: dict[tuple[str, int], int] = {}
    for gpu in gpus:
        key = (gpu.host, gpu.index)
        if key in ids:
            continue
        identity = (gpu.uuid, gpu.model, gpu.pod, gpu.namespace)
        row = stored.get(key)
        if row is None:
            inserted = connection.execute(
                insert(_GPUS).values(
                    target_id=target_id,
                    host=gpu.host,
                    gpu_index=gpu.index,
                    **dict(zip(_GPU_IDENTITY, identity, strict=True)),
                )
            )
            ids[key] = _new_id(inserted)
            stored[key] = (ids[key], identity)
            continue
        ids[key] = row[0]
        if row[1] != identity:
            connection.execute(
                update(_GPUS).where(_GPU_BY_ID),
                [{"gpu_id": row[0], **dict(zip(_GPU_IDENTITY, identity, strict=True))}],
            )
            stored[key] = (row[0], identity)
    return ids


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
