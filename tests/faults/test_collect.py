"""Collector faults: one bad target, one odd label, one normalizer or storage error, a clock
that steps back. Each is served by a real loopback HTTP server beside good targets; what is
stored, what is recorded, and that the rest of the round goes on."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

import collectors.collect
from collectors.collect import collect_once
from collectors.scheduler import StepSafeBackgroundScheduler, pull_back_stepped_jobs
from kneepoint.config import Config, Target
from kneepoint.store.db import open_store
from kneepoint.store.models import GpuSampleRow, ReplicaSampleRow, TargetRow
from tests.collectors.test_collect import config_for as collect_config_for
from tests.conftest import DCGM_T4, VLLM_032, MetricsServer, Route

VLLM = VLLM_032.read_text()
DCGM = DCGM_T4.read_text()
TTFT_BUCKET = 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny"}'
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
DCGM_UTIL = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",Hostname="n",modelName="Tesla T4"}'


def _with(body: str, old: str, new: str) -> bytes:
    assert old in body, old
    return body.replace(old, new, 1).encode()


ODD_BODIES = {
    "a bucket without le": (
        _with(VLLM, TTFT_BUCKET, TTFT_BUCKET.replace(',le="0.001"', "")),
        "has no le label",
    ),
    'le="fast"': (
        _with(VLLM, TTFT_BUCKET, TTFT_BUCKET.replace('le="0.001"', 'le="fast"')),
        "le='fast': not a number",
    ),
    'position="a"': (
        (VLLM + f'{PER_POSITION}{{engine="0",model_name="tiny",position="a"}} 3.0\n').encode(),
        "position='a'",
    ),
    'position="50000000"': (
        (
            VLLM + f'{PER_POSITION}{{engine="0",model_name="tiny",position="50000000"}} 3.0\n'
        ).encode(),
        "position='50000000'",
    ),
    "more series than max_series": (
        (VLLM + "".join(f'user_requests{{user="u{i}"}} 1\n' for i in range(3000))).encode(),
        "more than 2000 series",
    ),
}


def config_for(server: MetricsServer, tmp_path: Path, **paths: str) -> Config:
    """tests/collectors' config, with a series cap small enough to cross in a test."""
    config = collect_config_for(server, tmp_path, **paths)
    targets = [t.model_copy(update={"timeout": 2.0, "max_series": 2000}) for t in config.targets]
    return config.model_copy(update={"targets": targets})


def count(sessions: sessionmaker[Session], model: type) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def target(sessions: sessionmaker[Session], name: str) -> TargetRow:
    with sessions() as session:
        return session.scalars(select(TargetRow).where(TargetRow.name == name)).one()


@pytest.mark.parametrize(("body", "reason"), ODD_BODIES.values(), ids=ODD_BODIES.keys())
def test_an_odd_vllm_label_costs_its_target_only(
    metrics_server: MetricsServer, tmp_path: Path, body: bytes, reason: str
) -> None:
    metrics_server.routes = {
        "/good": Route(VLLM.encode()),
        "/bad": Route(body),
        "/gpu": Route(DCGM.encode()),
    }
    config = config_for(metrics_server, tmp_path, good="/good", bad="/bad", gpu_node="/gpu")
    sessions = open_store(config.database)
    outcomes = {o.target: o for o in collect_once(config, sessions)}
    assert outcomes["good"].ok and outcomes["gpu_node"].ok
    assert not outcomes["bad"].ok and reason in (outcomes["bad"].error or "")
    assert target(sessions, "bad").up is False
    assert reason in (target(sessions, "bad").last_error or "")
    assert count(sessions, ReplicaSampleRow) == 1
    assert count(sessions, GpuSampleRow) > 0


@pytest.mark.parametrize("gpu", ["nvidia0", "-1", "100000"])
def test_a_dcgm_gpu_label_that_is_not_an_index_costs_its_exporter_only(
    metrics_server: MetricsServer, tmp_path: Path, gpu: str
) -> None:
    bad = DCGM.replace('gpu="0"', f'gpu="{gpu}"').encode()
    metrics_server.routes = {"/good": Route(VLLM.encode()), "/gpu": Route(bad)}
    config = config_for(metrics_server, tmp_path, good="/good", gpu_node="/gpu")
    sessions = open_store(config.database)
    outcomes = {o.target: o for o in collect_once(config, sessions)}
    assert outcomes["good"].ok
    assert f"gpu={gpu!r} is not a GPU index" in (outcomes["gpu_node"].error or "")
    assert count(sessions, ReplicaSampleRow) == 1
    assert count(sessions, GpuSampleRow) == 0


def test_any_exception_in_a_normalizer_costs_its_target_only(
    metrics_server: MetricsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug no body can trigger today: the normalizer raising something unexpected."""
    real = collectors.collect.parse_replica

    def broken_for_one(kind: str, text: str, max_series: int) -> object:
        if "poison" in text:
            raise KeyError("engine")
        return real(kind, text, max_series)

    monkeypatch.setattr(collectors.collect, "parse_replica", broken_for_one)
    metrics_server.routes = {
        "/good": Route(VLLM.encode()),
        "/bad": Route((VLLM + "# poison\n").encode()),
    }
    config = config_for(metrics_server, tmp_path, good="/good", bad="/bad")
    sessions = open_store(config.database)
    outcomes = {o.target: o for o in collect_once(config, sessions)}
    assert outcomes["good"].ok
    assert outcomes["bad"].error == "cannot normalize the scrape: KeyError: 'engine'"
    assert count(sessions, ReplicaSampleRow) == 1


def test_a_row_the_database_refuses_costs_its_target_only(
    metrics_server: MetricsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = collectors.collect.record_gpus

    def refuse(session: Session, target_id: int, ts: float, gpus: list) -> None:  # type: ignore[type-arg]
        real(session, target_id, ts, gpus)  # the rows go in, then the savepoint must undo them
        raise ValueError("value out of range for column fb_used_mib")

    monkeypatch.setattr(collectors.collect, "record_gpus", refuse)
    metrics_server.routes = {"/good": Route(VLLM.encode()), "/gpu": Route(DCGM.encode())}
    config = config_for(metrics_server, tmp_path, good="/good", gpu_node="/gpu")
    sessions = open_store(config.database)
    outcomes = {o.target: o for o in collect_once(config, sessions)}
    assert outcomes["good"].ok
    assert "cannot store the scrape: ValueError" in (outcomes["gpu_node"].error or "")
    assert count(sessions, ReplicaSampleRow) == 1
    assert count(sessions, GpuSampleRow) == 0  # its half-written rows were rolled back
    assert target(sessions, "gpu_node").up is False


def test_a_target_url_s_credentials_never_reach_the_stored_error(
    metrics_server: MetricsServer, tmp_path: Path
) -> None:
    metrics_server.routes = {"/m?token=s3cret": Route(b"nope", status=500)}
    secret_url = (
        metrics_server.url("/m").replace("http://", "http://admin:hunter2@") + "?token=s3cret"
    )
    config = Config(
        database=f"sqlite:///{tmp_path / 'k.db'}",
        targets=[Target(name="a", kind="vllm", url=secret_url, timeout=2.0)],
    )
    sessions = open_store(config.database)
    (outcome,) = collect_once(config, sessions)
    stored = target(sessions, "a").last_error or ""
    assert "HTTP 500" in stored and "/m?token=***" in stored  # the query's names, no values
    for secret in ("hunter2", "admin", "s3cret"):
        assert secret not in stored and secret not in (outcome.error or "")


class SteppingClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_sample_from_a_clock_stepped_back_is_refused_and_counted(
    metrics_server: MetricsServer, tmp_path: Path
) -> None:
    metrics_server.routes = {"/good": Route(VLLM.encode()), "/gpu": Route(DCGM.encode())}
    config = config_for(metrics_server, tmp_path, good="/good", gpu_node="/gpu")
    sessions = open_store(config.database)
    clock = SteppingClock(1_000_000.0)
    assert all(o.ok for o in collect_once(config, sessions, clock))
    clock.now -= 3600  # NTP steps the clock back an hour
    outcomes = collect_once(config, sessions, clock)
    assert all("did the clock step back?" in (o.error or "") for o in outcomes)
    with sessions() as session:
        stamps = session.scalars(select(ReplicaSampleRow.ts)).all()
    assert stamps == [1_000_000.0]  # nothing sorted among older samples
    row = target(sessions, "good")
    assert row.samples_refused == 1
    assert row.up is True  # it answered; only its sample's time was refused
    clock.now = 1_000_015.0  # time passes the last stored sample again
    assert all(o.ok for o in collect_once(config, sessions, clock))
    assert count(sessions, ReplicaSampleRow) == 2
    assert target(sessions, "good").samples_refused == 1


def test_an_interval_job_pushed_an_hour_out_by_a_clock_step_runs_now() -> None:
    """After the wall clock steps back an hour, APScheduler 3 holds each interval job's next
    run an hour (plus its interval) away: the step-safe scheduler pulls it back to now."""
    ran = threading.Event()
    scheduler = StepSafeBackgroundScheduler()
    scheduler.add_job(ran.set, "interval", seconds=15, id="scrape")
    scheduler.add_job(lambda: None, "interval", seconds=15, id="idle")
    scheduler.start()
    try:
        stepped = datetime.now(scheduler.timezone) + timedelta(hours=1, seconds=15)
        scheduler.modify_job("scrape", next_run_time=stepped)  # what the step leaves behind
        scheduler.wakeup()
        assert ran.wait(10), "the job waited out the clock step"
        due = scheduler.get_job("scrape").next_run_time
        assert due - datetime.now(scheduler.timezone) <= timedelta(seconds=16)
    finally:
        scheduler.shutdown(wait=False)


def test_jobs_within_one_interval_are_left_alone() -> None:
    scheduler = StepSafeBackgroundScheduler()
    scheduler.start(paused=True)
    try:
        now = datetime.now(scheduler.timezone)
        scheduler.add_job(
            lambda: None, "interval", seconds=60, id="a", next_run_time=now + timedelta(seconds=59)
        )
        scheduler.add_job(
            lambda: None, "interval", seconds=60, id="b", next_run_time=now + timedelta(hours=2)
        )
        assert pull_back_stepped_jobs(scheduler, now) == ["b"]
        assert scheduler.get_job("a").next_run_time == now + timedelta(seconds=59)
    finally:
        scheduler.shutdown(wait=False)
