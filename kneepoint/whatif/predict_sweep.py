"""Predict a closed-loop sweep for a calibrated profile at a changed configuration: what a
real `kneepoint sweep` (or `vllm bench serve` at fixed concurrency) would measure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kneepoint.knee.sweep import DEFAULT_LADDER
from kneepoint.whatif.changes import Change, apply, parse_changes
from kneepoint.whatif.profile import Profile, WhatIfError
from kneepoint.whatif.sweep import (
    SweepPrediction,
    bounds,
    coefficients,
    requests_for,
    simulate_step,
)


def predict_sweep(
    profile: Profile,
    change: Change | Mapping[str, object] | None = None,
    ladder: Sequence[int] = DEFAULT_LADDER,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    requests_per_step: int | Mapping[int, int] | None = None,
    seed: int = 0,
) -> list[SweepPrediction]:
    """Per concurrency of `ladder`: predicted throughput (output tokens/s over the step's
    wall time), mean TTFT, mean inter-token latency and preemption count of a closed-loop
    sweep of `input_tokens` random prompt tokens and `output_tokens` generated (default: the
    calibration sweep's) against the replica after `change` (a Change, a mapping such as
    {"num_gpu_blocks": 512, "max_num_seqs": 8}, or None for the calibrated configuration).

    `requests_per_step`: requests per step (one number or per concurrency; default
    `kneepoint sweep`'s max(8, 4 × concurrency)). Raises UntrustedProfile for an untrusted
    profile and WhatIfError for a change that cannot apply. Fleet-level changes (replicas,
    growth) do not apply to one server's sweep and are refused."""
    profile.require_trusted()
    if change is None:
        change = Change()
    elif not isinstance(change, Change):
        change = parse_changes(change)
    if change.replicas != 1 or change.growth != 1.0:
        raise WhatIfError("a sweep is of one server: replicas and growth do not apply")
    shape, cost = apply(profile, change)
    config = shape.engine_config(cost)
    theta = coefficients(cost)
    inputs = input_tokens or profile.input_tokens or 256
    outputs = output_tokens or profile.output_tokens or 128
    throughput_error = profile.fit.rms_of("throughput")
    ttft_error = profile.fit.rms_of("ttft_mean")
    out = []
    for concurrency in ladder:
        if isinstance(requests_per_step, Mapping):
            requests = requests_per_step.get(concurrency) or requests_for(concurrency)
        else:
            requests = requests_per_step or requests_for(concurrency)
        step = simulate_step(config, concurrency, requests, inputs, outputs, seed)
        throughput = step.throughput(theta)
        ttft = step.ttft(theta)
        out.append(
            SweepPrediction(
                concurrency=concurrency,
                requests=requests,
                output_tokens_per_second=throughput,
                output_tokens_per_second_bounds=bounds(throughput, throughput_error),
                ttft_mean_seconds=ttft,
                ttft_mean_seconds_bounds=bounds(ttft, ttft_error),
                itl_mean_seconds=step.itl(theta),
                preemptions=step.preemptions,
                recomputed_prefill_tokens=step.preempted_prompt_tokens
                + step.preempted_output_tokens,
            )
        )
    return out
