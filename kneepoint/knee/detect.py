"""Knee detection: Kneedle (the `kneed` package) on output throughput against concurrency,
held to the latency SLOs, giving the concurrency to run at and cap admission to."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from kneepoint.config import Slo
from kneepoint.knee.runs import Point, Run

MIN_POINTS = 3  # Kneedle needs a curve, not a line segment
# Kneedle's sensitivity S scales its confirmation threshold by the mean spacing of the points.
# A load-test ladder is short and sparse (three to eight steps): at the default S = 1 a sharp
# knee with one step after it (1, 32, 64) is never confirmed, so every local maximum of the
# difference curve counts, and the most pronounced one is the knee.
SENSITIVITY = 0.0


@dataclass(frozen=True)
class Assessment:
    run: Run
    knee_concurrency: int | None
    recommended_concurrency: int | None
    limiting_slo: str | None
    violations: dict[int, list[str]]  # concurrency -> SLOs its latencies break

    @property
    def recommended(self) -> Point | None:
        return next(
            (p for p in self.run.points if p.concurrency == self.recommended_concurrency), None
        )

    def as_dict(self) -> dict[str, Any]:
        run = self.run
        at = self.recommended
        return {
            "label": run.label,
            "model": run.model,
            "source": run.source,
            "points": [p.as_dict() for p in run.points],
            "knee_concurrency": self.knee_concurrency,
            "recommended_concurrency": self.recommended_concurrency,
            "limiting_slo": self.limiting_slo,
            "at_recommended": at.as_dict() if at else None,
            "slo_violations": {str(c): names for c, names in self.violations.items()},
        }


def knee(points: tuple[Point, ...] | list[Point]) -> int | None:
    """The concurrency where more load stops buying throughput, or None when the ladder is
    too short or throughput still scales to its end.

    Kneedle sees the running maximum of throughput: a dip after the peak (noise, preemption
    thrash, client errors) is a plateau as far as paying for concurrency goes, and a concave
    curve is what Kneedle is built for."""
    ladder = sorted(points, key=lambda p: p.concurrency)
    if len(ladder) < MIN_POINTS:
        return None
    envelope = list(accumulate((p.output_tokens_per_second for p in ladder), max))
    if envelope[-1] <= envelope[0]:  # flat or falling from the first step: it never paid
        return ladder[0].concurrency
    # Imported here: kneed brings scipy.signal and scipy.stats, 1 s of every CLI command's
    # 1.5 s start, and only a knee needs them.
    from kneed import KneeLocator

    xs = [p.concurrency for p in ladder]
    with warnings.catch_warnings():  # kneed warns "no knee/elbow found" on straight lines
        warnings.simplefilter("ignore")
        locator = KneeLocator(xs, envelope, S=SENSITIVITY, curve="concave", direction="increasing")
    if not locator.all_knees:
        return None
    # Of the local maxima of Kneedle's difference curve, the most pronounced one.
    difference = dict(zip(xs, locator.y_difference, strict=True))
    return int(max(locator.all_knees, key=lambda x: difference[x]))


def violations(point: Point, slos: list[Slo]) -> list[str]:
    """Names of the SLOs this step's latencies break (latencies it lacks break nothing)."""
    broken = []
    for slo in slos:
        if slo.metric is None or slo.threshold is None:  # an availability SLO
            continue
        value = point.latency(slo.metric, slo.objective)
        if value is not None and value > slo.threshold:
            broken.append(slo.name)
    return broken


def assess(run: Run, slos: list[Slo] | None = None) -> Assessment:
    """Knee, recommended concurrency (the highest measured step that meets every latency
    SLO and is not past the knee) and the SLO that held it below the knee, if any."""
    slos = [s for s in slos or [] if s.metric in ("ttft", "itl", "e2e")]
    knee_at = knee(run.points)
    broken = {p.concurrency: violations(p, slos) for p in run.points}
    ceiling = (
        knee_at if knee_at is not None else max((p.concurrency for p in run.points), default=0)
    )
    candidates = [p.concurrency for p in run.points if p.concurrency <= ceiling]
    meeting = [c for c in candidates if not broken[c]]
    recommended = max(meeting, default=None)
    limiting = None
    above = [c for c in candidates if recommended is None or c > recommended]
    if above:  # the first step past the recommendation that stayed under the knee broke an SLO
        limiting = broken[min(above)][0]
    return Assessment(
        run,
        knee_at,
        recommended,
        limiting,
        {c: names for c, names in broken.items() if names},
    )


def knee_for_replica(
    replica: str, model_names: list[str], assessments: list[Assessment]
) -> Assessment | None:
    """The run whose knee a replica is held to: the newest with a knee whose label starts with
    the replica's name (a sweep of that very replica), else the newest with a knee of the
    model it serves. `assessments` are in the order runs were created."""
    with_knee = [a for a in assessments if a.knee_concurrency is not None]
    own = [a for a in with_knee if a.run.label.startswith(replica)]
    same_model = [a for a in with_knee if a.run.model in model_names]
    chosen = own or same_model
    return chosen[-1] if chosen else None


def knee_throughput(assessment: Assessment | None) -> float | None:
    if assessment is None:
        return None
    at = next(
        (p for p in assessment.run.points if p.concurrency == assessment.knee_concurrency), None
    )
    return None if at is None else at.output_tokens_per_second
