"""At fleet size a window's GPU numbers come from the database's one row per GPU
(kneepoint/store/gpu_windows.py), not every GPU's rows of the range (queries.gpu_frame):
the status's GPUs and the replica numbers made from them (energy per token, idle GPU hours)
are equal to the rows path's, on SQLite and PostgreSQL, over 5 minutes, 1 h (samples),
24 h (5-minute summaries), 7 days (hourly) and a range ending off the grid, from GPUs with
energy resets, gaps, energy missing at some rows (and a reset right after), energy never
known, no gr_engine_active, gr_engine_active known at some rows, a GPU that starts late.
And a page view at fleet size reads no gpu_frame of every GPU.

Energy is whole mJ (as DCGM's counter is); busy shares are any fractions, which the
database adds in time order as Python does: compared with ==."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import insert, update
from sqlalchemy.orm import Session, sessionmaker

from kneepoint import distribution
from kneepoint.config import Config, Retention
from kneepoint.status import build_status
from kneepoint.store import queries
from kneepoint.store.codec import encode_bounds
from kneepoint.store.db import open_store
from kneepoint.store.models import GpuRow, HistogramLayoutRow, TargetRow
from kneepoint.store.rollup import rollup
from kneepoint.store.writer import ensure_targets
from kneepoint.views import build_view
from tests.kneepoint.test_window_sql import BOUNDS, DAY, HOUR, NOW, SPAN, WINDOWS, _encoded, same
from tests.kneepoint.test_window_sql import _rows as replica_rows

REPLICAS = {"a-resets": 0, "p0": 1, "p1": 2}  # name -> its GPUs' index on node-a
GPUS = ("resets", "no-active", "gaps", "no-energy", "late")  # index i on node-a


def _gpu_rows(kind: str, gpu_id: int) -> list[dict[str, Any]]:
    """A GPU's readings: every 5 minutes, every 30 s in the newest 26 h (as the replicas');
    times off the grid by multiples of 1/4 s, energy whole."""
    rows: list[dict[str, Any]] = []
    energy, step, grid = 1_000_000.0, 0, NOW - SPAN
    while True:
        step += 1
        grid += 300.0 if grid < NOW - 26 * HOUR else 30.0
        ts = grid + (step % 4) * 0.25
        if ts > NOW:
            break
        age = NOW - ts
        if kind == "late" and age > 20 * HOUR:
            continue
        if kind == "gaps" and (3 * DAY < age < 3 * DAY + 3 * HOUR or 5 * HOUR < age < 7 * HOUR):
            continue
        if kind in ("resets", "gaps") and any(
            abs(age - at) < 20 for at in (4 * DAY, 12 * HOUR, 1800.0, 700.0)
        ):
            energy = 0.0  # the driver reloaded: the counter starts again
        energy += 1000 + (step * 37) % 4000
        known_energy = not (kind == "gaps" and (step % 11 == 0 or 680 < age < 720))
        active = ((step * 7 + gpu_id) % 97) / 97  # fractions whose sums round
        rows.append(
            {
                "gpu_id": gpu_id,
                "ts": ts,
                "energy_mj": None if kind == "no-energy" or not known_energy else energy,
                "utilization": float((step * 3) % 101),
                "gr_engine_active": None
                if kind == "no-active" or (kind == "no-energy" and step % 3)
                else active,
                "sm_active": active / 2,
                "dram_active": active / 3,
                "power_watts": 100.0 + step % 50,
                "temperature_c": 40.0 + step % 20,
                "memory_temperature_c": None if kind == "late" else 50.0,
                "fb_used_mib": 1000.0 * (1 + step % 7),
                "xid_error": 0.0,
            }
        )
    return rows


def _config(url: str) -> Config:
    targets = [
        {
            "name": name,
            "kind": "vllm",
            "url": f"http://{name}/metrics",
            # The first replica has two GPUs: its busy share is their mean.
            "gpus": [f"node-a/{index}", *(["node-a/3"] if index == 0 else [])],
        }
        for name, index in REPLICAS.items()
    ]
    targets.append({"name": "dcgm-a", "kind": "dcgm", "url": "http://dcgm-a/metrics"})
    return Config.model_validate({"database": url, "targets": targets})


def _seed(url: str) -> None:
    sessions = open_store(url)
    with sessions.begin() as session:
        session.add(HistogramLayoutRow(id=1, bounds=encode_bounds(BOUNDS)))
        ids = ensure_targets(
            session,
            [(n, "vllm", f"http://{n}/metrics") for n in REPLICAS]
            + [("dcgm-a", "dcgm", "http://dcgm-a/metrics")],
        )
        for index, name in enumerate(REPLICAS):
            rows = _encoded(replica_rows(name, ids[name], index), 1)
            session.execute(
                update(TargetRow)
                .where(TargetRow.id == ids[name])
                .values(last_scrape_at=rows[-1]["ts"], up=True, engine="vllm", generation="v1")
            )
            keys = sorted({key for row in rows for key in row})
            session.execute(
                insert(queries.REPLICA_SAMPLES), [{k: row.get(k) for k in keys} for row in rows]
            )
        for index, kind in enumerate(GPUS):
            gpu = GpuRow(target_id=ids["dcgm-a"], host="node-a", gpu_index=index, model="NVIDIA L4")
            session.add(gpu)
            session.flush()
            session.execute(insert(queries.GPU_SAMPLES), _gpu_rows(kind, gpu.id))
    with sessions.begin() as session:
        rollup(session, NOW, Retention())  # the summary tiers, as the collector's job writes


@pytest.fixture(scope="module")
def store(fresh_url: Callable[[], str]) -> tuple[sessionmaker[Session], Config]:
    url = fresh_url()
    _seed(url)
    return open_store(url), _config(url)


@pytest.mark.parametrize(("now", "window"), WINDOWS)
def test_the_gpus_numbers_from_the_database_are_the_rows_paths(
    store: tuple[sessionmaker[Session], Config], now: float, window: float
) -> None:
    sessions, config = store
    with sessions() as session:
        expected = build_status(session, config, now, window, aggregate=False)
        got = build_status(session, config, now, window, aggregate=True)
        page = build_view(session, config, now, window, series=True)
        at_scale = build_view(session, config, now, window, series=False)
    same(got["gpus"], expected["gpus"], "gpus")
    same(got, expected, "status")
    same(at_scale.status, page.status, "view's status")
    same(at_scale.rows, page.rows, "view's rows")
    assert at_scale.gpus.empty and at_scale.charts_from_database
    assert not page.gpus.empty and not page.charts_from_database
    # The seeded cases are there at all: numbers, not all None.
    gpus = {g["index"]: g for g in expected["gpus"]}
    if window >= HOUR and now == NOW:
        assert gpus[0]["energy_joules"] and gpus[2]["energy_joules"]  # resets; gaps
        assert gpus[3]["energy_joules"] is None  # never known
        assert page.rows["a-resets"]["idle_gpu_hours"] is not None
        assert page.rows["p0"]["idle_gpu_hours"] is not None  # from utilization
        assert page.rows["a-resets"]["joules_per_million_tokens"] is not None


@pytest.mark.parametrize("window", [HOUR, DAY])
def test_a_page_view_at_fleet_size_reads_no_gpus_rows(
    store: tuple[sessionmaker[Session], Config],
    monkeypatch: pytest.MonkeyPatch,
    window: float,
) -> None:
    sessions, config = store
    frames: list[Any] = []
    sizes: list[int] = []
    gpu_frame, read_bulk = queries.gpu_frame, queries.read_bulk

    def asked(session: Session, *args: Any, **kwargs: Any) -> Any:
        frames.append(args)
        return gpu_frame(session, *args, **kwargs)

    def bulk(session: Session, query: Any) -> Any:
        frame = read_bulk(session, query)
        if "energy_mj" in frame:
            sizes.append(len(frame))
        return frame

    with sessions() as session:
        gaps = len(gpu_frame(session, NOW - window, NOW).query("gpu_index == 2"))
    monkeypatch.setattr(queries, "gpu_frame", asked)
    monkeypatch.setattr(queries, "read_bulk", bulk)
    monkeypatch.setattr(distribution, "FLEET_THRESHOLD", 2)
    with sessions() as session:
        build_view(session, config, NOW, window)
        build_status(session, config, NOW, window)
    assert frames == []
    # One row per GPU, and every row of the one whose energy is missing at some rows.
    assert sizes and all(size <= len(GPUS) + gaps for size in sizes), (sizes, gaps)
