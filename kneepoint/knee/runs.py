"""The run model every load test becomes: a labelled ladder of concurrency steps."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class Point:
    """One concurrency step of a run. Latencies in seconds; absent measures are None."""

    concurrency: int
    output_tokens_per_second: float
    requests_per_second: float | None = None
    ttft_mean_seconds: float | None = None
    ttft_p50_seconds: float | None = None
    ttft_p90_seconds: float | None = None
    ttft_p99_seconds: float | None = None
    itl_mean_seconds: float | None = None
    itl_p50_seconds: float | None = None
    itl_p90_seconds: float | None = None
    itl_p99_seconds: float | None = None
    e2e_mean_seconds: float | None = None
    e2e_p99_seconds: float | None = None
    input_tokens_mean: float | None = None  # prompt tokens per request, as the server counted
    completed: int | None = None
    errors: int | None = None
    first_error: str | None = None  # what the first failed request said, for the report
    duration_seconds: float | None = None
    spec_acceptance_rate: float | None = None  # 0..1
    spec_acceptance_length: float | None = None
    # What the server's own /metrics said during the step (sweeps with capture on).
    server: dict[str, float | None] = field(default_factory=dict)
    # The load generator's CPU use, in cores (sweeps only): a saturated client lies.
    client_cpu_cores: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Point:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def latency(self, metric: str, quantile: float) -> float | None:
        """The measured latency closest to `quantile` from above (p50, p90 or p99), falling
        back to the highest one measured: an SLO at 0.95 is held to p99, never to p90."""
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            value = getattr(self, f"{metric}_{name}_seconds", None)
            if q >= quantile and value is not None:
                return float(value)
        for name in ("p99", "p90", "p50", "mean"):
            value = getattr(self, f"{metric}_{name}_seconds", None)
            if value is not None:
                return float(value)
        return None


@dataclass(frozen=True)
class Run:
    label: str
    model: str
    # Where it came from: kneepoint's own "sweep", or the imported tool whose result file it
    # was (vllm-bench, guidellm, aiperf, genai-perf, llmperf).
    source: str
    points: tuple[Point, ...]
    created_at: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.points, key=lambda p: p.concurrency))
        object.__setattr__(self, "points", ordered)

    def merged(self, other: Run) -> Run:
        """Files with the same label and model form one run, one point per concurrency (a
        later file's step replaces an earlier one at the same concurrency)."""
        steps = {p.concurrency: p for p in self.points}
        steps.update({p.concurrency: p for p in other.points})
        return replace(self, points=tuple(steps.values()), notes={**self.notes, **other.notes})


def group(runs: list[Run]) -> list[Run]:
    """Merge runs sharing (label, model), keeping first-seen order."""
    merged: dict[tuple[str, str], Run] = {}
    for run in runs:
        key = (run.label, run.model)
        merged[key] = merged[key].merged(run) if key in merged else run
    return list(merged.values())
