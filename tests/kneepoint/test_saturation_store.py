"""The saturation verdict through `kneepoint status` on a seeded store: a prefill-heavy
replica (long prompts, a queue that builds, steps at the token budget, TTFT climbing) with
its KV cache at 30 % is saturated, and a light one is not."""

from __future__ import annotations

import copy
from pathlib import Path

from collectors.engines.vllm import parse_vllm
from kneepoint.config import Config
from kneepoint.samples import SATURATION, Histogram, ReplicaSample
from kneepoint.status import build_status
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets, record_replica_history
from tests.conftest import VLLM_032, read

NOW = 1_780_000_000.0
STEP = 10.0
SAMPLES = 31  # five minutes
STEP_BOUNDS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, float("inf"))


def cumulative(
    bounds: tuple[float, ...], per_bucket: dict[float, float], total: float
) -> Histogram:
    counts, running = [], 0.0
    for bound in bounds:
        running += per_bucket.get(bound, 0.0)
        counts.append(running)
    return Histogram(bounds, tuple(counts), float(total))


def sample(base: ReplicaSample, heavy: bool, i: int) -> ReplicaSample:
    s = copy.deepcopy(base)
    waiting = float(1 + i // 6) if heavy else 0.0  # 1 → 6: a queue that builds
    s.gauges.update(
        kv_cache_usage=0.30 if heavy else 0.05,
        kv_cache_usage_mean=0.30 if heavy else 0.05,
        requests_running=2.0 if heavy else float(i % 2),
        requests_waiting=waiting,
        requests_waiting_capacity=waiting,
    )
    for key, value in s.counters.items():
        if value is not None and key != "admission_rejections":  # nothing refused
            s.counters[key] = value + 10.0 * i
    # Tokens per step: the heavy replica's 3 prefill steps a scrape at the 2048-token budget
    # and one decode step; the light one's 20 decode steps and one short prompt.
    if heavy:
        steps = cumulative(STEP_BOUNDS, {2048.0: 3.0 * i, 1.0: float(i)}, 6145.0 * i)
    else:
        steps = cumulative(STEP_BOUNDS, {1.0: 20.0 * i, 16.0: float(i)}, 30.0 * i)
    s.histograms["iteration_tokens"] = steps
    ttft_bounds = base.histograms["ttft"].bounds
    # Two first tokens per scrape; each heavy one waits longer as the queue builds.
    ttft_total = sum(2 * (0.2 + 0.3 * (1 + k // 6)) for k in range(i)) if heavy else 0.05 * 2 * i
    s.histograms["ttft"] = cumulative(ttft_bounds, {ttft_bounds[-1]: 2.0 * i}, ttft_total)
    return s


def test_a_prefill_heavy_replica_is_saturated_with_its_kv_low(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/k.db"
    config = Config.model_validate(
        {
            "database": url,
            "targets": [
                {
                    "name": "heavy",
                    "kind": "vllm",
                    "url": "http://heavy/metrics",
                    "max_num_batched_tokens": 2048,
                },
                {"name": "light", "kind": "vllm", "url": "http://light/metrics"},
            ],
        }
    )
    base = parse_vllm(read(VLLM_032))
    sessions = open_store(url)
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for name in ("heavy", "light"):
            history = [
                (NOW - (SAMPLES - 1 - i) * STEP, sample(base, name == "heavy", i))
                for i in range(SAMPLES)
            ]
            record_replica_history(session, ids[name], history)
    with sessions() as session:
        status = build_status(session, config, NOW, 300.0, aggregate=False)
    by_name = {r["name"]: r for r in status["replicas"]}
    heavy, light = by_name["heavy"]["saturation"], by_name["light"]["saturation"]
    reasons = {r["reason"] for r in heavy["reasons"]}
    assert heavy["saturated"] is True
    assert {"queue_growing", "token_budget_full", "ttft_rising"} <= reasons
    assert "kv_full" not in reasons
    assert (by_name["heavy"]["kv_cache_occupancy"] or 1.0) < SATURATION
    budget = next(r for r in heavy["reasons"] if r["reason"] == "token_budget_full")
    assert budget["value"] == 0.75  # 3 of 4 steps a scrape at the budget
    assert light["reasons"] == [] and light["saturated"] is False
    assert status["fleet"]["saturated_replicas"] == 1
    # At fleet size the database reduces each replica's series (store/saturation_sql.py):
    # the same verdict, reasons and evidence as from the rows themselves.
    with sessions() as session:
        fleet = build_status(session, config, NOW, 300.0, aggregate=True)
    at_scale = {r["name"]: r["saturation"] for r in fleet["replicas"]}
    assert at_scale == {"heavy": heavy, "light": light}
