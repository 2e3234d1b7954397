"""Step-by-step comparison of two runs: did changing one flag pay?"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kneepoint.knee.runs import Run

# A change must move throughput or latency by more than run-to-run noise to count.
THROUGHPUT_TOLERANCE = 0.05
LATENCY_TOLERANCE = 0.10


@dataclass(frozen=True)
class Step:
    concurrency: int
    baseline_output_tokens_per_second: float
    candidate_output_tokens_per_second: float
    ratio: float | None
    ttft_change: float | None  # candidate ÷ baseline − 1, on p99 (mean when p99 is absent)
    itl_change: float | None
    verdict: str  # better | worse | same | mixed

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Comparison:
    baseline: str
    candidate: str
    steps: tuple[Step, ...]
    verdict: str  # better | worse | same

    def as_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "steps": [s.as_dict() for s in self.steps],
            "verdict": self.verdict,
        }


def _change(base: float | None, cand: float | None) -> float | None:
    if base is None or cand is None or base <= 0:
        return None
    return cand / base - 1


def step_verdict(ratio: float | None, latency_changes: list[float]) -> str:
    faster = ratio is not None and ratio >= 1 + THROUGHPUT_TOLERANCE
    slower = ratio is not None and ratio <= 1 - THROUGHPUT_TOLERANCE
    later = any(c >= LATENCY_TOLERANCE for c in latency_changes)
    sooner = any(c <= -LATENCY_TOLERANCE for c in latency_changes)
    if (faster or sooner) and not (slower or later):
        return "better"
    if (slower or later) and not (faster or sooner):
        return "worse"
    return "mixed" if (faster or sooner) else "same"


def compare(baseline: Run, candidate: Run) -> Comparison:
    """Per shared concurrency: throughput ratio, p99 latency change and a verdict; overall,
    the verdict the steps agree on, or the geometric-mean throughput ratio when they split."""
    candidate_at = {p.concurrency: p for p in candidate.points}
    steps = []
    for base in baseline.points:
        cand = candidate_at.get(base.concurrency)
        if cand is None:
            continue
        ratio = (
            cand.output_tokens_per_second / base.output_tokens_per_second
            if base.output_tokens_per_second > 0
            else None
        )
        ttft = _change(base.latency("ttft", 0.99), cand.latency("ttft", 0.99))
        itl = _change(base.latency("itl", 0.99), cand.latency("itl", 0.99))
        steps.append(
            Step(
                base.concurrency,
                base.output_tokens_per_second,
                cand.output_tokens_per_second,
                ratio,
                ttft,
                itl,
                step_verdict(ratio, [c for c in (ttft, itl) if c is not None]),
            )
        )
    return Comparison(baseline.label, candidate.label, tuple(steps), overall(steps))


def overall(steps: list[Step]) -> str:
    verdicts = {s.verdict for s in steps} - {"same"}
    if verdicts == {"better"}:
        return "better"
    if verdicts == {"worse"}:
        return "worse"
    ratios = [s.ratio for s in steps if s.ratio]
    if not verdicts or not ratios:
        return "same"
    mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    if mean >= 1 + THROUGHPUT_TOLERANCE:
        return "better"
    if mean <= 1 - THROUGHPUT_TOLERANCE:
        return "worse"
    return "same"
