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
