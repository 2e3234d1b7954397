"""Predict a closed-loop sweep for a calibrated profile at a changed configuration: what a
real `kneepoint sweep` (or `vllm bench serve` at fixed concurrency) would measure; and a
closed-loop run of an agent trace (kneepoint.whatif.trace) the same way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

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
from kneepoint.whatif.trace import AgentTrace, TracePrediction, simulate_trace


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


def predict_trace(
    profile: Profile,
    change: Change | Mapping[str, object] | None,
    trace: AgentTrace,
    loads: Sequence[int],
    seed: int = 0,
    ngram: bool = False,
) -> list[TracePrediction]:
    """Per load of `loads` (sessions at once): `trace` run closed-loop (kneepoint.whatif.trace)
    by the twin at `profile` after `change` (a Change, a mapping such as {"max_num_seqs": 8,
    "replicas": 2}, or None): throughput, TTFT and inter-token latency (mean, p50, p95),
    requests waiting (time-averaged, all engines), preemptions, prefix-cache hit rate.

    `replicas` = N runs N engines, each with its own KV cache, sessions split between them
    sticky (session i on engine i mod N); every other key goes through changes.apply (for an
    n-gram drafter: num_speculative_tokens and spec_acceptance_rate as measured). Raises
    UntrustedProfile for an untrusted profile and WhatIfError for a change that cannot apply
    (a turn longer than the changed max_model_len or KV cache included),
    round-robin routing (a session's turns share its prefix: they stay on one engine) and
    growth (a closed loop's load is its sessions: give more loads instead).

    `ngram`: the drafter is vLLM's n-gram proposer, a lookup in the prompt on the host that
    costs no step time: the draft term is 0 (the verifier's 1 + γ tokens per decoding
    request are paid through token_seconds); otherwise a drafter the replica did not have
    costs what changes.apply says (a small draft model)."""
    profile.require_trusted()
    if change is None:
        change = Change()
    elif not isinstance(change, Change):
        change = parse_changes(change)
    if change.growth != 1.0:
        raise WhatIfError("a closed-loop trace has no traffic to grow: predict at more loads")
    if change.replicas > 1 and change.routing != "sticky":
        raise WhatIfError("a trace's sessions are sticky: round-robin routing does not apply")
    shape, cost = apply(profile, change)
    if ngram:
        cost = replace(cost, draft_token_seconds=0.0)
    config = shape.engine_config(cost)
    throughput_error = profile.fit.rms_of("throughput")
    ttft_error = profile.fit.rms_of("ttft_mean")
    out = []
    for load in loads:
        try:
            run = simulate_trace(config, trace, load, seed, engines=change.replicas)
        except ValueError as error:  # a turn the changed engine cannot take
            raise WhatIfError(str(error)) from None
        out.append(TracePrediction.of(run, throughput_error, ttft_error))
    return out
