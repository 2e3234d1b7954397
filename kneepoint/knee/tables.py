"""Runs and their knees as tables, for the knee chart and the run list."""

from __future__ import annotations

import pandas as pd

from kneepoint.knee.detect import Assessment
from kneepoint.knee.passive import ProductionCurve

MARKER_COLUMNS = ["run", "kind", "concurrency", "output_tokens_per_second"]


def curves(assessments: list[Assessment], latency: str) -> pd.DataFrame:
    """One row per run and step: concurrency, output tokens/s and the `latency` column."""
    return pd.DataFrame(
        [
            {
                "run": a.run.label,
                "concurrency": p.concurrency,
                "output_tokens_per_second": p.output_tokens_per_second,
                latency: getattr(p, latency),
            }
            for a in assessments
            for p in a.run.points
        ],
        columns=["run", "concurrency", "output_tokens_per_second", latency],
    )


def markers(assessments: list[Assessment]) -> pd.DataFrame:
    """Each run's knee and recommended step, where it has them."""
    rows = []
    for a in assessments:
        steps = {p.concurrency: p for p in a.run.points}
        for kind, at in (("knee", a.knee_concurrency), ("recommended", a.recommended_concurrency)):
            if at in steps:
                rows.append([a.run.label, kind, at, steps[at].output_tokens_per_second])
    return pd.DataFrame(rows, columns=MARKER_COLUMNS)


def summary(assessments: list[Assessment], curve: ProductionCurve | None) -> pd.DataFrame:
    """The run list: where each run bends, what to run at, and the production headroom."""
    return pd.DataFrame(
        [
            {
                "run": a.run.label,
                "source": a.run.source,
                "model": a.run.model,
                "steps": len(a.run.points),
                "knee": a.knee_concurrency,
                "recommended": a.recommended_concurrency,
                "limiting SLO": a.limiting_slo,
                "production peak": curve.peak_concurrency if curve else None,
                "headroom to knee": curve.headroom(a.knee_concurrency) if curve else None,
            }
            for a in assessments
        ]
    )


def production(curve: ProductionCurve | None, latency: str) -> pd.DataFrame | None:
    if curve is None or not curve.points:
        return None
    frame = pd.DataFrame([p.as_dict() for p in curve.points])
    return frame.rename(columns={"ttft_p99_seconds": latency})
