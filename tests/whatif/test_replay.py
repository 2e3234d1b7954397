"""The replay on a stored day of a twin replica: its baseline reproduces what the store
measured within the errors docs/explanation/whatif.md states, and each change moves the predicted
numbers the physically right way."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from kneepoint.config import load_config
from kneepoint.store import queries
from kneepoint.store.db import connect_store
from kneepoint.whatif import Change, Profile, predict
from kneepoint.whatif.history import History, load_history
from kneepoint.whatif.predict import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    assumed_settings,
    calibrate_replica,
    replica_shape,
)
from kneepoint.whatif.replay import (
    SLICE_SECONDS,
    Lengths,
    Load,
    Replay,
    load_of,
    replay,
    reuse_share,
)
from review import effects
from tests.whatif.conftest import REPLICA

pytestmark = pytest.mark.timeout(900)
# Short slices keep the test fast; the errors docs/explanation/whatif.md states hold at these
# too.
SLICE, REQUESTS = SLICE_SECONDS, 200
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
        return replay(self.profile, self.load, change, slice_seconds=SLICE, shared=self.shared)


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
    baseline = replay(profile, load, None, slice_seconds=SLICE, shared=shared)
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


def test_every_stored_bucket_is_replayed_in_order(setup: Setup) -> None:
    window = setup.baseline.window
    assert [run.seconds for run in window.buckets] == [b.seconds for b in setup.history.buckets]
    assert all(0 < run.slice_seconds <= SLICE + 5 for run in window.buckets)
    # Each bucket's counts come from its own slice: the busiest stored bucket's slice made
    # more tokens than the quietest's.
    rates = [b.requests_per_second for b in setup.history.buckets]
    busiest, quietest = rates.index(max(rates)), rates.index(min(rates))
    made = [run.counts["generation_tokens"] / run.slice_seconds for run in window.buckets]
    assert made[busiest] > made[quietest]


def test_each_bucket_has_its_stored_length_histograms(setup: Setup) -> None:
    """The twin stored its request length histograms; each bucket's are what it gained over
    the bucket, as many requests as its prompt token counter counted, with the same mean
    (the window's first and last buckets left out: their edges are the window's)."""
    buckets = [b for b in setup.history.buckets[1:-1] if b.prompt_tokens_mean]
    assert buckets
    for bucket in buckets:
        prompts, outputs = bucket.prompt_lengths, bucket.output_lengths
        assert prompts is not None and outputs is not None
        requests = bucket.requests_per_second * bucket.seconds
        assert prompts.count == pytest.approx(requests, rel=0.05, abs=3)  # edges: a scrape apart
        assert prompts.total / prompts.count == pytest.approx(bucket.prompt_tokens_mean, rel=0.02)
    assert setup.load.lengths_from_histograms == pytest.approx(1.0)


def test_lengths_drawn_from_a_bucket_keep_its_histogram(setup: Setup) -> None:
    bucket = max(setup.history.buckets, key=lambda b: b.requests_per_second)
    histogram = bucket.prompt_lengths
    assert histogram is not None
    lengths = Lengths.of(histogram, 1.0)
    rng = random.Random(7)
    draws = sorted(lengths.draw(rng) for _ in range(20_000))
    # The mean is the stored one (sum over count) …
    assert sum(draws) / len(draws) == pytest.approx(histogram.total / histogram.count, rel=0.03)
    # … and the median falls in the histogram's median bucket (scaled by the mean's factor).
    median = draws[len(draws) // 2] / lengths.scale
    half = histogram.count / 2
    index = next(i for i, c in enumerate(histogram.counts) if c >= half)
    lower = histogram.bounds[index - 1] if index else 0.0
    assert lower <= median <= histogram.bounds[index]
    # Without a histogram: log-normal around the mean.
    plain = Lengths.of(None, 500.0)
    assert not plain.from_histogram
    mean = sum(plain.draw(rng) for _ in range(20_000)) / 20_000
    assert mean == pytest.approx(500.0, rel=0.03)


def test_the_scheduler_flags_come_from_the_target_config_or_are_named_assumed(
    stored_day: tuple[Path, float],
) -> None:
    config = load_config(stored_day[0])
    sessions = connect_store(config.database)
    targets = [
        t.model_copy(update={"max_num_batched_tokens": 512}) if t.name == REPLICA else t
        for t in config.targets
    ]
    configured = config.model_copy(update={"targets": targets})
    with sessions() as session:
        stored = queries.targets(session)[REPLICA]
        plain = replica_shape(session, config, REPLICA)
        shape = replica_shape(session, configured, REPLICA)
    # The KV cache as cache_config_info reported it.
    assert (shape.num_gpu_blocks, shape.block_size) == (stored.num_gpu_blocks, stored.block_size)
    assert shape.max_num_batched_tokens == 512
    assert plain.max_num_batched_tokens == DEFAULT_MAX_NUM_BATCHED_TOKENS
    _, assumed = assumed_settings(configured, REPLICA, None, None, None)
    assert "max_num_batched_tokens" not in assumed
    assert {"max_num_seqs", "max_model_len"} <= set(assumed)
    _, given = assumed_settings(configured, REPLICA, 64, 8192, None)
    assert not {"max_num_seqs", "max_model_len", "max_num_batched_tokens"} & set(given)


def test_the_baseline_is_replayed_once_for_several_changes(
    setup: Setup, stored_day: tuple[Path, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file, now = stored_day
    config = load_config(config_file)
    sessions = connect_store(config.database)
    changes: list[Change | None] = []
    real = predict.replay

    def counting(profile: Profile, load: Load, change: Change | None = None, *a, **k):  # type: ignore[no-untyped-def]
        changes.append(change)
        return real(profile, load, change, *a, **k)

    monkeypatch.setattr(predict, "replay", counting)
    monkeypatch.setattr(predict, "latest_profile", lambda *_: setup.profile)
    predict._BASELINES.clear()
    wanted = [Change(kv_cache_dtype="fp8"), Change(max_num_seqs=8), Change(replicas=2)]
    with sessions() as session:
        for change in wanted[:2]:  # the page's way: the process cache
            result = predict.whatif_replica(
                session, config, REPLICA, change, now - 86400.0, now, profile=setup.profile
            )
            assert result.as_dict()["replay"]["buckets"] == len(setup.history.buckets)
        predictor = effects.store_predictor(session, config, now, 86400.0)
        predictor(REPLICA, {"replicas": 2})  # the review's way: the same cache
    baselines = [c for c in changes if c is None]
    assert len(baselines) == 1
    assert [c for c in changes if c is not None] == wanted
