"""causes.gather reads each replica's signals from the database's few rows per replica
(kneepoint/store/window_rows.py), not from every replica's series: the signals are exactly
those the series gave (`series_gather`, the computation it replaced, kept here as the
reference), on SQLite and PostgreSQL, below and above distribution.FLEET_THRESHOLD, over its
15 minutes, an hour and two hours (the 5-minute summaries), and a window ending off the grid,
on a store with a gap, a restart (counters from zero), a stalled replica, one without
requests_waiting_capacity, one without requests_running at some rows, a stale one, and GPUs
reporting an XID. And gathering at fleet size builds no series: no replica_frame of the
fleet, no View; the changes before an onset (the timeline's GPU events) index the GPUs'
owners once per read, not once per GPU."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import parse_vllm
from kneepoint import causes, distribution, views
from kneepoint.causes import ReplicaSignals, Signals
from kneepoint.config import Config, Retention
from kneepoint.knee.runs import Point, Run
from kneepoint.samples import ReplicaSample
from kneepoint.store import queries
from kneepoint.store.db import open_store
from kneepoint.store.rollup import rollup
from kneepoint.store.runs import save_run
from kneepoint.store.writer import ensure_targets, record_gpu_history, record_replica_history
from tests.conftest import DCGM_T4, VLLM_032, read

NOW = 1_780_000_200.0  # on a 5-minute boundary
STEP = 15.0
SPAN = 3 * 3600.0
KNEE = 16
NODE = "gpu-node"
REPLICAS = (
    "plain-0",
    "plain-1",
    "plain-2",
    "busy",  # past its own sweep's knee
    "gap",  # no scrape for 6 minutes inside the newest 15
    "restart",  # every counter from zero 7 minutes before NOW
    "stalled",  # requests running, no token counter moving for the newest 20 minutes
    "no-capacity",  # never reports requests_waiting_capacity
    "no-running",  # requests_running missing at every third row
    "stale",  # its last scrape 40 minutes before NOW
    "broken",  # owns the GPU reporting an XID
)
WINDOWS = [
    (NOW, causes.WINDOW),
    (NOW, 3600.0),
    (NOW, 2 * 3600.0),  # the 5-minute summaries
    (NOW - 123.25, causes.WINDOW),  # ends off the grid
]


def series_gather(
    session: Session,
    config: Config,
    now: float,
    window: float,
    events: Sequence[causes.Event] | None = None,
) -> Signals:
    """causes.gather as it was before: every replica's series over the window from
    views.build_view, two peaks taken from each replica's rows of it (the reference)."""
    from kneepoint.causes import _ts
    from kneepoint.knee.detect import assess, knee_for_replica
    from kneepoint.store.runs import load_runs

    view = views.build_view(session, config, now, window, series=True)
    assessments = [assess(run, config.slos) for run in load_runs(session)]
    series = view.series
    out = []
    for replica in view.status["replicas"]:
        name = replica["name"]
        rows = view.rows.get(name, {})
        mine = series[series.replica == name] if len(series) else series
        concurrency = None
        if len(mine) and mine.requests_running.notna().any():
            concurrency = float((mine.requests_running + mine.requests_waiting.fillna(0)).max())
        waiting_capacity = (
            float(mine.requests_waiting_capacity.max())
            if len(mine) and mine.requests_waiting_capacity.notna().any()
            else replica.get("requests_waiting_capacity")
        )
        knee = knee_for_replica(name, replica.get("model_names") or [], assessments)
        xids = tuple(
            f"GPU {g['host']}/{g['index']}: XID {g['xid_error']:.0f}"
            for g in view.status["gpus"]
            if g["replica"] == name and g.get("xid_error")
        )
        out.append(
            ReplicaSignals(
                name,
                concurrency,
                knee.knee_concurrency if knee else None,
                rows.get("peak_kv_occupancy", replica.get("kv_cache_occupancy")),
                waiting_capacity,
                replica.get("preemptions_per_second"),
                xids,
                replica.get("stalled"),
                _ts(replica.get("stalled_since")),
                replica.get("requests_running"),
                replica.get("requests_waiting"),
                # The verdict's reasons beside a full KV cache (its own signal).
                tuple(
                    f"saturated, {r['reason'].replace('_', ' ')}: {r['evidence']}"
                    for r in replica["saturation"]["reasons"]
                    if r["reason"] != "kv_full"
                ),
            )
        )
    if events is None:
        events = causes.changes_before(session, config, now)
    return Signals(now, tuple(out), tuple(events))


def _sample(base: ReplicaSample, name: str, step: int, age: float) -> ReplicaSample | None:
    """One scrape of a replica `age` seconds before NOW (None: no scrape then)."""
    if name == "gap" and 120 < age < 480:
        return None
    if name == "stale" and age < 2400:
        return None
    index = REPLICAS.index(name)
    sample = copy.deepcopy(base)
    running = float((step * 7 + index * 3) % 23)
    waiting = float((step * 5 + index) % 11)
    if name == "busy":
        running += 2 * KNEE
    stalled = name == "stalled" and age < 1200
    if stalled:
        running, waiting = 6.0, 3.0
    sample.gauges.update(
        requests_running=None if name == "no-running" and step % 3 == 0 else running,
        # None as well as numbers: pandas' fillna(0) and SQL's COALESCE both meet it.
        requests_waiting=None if step % 13 == 0 else waiting,
        requests_waiting_capacity=None
        if name == "no-capacity"
        else float((step * 3 + index) % 5 == 0) * (1 + index % 3),
        kv_cache_usage=((step * 13 + index * 7) % 100) / 100,
    )
    # Counters from zero 7 minutes before NOW on "restart"; frozen where stalled.
    tick = step - int((SPAN - 420) / STEP) if name == "restart" and age < 420 else step
    tick = int((SPAN - 1200) / STEP) if stalled else tick
    for key in list(sample.counters):
        if sample.counters[key] is not None:
            sample.counters[key] = float(tick * (3 + index) * (1 + len(key) % 4))
    return sample


def _config(url: str) -> Config:
    targets: list[dict[str, Any]] = [
        {"name": name, "kind": "vllm", "url": f"http://{name}/metrics"} for name in REPLICAS
    ]
    targets[REPLICAS.index("broken")]["gpus"] = [f"{NODE}/0"]
    targets[REPLICAS.index("busy")]["gpus"] = [f"{NODE}/1"]
    targets.append({"name": NODE, "kind": "dcgm", "url": f"http://{NODE}/metrics"})
    return Config.model_validate({"database": url, "targets": targets})


def _seed(url: str, config: Config) -> None:
    sessions = open_store(url)
    base = parse_vllm(read(VLLM_032))
    gpu = replace(parse_dcgm(read(DCGM_T4), default_host=NODE)[0], host=NODE)
    steps = int(SPAN / STEP)
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for name in REPLICAS:
            history = []
            for step in range(1, steps + 1):
                ts = NOW - SPAN + step * STEP
                sample = _sample(base, name, step, NOW - ts)
                if sample is not None:
                    history.append((ts, sample))
            record_replica_history(session, ids[name], history)
        gpus = []
        for step in range(1, steps + 1):
            ts = NOW - SPAN + step * STEP
            # GPU 0 (broken's) reports XID 79 in the newest 10 minutes; GPU 2 (no replica's)
            # XID 43 throughout; GPU 1 (busy's) none.
            gpus += [
                (ts, replace(gpu, index=0, xid_error=79.0 if NOW - ts < 600 else None)),
                (ts, replace(gpu, index=1, uuid="GPU-1")),
                (ts, replace(gpu, index=2, uuid="GPU-2", xid_error=43.0)),
            ]
        record_gpu_history(session, ids[NODE], gpus, scraped_at=NOW)
        points = tuple(Point(c, 40.0 * min(c, KNEE) + 0.01 * c) for c in (1, 4, KNEE, 64))
        save_run(session, Run("busy-sweep", "other-model", "sweep", points), NOW - 86400)
        model = (base.model_names or ["m"])[0]
        save_run(session, Run("model-sweep", model, "sweep", points), NOW - 86400)
    with sessions.begin() as session:
        rollup(session, NOW, Retention())  # the summary tiers, as the collector's job writes


@pytest.fixture(scope="module")
def store(fresh_url: Callable[[], str]) -> tuple[sessionmaker[Session], Config]:
    url = fresh_url()
    config = _config(url)
    _seed(url, config)
    return open_store(url), config


def same(a: Any, b: Any, path: str = "") -> None:
    """a == b, where NaN equals NaN, with the path of the first difference."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        assert len(a) == len(b), path
        for number, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{number}]")
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        assert math.isnan(b), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"


@pytest.mark.parametrize("threshold", [1000, 2])
@pytest.mark.parametrize(("now", "window"), WINDOWS)
def test_gather_gives_the_signals_the_series_gave(
    store: tuple[sessionmaker[Session], Config],
    monkeypatch: pytest.MonkeyPatch,
    now: float,
    window: float,
    threshold: int,
) -> None:
    sessions, config = store
    monkeypatch.setattr(distribution, "FLEET_THRESHOLD", threshold)
    with sessions() as session:
        expected = series_gather(session, config, now, window)
        got = causes.gather(session, config, now, window)
    same(asdict(got), asdict(expected), "signals")
    # The seeded cases are there at all, so the equality is not of Nones.
    by_name = {r.replica: r for r in expected.replicas}
    assert by_name["busy"].knee == KNEE and by_name["plain-0"].knee == KNEE
    assert (by_name["busy"].concurrency or 0) >= 2 * KNEE
    if window == causes.WINDOW:  # no row of the stale one's in the window
        assert by_name["stale"].concurrency is None and by_name["stale"].kv_occupancy is None
    assert by_name["no-running"].concurrency is not None
    assert by_name["no-capacity"].waiting_capacity is None
    assert any(r.waiting_capacity for r in expected.replicas)
    if now == NOW:
        assert by_name["stalled"].stalled is True
        assert by_name["broken"].xid_gpus == (f"GPU {NODE}/0: XID 79",)
        assert (by_name["restart"].preemptions_per_second or 0) > 0
    assert by_name["busy"].xid_gpus == ()


def test_gather_at_fleet_size_builds_no_series(
    store: tuple[sessionmaker[Session], Config], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No View, no replica's series, no replica_frame of the fleet: the database's few rows
    per replica and whole rows only of the replica that may be stalled (the timeline's
    changes, read when the caller has none, are not the window's: the app passes its own)."""
    sessions, config = store
    asked: list[Any] = []
    replica_frame = queries.replica_frame

    def recorded(session: Session, *args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("target_ids", args[2] if len(args) > 2 else None))
        return replica_frame(session, *args, **kwargs)

    def no_view(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("gather built a View")

    def no_series(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("gather built the replicas' series")

    monkeypatch.setattr(distribution, "FLEET_THRESHOLD", 2)
    monkeypatch.setattr(queries, "replica_frame", recorded)
    monkeypatch.setattr(views, "build_view", no_view)
    monkeypatch.setattr(views, "replica_series", no_series)
    with sessions() as session:
        stalled = queries.targets(session)["stalled"].id
        # The changes as the app gives them (app/insight.py: the charts' markers' read).
        signals = causes.gather(session, config, NOW, events=())
    assert len(signals.replicas) == len(REPLICAS)
    assert None not in asked, asked
    assert all(set(targets) <= {stalled} for targets in asked), asked


def test_the_changes_before_an_onset_index_the_gpus_owners_once(
    store: tuple[sessionmaker[Session], Config], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timeline's GPU events (what a likely cause weighs as hardware) find each GPU's
    replica from the config's references indexed once per read, not once per GPU (a walk
    over every target each: a million steps at 1,000 replicas' GPUs, per onset read)."""
    from kneepoint import status

    sessions, config = store
    built: list[int] = []

    class Counted(status.GpuOwners):
        def __init__(self, config: Config) -> None:
            built.append(1)
            super().__init__(config)

    monkeypatch.setattr(status, "GpuOwners", Counted)
    with sessions() as session:
        found = causes.changes_between(session, config, NOW - causes.LOOKBACK, NOW)
    assert len(built) == 1, len(built)
    # Broken's GPU turned to XID 79 ten minutes before NOW; GPU 2 (no replica's) kept 43.
    xids = [(e.replica, e.detail) for e in found if e.kind == "gpu_xid"]
    assert xids == [("broken", f"XID 79 on GPU 0 on {NODE}")], xids
