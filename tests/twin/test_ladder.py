"""The twin swept in virtual time lands on the workshop's figures and knee
(docs/explanation/domain.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kneepoint.knee.compare import compare
from kneepoint.knee.detect import assess
from kneepoint.twin.ladder import ladder_run
from kneepoint.twin.profiles import gpu, model
from kneepoint.twin.simulated_engine import EngineConfig

WORKSHOP = EngineConfig(gpu("rtx4000ada"), model("qwen3-4b"), max_num_seqs=32)
LADDER = (1, 2, 4, 8, 16, 32, 64)


def test_the_workshop_replica_bends_at_32() -> None:
    run = ladder_run(WORKSHOP, "bf16", "Qwen/Qwen3-4B", LADDER)
    by_step = {p.concurrency: p for p in run.points}
    assert assess(run).knee_concurrency == 32
    # Field: 37.5 tok/s alone, 714 at 32, ≈800 at 64 (the twin caps at max_num_seqs 32): ±25 %.
    assert by_step[1].output_tokens_per_second == pytest.approx(37.5, rel=0.25)
    assert by_step[32].output_tokens_per_second == pytest.approx(714, rel=0.25)
    assert by_step[1].ttft_mean_seconds == pytest.approx(0.061, rel=0.5)
    # Past the cap requests queue for a slot: throughput flat, TTFT several times higher.
    assert by_step[64].output_tokens_per_second == pytest.approx(
        by_step[32].output_tokens_per_second, rel=0.05
    )
    assert by_step[64].ttft_mean_seconds > 3 * by_step[32].ttft_mean_seconds  # type: ignore[operator]
    assert all(p.errors == 0 and p.completed == max(8, 4 * p.concurrency) for p in run.points)


def test_fp8_weights_read_better_and_a_mismatched_drafter_worse() -> None:
    base = ladder_run(WORKSHOP, "bf16", "Qwen/Qwen3-4B", (1, 16))
    fp8 = ladder_run(replace(WORKSHOP, fp8_weights=True), "fp8", "Qwen/Qwen3-4B", (1, 16))
    drafter = replace(WORKSHOP, num_speculative_tokens=4, spec_acceptance_rate=0.05)
    mismatched = ladder_run(drafter, "drafter", "Qwen/Qwen3-4B", (1, 16))
    assert compare(base, fp8).verdict == "better"
    assert compare(base, mismatched).verdict == "worse"
