"""Calibration on the twin: it recovers a profile's known step cost from the profile's own
sweep, model-agnostic shapes work, a poor fit is not trusted and predicts nothing."""

from __future__ import annotations

import dataclasses

import pytest

from kneepoint.knee.runs import Point
from kneepoint.twin.ladder import ladder_run
from kneepoint.twin.profiles import gpu, model
from kneepoint.twin.simulated_engine import EngineConfig, StepCost
from kneepoint.whatif import (
    TRUST_RMS,
    EngineShape,
    UntrustedProfile,
    calibrate_sweep,
    predict_sweep,
)

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
