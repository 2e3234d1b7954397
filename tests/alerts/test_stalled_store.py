"""Stalled engines through the store: scrapes normalized from the real vLLM 0.32 capture
(its counters set per sample), stored as the collector stores them, read back, and counted
as stalled time by the availability SLOs (alerts/evaluate.py `measure`)."""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from alerts.evaluate import measure
from collectors.engines.vllm import parse_vllm
from kneepoint.config import Config, load_config
from kneepoint.derived.stall import STALL_AFTER
from kneepoint.samples import ReplicaSample
from kneepoint.store import queries
from kneepoint.store.db import open_store
from kneepoint.store.models import ReplicaRollupRow
from kneepoint.store.rollup import REPLICA_SHAPE, summarize
from kneepoint.store.writer import ensure_targets, record_replica
from tests.conftest import VLLM_032, migrated, read

STEP = 15.0  # seconds between stored scrapes (the default scrape interval)
NAME = "r"


def capture() -> ReplicaSample:
    return parse_vllm(read(VLLM_032))


def _exposed_steps(text: str) -> float:
    """The capture's own iteration_tokens_total_count, read without the parser."""
    name = "vllm:iteration_tokens_total_count"
    lines = [line for line in text.splitlines() if line.startswith(name)]
    return sum(float(line.split()[-1]) for line in lines)


def test_normalizing_the_real_capture_gives_its_engine_step_count() -> None:
    text = read(VLLM_032)
    steps = parse_vllm(text).counters["engine_steps"]
    assert steps is not None and steps > 0
    assert steps == _exposed_steps(text)


def store(tmp_path: Path, rules: str = "") -> Config:
    tmp_path.mkdir(parents=True, exist_ok=True)
    config_file = tmp_path / "kneepoint.yaml"
    config_file.write_text(f"""
database: sqlite:///{tmp_path / "k.db"}
targets:
  - {{name: {NAME}, kind: vllm, url: "http://127.0.0.1:9/metrics"}}
slos:
  - {{name: up, kind: availability, objective: 0.99}}
{rules}
""")
    return load_config(migrated(config_file))


def busy_scrapes(count: int, steps_move: bool) -> list[ReplicaSample]:
    """`count` scrapes with requests running and waiting and token counters that stand
    still; the engine's step counter moves at every scrape or stands still too."""
    base = capture()
    start_steps = base.counters["engine_steps"]
    assert start_steps is not None
    scrapes = []
    for i in range(count):
        sample = copy.deepcopy(base)
        sample.gauges["requests_running"] = 2.0
        sample.gauges["requests_waiting"] = 1.0
        sample.counters["engine_steps"] = start_steps + (i if steps_move else 0)
        scrapes.append(sample)
    return scrapes


def record(config: Config, scrapes: list[ReplicaSample], start: float) -> list[float]:
    times = [start + i * STEP for i in range(len(scrapes))]
    with open_store(config.database).begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for ts, sample in zip(times, scrapes, strict=True):
            record_replica(session, ids[NAME], ts, sample)
    return times


def stalled_seconds(config: Config, times: list[float]) -> float:
    with open_store(config.database).begin() as session:
        counted = measure(session, config, times[0], times[-1]).availability
    assert counted is not None and counted.seconds > 0
    return counted.stalled


# Scrapes enough that the frozen stretch outlasts STALL_AFTER.
LONG = int(STALL_AFTER // STEP) + 3


@pytest.mark.parametrize("steps_move", [True, False], ids=["engine steps", "engine frozen"])
def test_the_stored_step_counter_decides_a_stall_while_tokens_stand_still(
    tmp_path: Path, steps_move: bool
) -> None:
    config = store(tmp_path)
    scrapes = busy_scrapes(LONG, steps_move)
    times = record(config, scrapes, float(int(time.time())) - LONG * STEP)
    with open_store(config.database)() as session:
        frame = queries.replica_frame(session, times[0], times[-1], columns=queries.LIGHT_COLUMNS)
    assert list(frame.engine_steps) == [s.counters["engine_steps"] for s in scrapes]
    assert frame.generation_tokens.nunique() == 1 and frame.prompt_tokens.nunique() == 1
    stalled = stalled_seconds(config, times)
    assert stalled == (0.0 if steps_move else pytest.approx(times[-1] - times[0]))


def override(seconds: float) -> str:
    return f"""rules:
  - {{name: engine-stalled, metric: engine_stalled, op: "==", threshold: 1, for: {seconds}}}
"""


def test_an_overridden_for_on_engine_stalled_is_what_the_slos_count(tmp_path: Path) -> None:
    """A stall longer than the default 60 s but shorter than an overridden `for` is no
    stalled time; one shorter than the default but past a shorter `for` is."""
    frozen = busy_scrapes(LONG, steps_move=False)
    span = (LONG - 1) * STEP
    assert span >= STALL_AFTER
    now = float(int(time.time()))
    cases = {
        "default": ("", span),
        "longer": (override(span + STEP), 0.0),
    }
    for name, (rules, expected) in cases.items():
        config = store(tmp_path / name, rules)
        times = record(config, frozen, now - LONG * STEP)
        assert stalled_seconds(config, times) == pytest.approx(expected), name

    short = busy_scrapes(3, steps_move=False)  # two intervals: under the default 60 s
    short_span = 2 * STEP
    assert short_span < STALL_AFTER
    for name, (rules, expected) in {
        "short default": ("", 0.0),
        "shorter": (override(short_span), short_span),
    }.items():
        config = store(tmp_path / name, rules)
        times = record(config, short, now - 3 * STEP)
        assert stalled_seconds(config, times) == pytest.approx(expected), name


def test_the_summary_tiers_keep_the_step_counter_and_the_rows_around_its_reset(
    tmp_path: Path,
) -> None:
    """A 5-minute summary row keeps its bucket's last step count as stored, and the sample
    before the counter went down (an engine restart) is kept, as for every counter."""
    config = store(tmp_path)
    count = int(3 * 300 // STEP)  # three 5-minute buckets
    scrapes = busy_scrapes(count, steps_move=True)
    reset_at = count // 2 + 1
    for i, sample in enumerate(scrapes[reset_at:]):
        sample.counters["engine_steps"] = float(i)  # restarted: counting from 0 again
    start = math.floor(time.time() / 300) * 300 - 5 * 300
    times = record(config, scrapes, start)
    stored = {ts: s.counters["engine_steps"] for ts, s in zip(times, scrapes, strict=True)}
    with open_store(config.database).begin() as session:
        assert summarize(session, REPLICA_SHAPE, times[-1] + 600) > 0
        rows = session.execute(
            select(ReplicaRollupRow.ts, ReplicaRollupRow.engine_steps).where(
                ReplicaRollupRow.resolution == 300
            )
        ).all()
    assert rows and all(steps == stored[ts] for ts, steps in rows)
    assert times[reset_at - 1] in {ts for ts, _ in rows}  # the last count before the reset
