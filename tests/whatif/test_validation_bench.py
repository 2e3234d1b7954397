"""The what-if validation bench's arithmetic (bench/whatif_validation.py and the load client
tests/real/whatif_load.py), without a server: how an error, a preemption aim, the n-gram
acceptance and a run's exactness are judged, and how the gauges are time-averaged."""

from __future__ import annotations

from typing import Any

import pytest

from bench.whatif_validation import AIMS, acceptance, error_of, exact_problems, preemption_row
from tests.real.whatif_load import quantiles, time_average


def test_an_error_is_relative_to_the_measured_and_judged_against_its_aim() -> None:
    cell = error_of("throughput", 1000.0, 1090.0)
    assert cell["error"] == pytest.approx(0.09)
    assert cell["aim"] == AIMS["throughput"] and cell["met"] is True
    assert error_of("throughput", 1000.0, 880.0)["met"] is False
    assert error_of("ttft_p95", 0.2, 0.26)["met"] is False  # +30 % against 25 %
    unaimed = error_of("ttft_p50", 0.2, 0.4)
    assert unaimed["aim"] is None and unaimed["met"] is None
    assert error_of("itl_p95", None, 0.01)["error"] is None


def test_preemptions_meet_their_aim_within_the_ratio_or_both_rare() -> None:
    assert preemption_row(30.0, 25.0, (1.0, 1.0))["met"] is True  # ×1.2
    assert preemption_row(30.0, 10.0, (1.0, 1.0))["met"] is False  # ×3
    assert preemption_row(1.0, 0.0, (2.0, 2.0))["met"] is True  # both ≤ 1 a minute
    missed = preemption_row(6.0, 0.0, (2.0, 2.0))
    assert missed["met"] is False and missed["ratio"] is None
    assert missed["per_minute"] == [3.0, 0.0]


def _ngram_run(drafts: float, accepted: float) -> dict[str, Any]:
    return {
        "configuration": "num_speculative_tokens",
        "round": 0,
        "server": {"spec_drafts": drafts, "spec_accepted_tokens": accepted},
    }


def test_the_acceptance_rate_solves_the_mean_accepted_per_draft() -> None:
    a = 0.8
    mean = a + a**2 + a**3  # γ = 3: the accepted tokens a draft yields on average
    measured = {"runs": [_ngram_run(1000.0, 1000.0 * mean)]}
    assert acceptance(measured) == pytest.approx(a, abs=1e-6)
    assert acceptance({"runs": [_ngram_run(0.0, 0.0)]}) is None


def test_a_run_is_exact_only_when_every_request_and_token_is_counted() -> None:
    run = {
        "errors": 0,
        "first_error": None,
        "requests": 10,
        "requested_tokens": 500,
        "streamed_tokens": 500,
        "server": {"finished": 10.0, "requests": 10.0, "tokens": 500.0},
    }
    assert exact_problems(run) == []
    assert exact_problems({**run, "server": {**run["server"], "tokens": 499.0}})
    assert exact_problems({**run, "server": {**run["server"], "finished": 9.0}})
    assert exact_problems({**run, "errors": 1, "first_error": "HTTP 500"})


def test_gauges_are_averaged_over_time_and_gaps_by_numpy_percentiles() -> None:
    # (time, waiting, running): 2 waiting for 1 s, then 0 for 3 s.
    samples = [(0.0, 2.0, 1.0), (1.0, 0.0, 4.0), (4.0, 0.0, 4.0)]
    assert time_average(samples, 1) == pytest.approx(0.5)
    assert time_average(samples, 2) == pytest.approx((1.0 + 12.0) / 4.0)
    assert time_average(samples[:1], 1) is None
    figures = quantiles([1.0, 2.0, 3.0, 4.0])
    assert figures == {"p50": 2.5, "p95": pytest.approx(3.85), "mean": 2.5}
    assert quantiles([]) is None


def _timed_run(configuration: str, load: int, round_: int, ttft: float) -> dict[str, Any]:
    """A run whose every request waited `ttft` for its first token (so its p95 is `ttft`)."""
    return {
        "configuration": configuration,
        "load": load,
        "round": round_,
        "per_request": {"ttft": [ttft] * 20},
        "itl_quantiles": {},
        "wall_seconds": 60.0,
        "waiting_mean": 0.0,
        "server": {"tokens": 1000.0, "preemptions": 0.0},
    }


def _unjudgeable(
    a_rounds: list[float], b_rounds: list[float], twin_a: float, published: float = 0.0
) -> str | None:
    from tests.real.test_vllm_whatif import unjudgeable

    runs = [_timed_run("A", 4, i, t) for i, t in enumerate(a_rounds)]
    runs += [_timed_run("num_gpu_blocks", 4, i, t) for i, t in enumerate(b_rounds)]
    predictions: dict[tuple[str, int], dict[str, float | None]] = {("A", 4): {"ttft_p95": twin_a}}
    return unjudgeable(
        "ttft_p95", "num_gpu_blocks", 4, 0.25, published, {"runs": runs}, predictions
    )


def test_the_ci_check_judges_a_latency_only_where_the_run_can_tell_the_twin_from_the_machine() -> (
    None
):
    # The CI run that failed: A 35 and 30 ms against the twin's 25.6 (−21 %), the change's
    # rounds 38 and 44 ms (15 % apart): a twin as good as published (−5 %) could miss.
    why = _unjudgeable([0.035, 0.030], [0.038, 0.044], 0.0256, published=-0.05)
    assert why is not None and "together past the aim" in why
    # A quiet run, the twin on A's own figure: a miss of the change is the twin's, judged.
    assert _unjudgeable([0.030, 0.031], [0.040, 0.041], 0.0305, published=-0.05) is None
    # The same run, but a published error near the aim: the run's noise could carry it over.
    assert _unjudgeable([0.030, 0.031], [0.040, 0.041], 0.0305, published=-0.23) is not None
    # Each of the other two reasons on its own.
    assert "rounds" in (_unjudgeable([0.030, 0.040], [0.040, 0.041], 0.035) or "")
    assert "misses A's own" in (_unjudgeable([0.030, 0.031], [0.040, 0.041], 0.020) or "")
