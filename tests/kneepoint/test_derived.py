"""The derived numbers with values worked out by hand, on real captures and each older
generation. A server's counters start at zero, so a zero scrape and a capture are two
scrapes of one server whose window holds everything the capture counted."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectors.engines.vllm import parse_vllm
from kneepoint.config import Config, Pricing, Target
from kneepoint.derived import ratios
from kneepoint.derived.latency import histogram_quantile, quantiles, window_histogram
from kneepoint.samples import Histogram, ReplicaSample
from kneepoint.status import build_status
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets, record_replica
from tests.conftest import OWN_FIXTURES, VLLM_032, read

INF = math.inf


def zeroed(sample: ReplicaSample) -> ReplicaSample:
    """The same server at start-up: every counter and histogram at 0."""
    zero = copy.deepcopy(sample)
    zero.counters = {k: (0.0 if v is not None else None) for k, v in zero.counters.items()}
    zero.histograms = {
        k: Histogram(h.bounds, tuple(0.0 for _ in h.counts), 0.0)
        for k, h in zero.histograms.items()
    }
    if zero.accepted_per_position is not None:
        zero.accepted_per_position = [0.0] * len(zero.accepted_per_position)
    return zero


def status_of(tmp_path: Path, *captures: Path, pricing: Pricing | None = None) -> dict:
    """Store, per capture, a zero scrape at t=1000 and the capture at t=1060."""
    names = [f"r{i}" for i in range(len(captures))]
    config = Config(
        database=f"sqlite:///{tmp_path / 's.db'}",
        targets=[Target(name=n, kind="vllm", url=f"http://{n}/m") for n in names],
        pricing=pricing or Pricing(),
    )
    sessions = open_store(config.database)
    with sessions.begin() as session:
        ids = ensure_targets(session, [(n, "vllm", f"http://{n}/m") for n in names])
        for name, capture in zip(names, captures, strict=True):
            sample = parse_vllm(read(capture))
            record_replica(session, ids[name], 1000.0, zeroed(sample))
            record_replica(session, ids[name], 1060.0, sample)
    with sessions() as session:
        return build_status(session, config, now=1060.0, window=300.0)


def test_prefix_hit_rate_and_latency_quantiles_of_the_real_capture(tmp_path: Path) -> None:
    [replica] = status_of(tmp_path, VLLM_032)["replicas"]
    assert replica["prefix_cache_hit_rate"] == pytest.approx(17024 / 25095)
    # TTFT buckets (cumulative): ≤0.25: 28, ≤0.5: 45, ≤0.75: 59, ≤1.0: 64 of 64.
    # p50: rank 32 lies in (0.25, 0.5]: 0.25 + 0.25 × (32 − 28) / (45 − 28)
    # p90: rank 57.6 in (0.5, 0.75]: 0.5 + 0.25 × (57.6 − 45) / (59 − 45)
    # p99: rank 63.36 in (0.75, 1.0]: 0.75 + 0.25 × (63.36 − 59) / (64 − 59)
    assert replica["ttft_seconds"] == pytest.approx(
        {"p50": 0.25 + 0.25 * 4 / 17, "p90": 0.5 + 0.25 * 12.6 / 14, "p99": 0.75 + 0.25 * 4.36 / 5}
    )
    # E2E: ≤0.3: 7, ≤0.5: 16, ≤1.0: 16, ≤1.5: 57, ≤2.0: 64 of 64.
    assert replica["e2e_seconds"]["p50"] == pytest.approx(1.0 + 0.5 * (32 - 16) / 41)
    assert replica["itl_seconds"]["p50"] == pytest.approx(0.01 + 0.015 * (1182 - 1009) / 1259)
    # Nothing was preempted; no drafter: no spec numbers at all.
    assert replica["preemption_recompute_tokens"] == 0
    assert replica["preemption_recompute_is_estimate"] is True
    assert replica["spec_decode_acceptance_rate"] is None


def test_preemption_recompute_on_v1_is_an_estimate_by_the_stated_formula(tmp_path: Path) -> None:
    capture = OWN_FIXTURES / "vllm-0.32.0-cpu-preemption-under-load.prom"
    [replica] = status_of(tmp_path, capture)["replicas"]
    # 24 preemptions; 17 finished requests with 739 prompt and 5100 generated tokens;
    # prefix hit rate 0 / 1047 = 0.
    per_preemption = 739 / 17 + 0.5 * 5100 / 17
    assert replica["preemptions"] == 24
    assert replica["preemption_recompute_tokens"] == pytest.approx(24 * per_preemption)
    assert replica["preemption_recompute_is_estimate"] is True
    assert replica["prefix_cache_hit_rate"] == 0.0
    assert "estimate" in ratios.RECOMPUTE_FORMULA


def test_preemption_recompute_on_v0_is_exact(tmp_path: Path) -> None:
    [replica] = status_of(tmp_path, OWN_FIXTURES / "vllm-0.5.5-v0.prom")["replicas"]
    # v0 counts re-prefills in prompt_tokens: 1,523,000 − 1,480,000 requests' own prompts.
    assert replica["preemption_recompute_tokens"] == 43000
    assert replica["preemption_recompute_is_estimate"] is False
    assert replica["prefix_cache_hit_rate"] == 0.64  # v0's own block-level gauge


def test_a_drafter_that_never_hits_is_slowing_the_engine(tmp_path: Path) -> None:
    capture = OWN_FIXTURES / "vllm-0.32.0-cpu-ngram-spec-decode.prom"
    [replica] = status_of(tmp_path, capture)["replicas"]
    assert replica["spec_decode_acceptance_rate"] == 0.0  # 0 of 322 drafted tokens
    assert replica["spec_decode_mean_acceptance_length"] == 1.0  # 1 + 0 / 109 drafts
    assert replica["spec_decode_per_position_acceptance"] == [0.0, 0.0, 0.0]
    spec = ratios.spec_decode(109, 322, 0, [0, 0, 0])
    assert spec.expected_speedup == pytest.approx(1 / 1.3)  # (1 − 0⁴)/(1 − 0)/(1 + 0.1 × 3)
    assert spec.verdict == "slowing down"


def test_speculative_decoding_verdicts() -> None:
    # α = 0.8, γ = 3, c = 0.1: (1 − 0.8⁴) / 0.2 / 1.3 = 2.952 / 1.3
    good = ratios.spec_decode(1000, 3000, 2400, [800, 640, 512 + 448])
    assert good.acceptance_rate == 0.8
    assert good.mean_acceptance_length == 3.4
    assert good.per_position == [0.8, 0.64, 0.96]
    assert good.expected_speedup == pytest.approx((1 - 0.8**4) / 0.2 / 1.3)
    assert good.verdict == "paying off"
    assert ratios.verdict(1.05) == "marginal"


def test_cost_per_million_tokens_counts_the_gpu_hours_of_the_window(tmp_path: Path) -> None:
    pricing = Pricing(gpu_hour={"default": 3.0}, extra_monthly=2592.0)  # $0.001 per second
    [replica] = status_of(tmp_path, VLLM_032, pricing=pricing)["replicas"]
    cost = 3.0 * 60 / 3600 + 2592.0 * 60 / (30 * 86400)
    assert replica["cost_per_million_generated_tokens"] == pytest.approx(cost / 2428 * 1e6)
    assert replica["cost_per_million_tokens"] == pytest.approx(cost / (2428 + 25095) * 1e6)


def test_the_fleet_weights_hit_rates_by_tokens_and_adds_histograms(tmp_path: Path) -> None:
    status = status_of(
        tmp_path, VLLM_032, OWN_FIXTURES / "vllm-0.32.0-cpu-preemption-under-load.prom"
    )
    fleet = status["fleet"]
    # Σ hits ÷ Σ queries, not the mean of 0.678 and 0.
    assert fleet["prefix_cache_hit_rate"] == pytest.approx((17024 + 0) / (25095 + 1047))
    assert fleet["preemption_recompute_tokens"] == pytest.approx(
        sum(r["preemption_recompute_tokens"] for r in status["replicas"])
    )


def test_one_scrape_gives_no_windowed_numbers(tmp_path: Path) -> None:
    config = Config(
        database=f"sqlite:///{tmp_path / 's.db'}",
        targets=[Target(name="r", kind="vllm", url="http://r/m")],
    )
    sessions = open_store(config.database)
    with sessions.begin() as session:
        target = ensure_targets(session, [("r", "vllm", "http://r/m")])["r"]
        record_replica(session, target, 1000.0, parse_vllm(read(VLLM_032)))
    with sessions() as session:
        [replica] = build_status(session, config, 1000.0, 60.0)["replicas"]
    for key in (
        "prefix_cache_hit_rate",
        "ttft_seconds",
        "cost_per_million_tokens",
        "preemption_recompute_tokens",
        "spec_decode_acceptance_rate",
    ):
        assert replica[key] is None, key
    assert replica["kv_cache_occupancy"] == 0.0  # a point value needs one scrape only


def test_null_cases_of_the_ratios() -> None:
    assert ratios.hit_rate(0, 0) is None  # caching off or idle: no queries, no rate
    assert ratios.hit_rate(None, 100) is None
    assert ratios.recompute("v1", None, 1, 1, 1, 1, 1, 0.5).tokens is None
    assert ratios.recompute("v1", 3, 100, None, None, None, None, None).tokens is None
    assert ratios.spec_decode(None, None, None, None).verdict is None
    assert quantiles(None) is None
    assert histogram_quantile(0.5, Histogram((1.0, INF), (0.0, 0.0), 0.0)) is None


def test_histogram_quantile_follows_promql_at_the_edges() -> None:
    histogram = Histogram((0.1, 0.5, 1.0, INF), (10.0, 60.0, 90.0, 100.0), 40.0)
    assert histogram_quantile(0.5, histogram) == pytest.approx(0.1 + 0.4 * 40 / 50)
    assert histogram_quantile(0.99, histogram) == 1.0  # in +Inf: the highest finite bound
    assert histogram_quantile(0.05, histogram) == pytest.approx(0.05)  # from 0 in bucket 1


def test_a_window_histogram_survives_a_restart() -> None:
    bounds = (0.1, 1.0, INF)
    before = Histogram(bounds, (50.0, 80.0, 90.0), 30.0)
    later = Histogram(bounds, (60.0, 95.0, 110.0), 40.0)
    restarted = Histogram(bounds, (5.0, 8.0, 9.0), 3.0)
    window = window_histogram([before, later, restarted])
    assert window is not None
    assert window.counts == (15.0, 23.0, 29.0)  # (10 + 5, 15 + 8, 20 + 9)
    assert window.total == 13.0


cumulative = st.lists(st.integers(0, 50), min_size=2, max_size=12).map(
    lambda steps: tuple(float(sum(steps[: i + 1])) for i in range(len(steps)))
)


@given(cumulative, st.floats(0.01, 0.99), st.floats(0.01, 0.99))
def test_quantiles_rise_with_q_and_stay_within_the_finite_bounds(
    counts: tuple[float, ...], q1: float, q2: float
) -> None:
    bounds = (*(float(2**i) for i in range(len(counts) - 1)), INF)
    histogram = Histogram(bounds, counts, 1.0)
    low, high = sorted((q1, q2))
    a, b = histogram_quantile(low, histogram), histogram_quantile(high, histogram)
    if counts[-1] == 0:
        assert a is None and b is None
        return
    assert a is not None and b is not None
    assert 0.0 <= a <= b <= bounds[-2] if len(bounds) > 1 else True


@given(st.lists(st.tuples(st.integers(0, 20), st.booleans()), min_size=2, max_size=30))
def test_window_histograms_never_go_negative(steps: list[tuple[int, bool]]) -> None:
    samples, value = [], 0.0
    for delta, restart in steps:
        value = float(delta) if restart else value + delta
        samples.append(Histogram((1.0, INF), (value, value), value))
    window = window_histogram(samples)
    assert window is not None
    assert all(count >= 0 for count in window.counts)
    assert list(window.counts) == sorted(window.counts)


def test_economics_against_the_knee_worked_by_hand() -> None:
    from kneepoint.config import ApiReference
    from kneepoint.derived.cost import economics

    api = ApiReference(input_per_mtok=0.15, output_per_mtok=0.60)
    # An H100 at $2.49/h whose knee is 2,000 generated tok/s, serving 500 tok/s with 4 prompt
    # tokens per generated one, at a true cost of $1.40 per 1M generated tokens.
    money = economics(2.49, "h100-sweep", 2000.0, 500.0, 4.0, 1.40, api)
    nominal = 2.49 / (2000 * 3600) * 1e6  # $0.3458 per 1M generated tokens
    assert money.nominal_cost_per_million_generated_tokens == pytest.approx(nominal)
    assert money.utilization == pytest.approx(0.25)
    assert money.true_over_nominal == pytest.approx(1.40 / nominal)
    api_cost = 4 * 0.15 + 0.60  # the API's price for the same mix: $1.20 per 1M generated
    assert money.api_cost_per_million_generated_tokens == pytest.approx(api_cost)
    assert money.break_even_utilization == pytest.approx(nominal / api_cost)
    assert money.knee_run == "h100-sweep"
    # No knee known: only the API's price, the rest null.
    none = economics(2.49, None, None, 500.0, 4.0, 1.40, api)
    assert none.nominal_cost_per_million_generated_tokens is None
    assert none.utilization is None and none.break_even_utilization is None
    assert none.api_cost_per_million_generated_tokens == pytest.approx(api_cost)


def test_a_replica_is_held_to_its_own_sweep_before_its_models() -> None:
    from kneepoint.knee.detect import assess, knee_for_replica, knee_throughput
    from kneepoint.knee.runs import Point, Run

    def run(label: str, model: str, top: float) -> Run:
        steps = {1: top / 20, 32: top * 0.9, 64: top}
        return Run(label, model, "sweep", tuple(Point(c, t) for c, t in steps.items()))

    runs = [
        assess(run("replica-a-sweep", "m", 1000)),
        assess(run("other-model", "n", 5000)),
        assess(run("newer-of-m", "m", 2000)),
    ]
    assert knee_for_replica("replica-a", ["m"], runs) is runs[0]
    assert knee_for_replica("replica-b", ["m"], runs) is runs[2]
    assert knee_for_replica("replica-c", ["x"], runs) is None
    assert knee_throughput(runs[2]) == pytest.approx(1800)
    assert knee_throughput(None) is None
