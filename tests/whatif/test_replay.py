"""The replay on a stored day of a twin replica: its baseline reproduces what the store
measured within the errors docs/explanation/whatif.md states, and each change moves the predicted
numbers the physically right way."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from kneepoint.config import load_config
from kneepoint.store.db import connect_store
from kneepoint.whatif import Change, Profile
from kneepoint.whatif.history import History, load_history
from kneepoint.whatif.predict import calibrate_replica
from kneepoint.whatif.replay import Load, Replay, load_of, replay, reuse_share
from tests.whatif.conftest import REPLICA

pytestmark = pytest.mark.timeout(900)
# Small replays keep the test fast; the errors docs/explanation/whatif.md states hold at these
# too.
LEVELS, REQUESTS = 4, 200
# docs/explanation/whatif.md "How close the baseline is": the errors the replay is held to.
THROUGHPUT_ERROR = 0.15  # relative
OCCUPANCY_ERROR = 0.10  # absolute, KV occupancy p95
TTFT_P99_FACTOR = 2.0
PREEMPTION_FACTOR = 2.5


@dataclass
class Setup:
    profile: Profile
    history: History
    load: Load
    shared: float
    baseline: Replay

    def run(self, change: Change) -> Replay:
        return replay(
            self.profile, self.load, change, levels=LEVELS, requests=REQUESTS, shared=self.shared
        )


@pytest.fixture(scope="module")
def setup(stored_day: tuple[Path, float]) -> Setup:
    config_file, now = stored_day
    config = load_config(config_file)
    sessions = connect_store(config.database)
    with sessions() as session:
        profile = calibrate_replica(session, config, REPLICA, None, now - 86400.0, now)
        history = load_history(session, REPLICA, now - 86400.0, now)
    load = load_of(history)
    shared = reuse_share(profile, load, requests=REQUESTS)
    baseline = replay(profile, load, None, levels=LEVELS, requests=REQUESTS, shared=shared)
    return Setup(profile, history, load, shared, baseline)


def test_the_calibration_fits_sweep_and_history(setup: Setup) -> None:
    fit = setup.profile.fit
    assert fit.trusted, fit.reason
    assert {p.source for p in fit.points} == {"sweep", "history"}
    assert setup.profile.shape.gpu == "l4"
    assert setup.profile.shape.model == "qwen3-4b"


def test_the_baseline_reproduces_the_measured_day(setup: Setup) -> None:
    measured, baseline = setup.history.measured(), setup.baseline.numbers
    assert baseline["generation_tokens_per_second"] == pytest.approx(
        measured["generation_tokens_per_second"], rel=THROUGHPUT_ERROR
    )
    assert baseline["kv_cache_occupancy_p95"] == pytest.approx(
        measured["kv_cache_occupancy_p95"], abs=OCCUPANCY_ERROR
    )
    ratio = baseline["ttft_p99_seconds"] / measured["ttft_p99_seconds"]
    assert 1 / TTFT_P99_FACTOR <= ratio <= TTFT_P99_FACTOR
    assert measured["preemptions"] > 0  # the day does preempt: the comparison means something
    ratio = baseline["preemptions"] / measured["preemptions"]
    assert 1 / PREEMPTION_FACTOR <= ratio <= PREEMPTION_FACTOR


def test_fp8_kv_means_more_capacity_and_fewer_preemptions(setup: Setup) -> None:
    after = setup.run(Change(kv_cache_dtype="fp8")).numbers
    before = setup.baseline.numbers
    assert before["preemptions"] > 0
    assert after["preemptions"] < before["preemptions"]
    assert after["kv_cache_occupancy_p95"] < before["kv_cache_occupancy_p95"]
    assert after["saturated_seconds"] < before["saturated_seconds"]


def test_more_replicas_means_lower_occupancy(setup: Setup) -> None:
    after = setup.run(Change(replicas=2)).numbers
    before = setup.baseline.numbers
    assert after["kv_cache_occupancy_p95"] < before["kv_cache_occupancy_p95"]
    assert after["running_mean"] < before["running_mean"]
    # The same traffic is served: the fleet's throughput does not fall.
    assert after["generation_tokens_per_second"] >= 0.95 * before["generation_tokens_per_second"]


def test_round_robin_routing_loses_prefix_hits_that_sticky_routing_keeps(setup: Setup) -> None:
    sticky = setup.run(Change(replicas=2, routing="sticky")).numbers
    spread = setup.run(Change(replicas=2, routing="round-robin")).numbers
    assert spread["prefix_cache_hit_rate"] < sticky["prefix_cache_hit_rate"]


def test_traffic_growth_means_more_waiting(setup: Setup) -> None:
    after = setup.run(Change(growth=1.5)).numbers
    before = setup.baseline.numbers
    assert after["waiting_mean"] > before["waiting_mean"]
    assert after["ttft_p99_seconds"] > before["ttft_p99_seconds"]
    assert after["preemptions"] > before["preemptions"]
