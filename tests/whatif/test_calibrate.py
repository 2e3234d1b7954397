"""Calibration on the twin: it recovers a profile's known step cost from the profile's own
sweep, model-agnostic shapes work, a poor fit is not trusted and predicts nothing; and the
same from runs of agent traffic (calibrate_trace, predict_trace)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kneepoint.knee.runs import Point
from kneepoint.twin.ladder import ladder_run
from kneepoint.twin.profiles import gpu, model
from kneepoint.twin.simulated_engine import EngineConfig, StepCost
from kneepoint.whatif import (
    TRUST_RMS,
    AgentTrace,
    EngineShape,
    FitQuality,
    TraceMeasurement,
    UntrustedProfile,
    WhatIfError,
    agent_trace,
    calibrate_sweep,
    calibrate_trace,
    predict_sweep,
    predict_trace,
    simulate_trace,
)
from kneepoint.whatif.calibrate import TRACE_ITERATIONS

LADDER = (1, 4, 16, 32, 64)
# Recovery tolerance: the twin's schedule of a closed-loop sweep does not depend on its step
# times, so the equations are exact and the fit should land within rounding.
TOLERANCE = 0.02


def workshop() -> EngineConfig:
    return EngineConfig(gpu("rtx4000ada"), model("qwen3-4b"), max_num_seqs=32)


def test_the_default_cost_is_the_profile_physics() -> None:
    """An engine given StepCost.of(config) explicitly behaves exactly as the default one."""
    config = workshop()
    explicit = dataclasses.replace(config, step_cost=StepCost.of(config))
    default_run = ladder_run(config, "a", "m", (1, 32))
    explicit_run = ladder_run(explicit, "b", "m", (1, 32))
    assert [p.output_tokens_per_second for p in default_run.points] == [
        p.output_tokens_per_second for p in explicit_run.points
    ]
    assert StepCost.of(config).weight_read_seconds > StepCost.of(config).overhead_seconds


def test_calibration_recovers_the_profile_parameters_from_its_own_sweep() -> None:
    config = workshop()
    truth = StepCost.of(config)
    run = ladder_run(config, "workshop", "Qwen/Qwen3-4B", LADDER)
    profile = calibrate_sweep(run.points, EngineShape.of(config), 256, 128)
    fitted = profile.cost
    assert profile.fit.trusted, profile.fit.reason
    assert profile.fit.rms < TOLERANCE
    per_step = truth.overhead_seconds + truth.weight_read_seconds
    assert fitted.overhead_seconds + fitted.weight_read_seconds == pytest.approx(
        per_step, rel=TOLERANCE
    )
    assert fitted.token_seconds == pytest.approx(truth.token_seconds, rel=TOLERANCE)
    assert fitted.context_token_seconds == pytest.approx(truth.context_token_seconds, rel=TOLERANCE)
    # Terms the twin does not have are fitted at (about) nothing.
    assert fitted.prefill_token_seconds < TOLERANCE * truth.token_seconds
    assert fitted.request_overhead_seconds < TOLERANCE * per_step


def test_calibration_recovers_a_drafters_cost() -> None:
    """A replica with a speculative drafter: the draft term is fitted too (the verifier's
    acceptances come from the engine's seeded generator, the same in the fit's schedule)."""
    config = EngineConfig(
        gpu("h100-80gb"),
        model("llama-3.1-8b"),
        num_speculative_tokens=3,
        spec_acceptance_rate=0.7,
        spec_draft_cost=0.08,
    )
    truth = StepCost.of(config)
    run = ladder_run(config, "spec", "llama", LADDER)
    profile = calibrate_sweep(run.points, EngineShape.of(config), 256, 128)
    assert profile.fit.trusted, profile.fit.reason
    assert profile.cost.draft_token_seconds == pytest.approx(
        truth.draft_token_seconds, rel=TOLERANCE
    )
    assert profile.cost.token_seconds == pytest.approx(truth.token_seconds, rel=TOLERANCE)


def cpu_like() -> tuple[EngineConfig, EngineShape, StepCost]:
    """An engine with no GPU or model profile: blocks and step cost given outright."""
    cost = StepCost(
        overhead_seconds=0.004,
        token_seconds=0.0008,
        context_token_seconds=2e-6,
        request_overhead_seconds=0.0,
    )
    shape = EngineShape(num_gpu_blocks=240, block_size=16, max_num_seqs=16, max_model_len=2048)
    return shape.engine_config(cost), shape, cost


def test_a_model_agnostic_shape_is_calibrated_and_predicts_a_changed_configuration() -> None:
    config, shape, truth = cpu_like()
    run = ladder_run(config, "cpu", "tiny", (1, 2, 4, 8, 16), input_tokens=128, output_tokens=32)
    profile = calibrate_sweep(run.points, shape, 128, 32, replica="cpu")
    assert profile.fit.trusted, profile.fit.reason
    assert profile.cost.token_seconds == pytest.approx(truth.token_seconds, rel=TOLERANCE)
    # Half the blocks: the twin at that configuration is what the prediction must say.
    half = shape.num_gpu_blocks // 2
    predicted = predict_sweep(profile, {"num_gpu_blocks": half}, (1, 8, 16), 128, 32)
    actual = ladder_run(
        dataclasses.replace(config, num_gpu_blocks_override=half),
        "half",
        "tiny",
        (1, 8, 16),
        input_tokens=128,
        output_tokens=32,
    )
    for guess, seen in zip(predicted, actual.points, strict=True):
        assert guess.output_tokens_per_second == pytest.approx(
            seen.output_tokens_per_second, rel=0.05
        )
        assert guess.ttft_mean_seconds == pytest.approx(seen.ttft_mean_seconds, rel=0.05)
    as_calibrated = predict_sweep(profile, None, (16,), 128, 32)[0]
    assert predicted[-1].preemptions > as_calibrated.preemptions == 0
    assert predicted[-1].output_tokens_per_second < as_calibrated.output_tokens_per_second


def test_a_fit_too_poor_is_not_trusted_and_predicts_nothing() -> None:
    config, shape, _ = cpu_like()
    run = ladder_run(config, "cpu", "tiny", (1, 2, 4, 8, 16), input_tokens=128, output_tokens=32)
    # Throughput that falls as concurrency rises while latency stays put: no step cost
    # gives that, so the fit misses by far more than the threshold.
    scrambled = [
        Point.from_dict({**p.as_dict(), "output_tokens_per_second": 500.0 / p.concurrency})
        for p in run.points
    ]
    profile = calibrate_sweep(scrambled, shape, 128, 32)
    assert not profile.fit.trusted
    assert profile.fit.rms > TRUST_RMS
    assert "above" in profile.fit.reason
    with pytest.raises(UntrustedProfile, match="not trusted"):
        predict_sweep(profile, None, (1, 2))


def test_a_profile_round_trips_through_its_dict() -> None:
    config, shape, _ = cpu_like()
    run = ladder_run(config, "cpu", "tiny", (1, 4, 16), input_tokens=128, output_tokens=32)
    profile = calibrate_sweep(run.points, shape, 128, 32, replica="cpu", now=1.0)
    again = type(profile).from_dict(profile.as_dict())
    assert again.cost == profile.cost
    assert again.shape == profile.shape
    assert again.fit.trusted == profile.fit.trusted
    assert [p.relative_error for p in again.fit.points] == [
        p.relative_error for p in profile.fit.points
    ]


# --- Calibrating from agent traffic (kneepoint.whatif.trace) ----------------------------

TRACE_LOADS = (1, 4, 8)


def agent_traffic(think: float) -> AgentTrace:
    return agent_trace(
        2,
        sessions=12,
        turns=4,
        system_tokens=64,
        tool_tokens=(16, 48),
        output_tokens=(8, 24),
        think_seconds=think,
        max_context=1024,
    )


def measured_runs(config: EngineConfig, trace: AgentTrace) -> list[TraceMeasurement]:
    """What a bench would measure: the twin itself, at the truth's cost."""
    out = []
    for load in TRACE_LOADS:
        run = simulate_trace(config, trace, load)
        out.append(
            TraceMeasurement(
                load=load,
                wall_seconds=run.wall_seconds,
                generated_tokens=run.generated_tokens,
                ttft_mean=float(run.ttfts.mean()),
                itl_mean=float(run.itls.mean()),
                ttft_p95=run.ttft_quantile(0.95),
            )
        )
    return out


def agent_engine() -> tuple[EngineConfig, EngineShape, StepCost]:
    truth = StepCost(
        overhead_seconds=0.004,
        token_seconds=0.0008,
        context_token_seconds=2e-6,
        request_overhead_seconds=0.003,
    )
    shape = EngineShape(num_gpu_blocks=120, block_size=16, max_num_seqs=8, max_model_len=1024)
    return shape.engine_config(truth), shape, truth


def test_calibration_from_agent_traffic_without_think_time_recovers_the_cost() -> None:
    """Calibration loads run without think time: the schedule does not depend on the cost,
    so one fit recovers it (agent traffic: growing prompts, prefix hits, varied lengths)."""
    config, shape, truth = agent_engine()
    trace = agent_traffic(think=0.5).with_think(0.0)
    profile = calibrate_trace(measured_runs(config, trace), shape, trace, replica="cpu")
    assert profile.fit.trusted, profile.fit.reason
    assert profile.fit.rms < TOLERANCE
    assert profile.notes["fits"] == 1 and profile.notes["converged"]
    fitted = profile.cost
    assert fitted.overhead_seconds + fitted.weight_read_seconds == pytest.approx(
        truth.overhead_seconds, rel=TOLERANCE
    )
    for name in ("token_seconds", "context_token_seconds", "request_overhead_seconds"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=TOLERANCE), name
    assert {p.metric for p in profile.fit.points} == {"throughput", "ttft_mean", "itl_mean"}


def test_a_trace_prediction_is_the_twin_at_the_changed_configuration() -> None:
    """Calibrated without think time, predicted for the agent traffic with it: each change
    gives what the twin at the truth's cost gives at the changed configuration."""
    config, shape, _ = agent_engine()
    calibration = agent_traffic(think=0.05).with_think(0.0)
    profile = calibrate_trace(measured_runs(config, calibration), shape, calibration)
    trace = agent_traffic(think=0.05)
    loads = (2, 8)
    changes: list[tuple[dict[str, object], int, EngineConfig]] = [
        ({"num_gpu_blocks": 60}, 1, dataclasses.replace(config, num_gpu_blocks_override=60)),
        ({"max_num_seqs": 4}, 1, dataclasses.replace(config, max_num_seqs=4)),
        (
            {"max_num_batched_tokens": 64},
            1,
            dataclasses.replace(config, max_num_batched_tokens=64),
        ),
        (
            {"enable_prefix_caching": False},
            1,
            dataclasses.replace(config, enable_prefix_caching=False),
        ),
        ({"replicas": 2}, 2, config),
    ]
    for change, engines, changed in changes:
        predicted = predict_trace(profile, change, trace, loads)
        for guess, load in zip(predicted, loads, strict=True):
            # The prediction is the twin at the profile's cost, changed...
            at_profile = dataclasses.replace(changed, step_cost=profile.cost)
            same = simulate_trace(at_profile, trace, load, engines=engines)
            assert guess.engines == engines
            assert guess.output_tokens_per_second == same.output_tokens_per_second
            assert guess.ttft_p95 == same.ttft_quantile(0.95)
            assert guess.itl_p95 == same.itl_quantile(0.95)
            assert guess.waiting_mean == same.waiting_mean
            assert guess.preemptions == same.preemptions
            # ...and that cost is the truth's: the twin at the truth's cost agrees.
            seen = simulate_trace(changed, trace, load, engines=engines)
            assert guess.output_tokens_per_second == pytest.approx(
                seen.output_tokens_per_second, rel=TOLERANCE
            ), change
            assert guess.ttft_p50 == pytest.approx(seen.ttft_quantile(0.5), rel=TOLERANCE)
            assert guess.itl_p50 == pytest.approx(seen.itl_quantile(0.5), rel=TOLERANCE)
            assert guess.requests == trace.requests
    # The changes changed something: fewer blocks preempt, no caching hits nothing.
    base = predict_trace(profile, None, trace, (8,))[0]
    as_json = json.loads(json.dumps(base.as_dict()))
    assert as_json["ttft_p95"] == base.ttft_p95
    assert as_json["output_tokens_per_second_bounds"] == list(base.output_tokens_per_second_bounds)
    assert predict_trace(profile, {"num_gpu_blocks": 60}, trace, (8,))[0].preemptions > (
        base.preemptions
    )
    uncached = predict_trace(profile, {"enable_prefix_caching": False}, trace, (8,))[0]
    assert uncached.prefix_cache_hit_rate == 0.0 < (base.prefix_cache_hit_rate or 0.0)


def test_an_ngram_drafter_is_predicted_with_the_measured_acceptance_and_no_draft_cost() -> None:
    config, shape, _ = agent_engine()
    trace = agent_traffic(think=0.0)
    profile = calibrate_trace(measured_runs(config, trace), shape, trace)
    change = {"num_speculative_tokens": 3, "spec_acceptance_rate": 0.6}
    guess = predict_trace(profile, change, trace, (4,), ngram=True)[0]
    drafted = dataclasses.replace(
        config,
        num_speculative_tokens=3,
        spec_acceptance_rate=0.6,
        step_cost=dataclasses.replace(profile.cost, draft_token_seconds=0.0),
    )
    same = simulate_trace(drafted, trace, 4)
    assert guess.output_tokens_per_second == same.output_tokens_per_second
    assert guess.itl_p95 == same.itl_quantile(0.95)
    # One session at a time the step's fixed part dominates: 2.2 tokens a step (γ 3, α 0.6)
    # for 4 tokens' compute beats 1 token a step; at 4 sessions compute tips it the other way.
    alone, plain_alone = (
        predict_trace(profile, c, trace, (1,), ngram=True)[0] for c in (change, None)
    )
    assert alone.output_tokens_per_second > plain_alone.output_tokens_per_second
    plain = predict_trace(profile, None, trace, (4,))[0]
    assert guess.output_tokens_per_second < plain.output_tokens_per_second


def test_with_think_time_the_fit_is_the_twins_own_at_the_fitted_cost() -> None:
    """Think times make the schedule depend on the cost: the fit iterates, and what it
    reports is what the twin at the fitted cost reproduces on its own schedule."""
    config, shape, _ = agent_engine()
    trace = agent_traffic(think=0.05)
    measured = measured_runs(config, trace)
    profile = calibrate_trace(measured, shape, trace)
    assert 1 <= profile.notes["fits"] <= TRACE_ITERATIONS
    fitted = {(p.load, p.metric): p.fitted for p in profile.fit.points}
    for m in measured:
        run = simulate_trace(profile.engine_config(), trace, m.load)
        assert fitted[(m.load, "throughput")] == pytest.approx(run.output_tokens_per_second)
        assert fitted[(m.load, "ttft_mean")] == pytest.approx(float(run.ttfts.mean()))
        assert fitted[(m.load, "itl_mean")] == pytest.approx(float(run.itls.mean()))


def test_a_trace_prediction_refuses_what_does_not_apply() -> None:
    config, shape, _ = agent_engine()
    trace = agent_traffic(think=0.0)
    profile = calibrate_trace(measured_runs(config, trace), shape, trace)
    with pytest.raises(WhatIfError, match="grow"):
        predict_trace(profile, {"growth": 2.0}, trace, (1,))
    with pytest.raises(WhatIfError, match="KV cache"):
        predict_trace(profile, {"num_gpu_blocks": 12}, trace, (1,))
    with pytest.raises(WhatIfError, match="sticky"):
        predict_trace(profile, {"replicas": 2, "routing": "round-robin"}, trace, (1,))
    untrusted = dataclasses.replace(profile, fit=FitQuality(profile.fit.points, False, "made up"))
    with pytest.raises(UntrustedProfile):
        predict_trace(untrusted, None, trace, (1,))
    with pytest.raises(WhatIfError):
        calibrate_trace([TraceMeasurement(1, 0.0, 0, None, None)], shape, trace)
