"""SLOs on latency from vLLM's own histograms: compliance, error budget, and multiwindow,
multi-burn-rate alerts (the SRE workbook's scheme).

The share of requests slower than the threshold is read from the histogram's cumulative
count at the threshold, so the threshold must be one of the histogram's bucket bounds (else
the share would be an interpolation, not a count). A burn rate is that bad share over a
window ÷ the share the objective allows (1 − objective): at 1 the budget lasts exactly the
SLO window. Each alert pairs a long window with a short one (so it stops soon after the
burning does) and fires when both burn faster than its factor; a factor is the share of the
whole budget the long window may spend × SLO window ÷ long window (2 % of 30 days in an hour
is 14.4)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kneepoint.config import Rule, Slo
from kneepoint.samples import Histogram

HOUR = 3600.0


@dataclass(frozen=True)
class BurnWindow:
    long: float
    short: float
    budget_share: float  # of the whole SLO window's budget, spent within `long`
    severity: str

    def factor(self, slo_window: float) -> float:
        return self.budget_share * slo_window / self.long


# Page on 2 % of the budget in an hour or 5 % in six hours; ticket on 10 % in a day or three.
BURN_WINDOWS = (
    BurnWindow(1 * HOUR, 5 * 60, 0.02, "page"),
    BurnWindow(6 * HOUR, 30 * 60, 0.05, "page"),
    BurnWindow(24 * HOUR, 2 * HOUR, 0.10, "ticket"),
    BurnWindow(72 * HOUR, 6 * HOUR, 0.10, "ticket"),
)


class ThresholdNotABound(ValueError):
    pass


def check_threshold(slo: Slo, bounds: tuple[float, ...]) -> None:
    """The threshold must be a bucket bound of the histogram the SLO reads."""
    if not any(math.isclose(slo.threshold, b, rel_tol=1e-9) for b in bounds):
        finite = [b for b in bounds if math.isfinite(b)]
        below = max((b for b in finite if b < slo.threshold), default=None)
        above = min((b for b in finite if b > slo.threshold), default=None)
        raise ThresholdNotABound(
            f"SLO {slo.name!r}: threshold {slo.threshold:g}s is not a bucket bound of the "
            f"{slo.metric} histogram (nearest: {below:g}s and {above:g}s)"
            if below is not None and above is not None
            else f"SLO {slo.name!r}: threshold {slo.threshold:g}s is outside the {slo.metric} "
            "histogram's buckets"
        )


def bad_share(slo: Slo, window: Histogram | None) -> float | None:
    """Share of the window's requests slower than the threshold; None with no requests."""
    if window is None:
        return None
    check_threshold(slo, window.bounds)  # even with no requests yet: the SLO is wrong now
    if window.count <= 0:
        return None
    index = next(i for i, b in enumerate(window.bounds) if math.isclose(b, slo.threshold))
    return max(0.0, 1.0 - window.counts[index] / window.count)


def burn_rate(slo: Slo, window: Histogram | None) -> float | None:
    share = bad_share(slo, window)
    return None if share is None else share / (1.0 - slo.objective)


@dataclass(frozen=True)
class Budget:
    compliance: float | None  # share of requests within the threshold over the SLO window
    budget_left: float | None  # 1 − bad share ÷ allowed share (negative: overspent)


def budget(slo: Slo, whole_window: Histogram | None) -> Budget:
    share = bad_share(slo, whole_window)
    if share is None:
        return Budget(None, None)
    return Budget(1.0 - share, 1.0 - share / (1.0 - slo.objective))


def burning(slo: Slo, rates: dict[float, float | None]) -> list[BurnWindow]:
    """The burn windows whose long and short rates both exceed their factor."""
    firing = []
    for window in BURN_WINDOWS:
        factor = window.factor(slo.window)
        long, short = rates.get(window.long), rates.get(window.short)
        if long is not None and short is not None and long > factor and short > factor:
            firing.append(window)
    return firing


def window_label(seconds: float) -> str:
    from kneepoint.durations import format_duration

    return format_duration(seconds)


def burn_rules(slos: list[Slo]) -> list[Rule]:
    """One fleet rule per SLO and burn window: it watches min(long, short burn rate) against
    the window's factor, so it fires only while both windows burn that fast."""
    return [
        Rule.model_validate(
            {
                "name": f"{slo.name}-burn-{window_label(w.long)}",
                "metric": burn_metric(slo, w),
                "op": ">",
                "threshold": round(w.factor(slo.window), 6),
                "severity": w.severity,
                "scope": "fleet",
                "channels": slo.channels,
                "runbook": f"{slo.name}: the error budget burns {w.factor(slo.window):g}× too "
                f"fast over {window_label(w.long)} and {window_label(w.short)} (see SLOs).",
            }
        )
        for slo in slos
        for w in BURN_WINDOWS
    ]


def burn_metric(slo: Slo, window: BurnWindow) -> str:
    return f"slo_burn:{slo.name}:{window_label(window.long)}"


def burn_values(
    slos: list[Slo], rates: dict[str, dict[float, float | None]]
) -> dict[str, float | None]:
    """The values the burn rules watch: per SLO and burn window, min(long, short) rate."""
    out: dict[str, float | None] = {}
    for slo in slos:
        for w in BURN_WINDOWS:
            long, short = rates[slo.name].get(w.long), rates[slo.name].get(w.short)
            out[burn_metric(slo, w)] = None if long is None or short is None else min(long, short)
    return out


def windows_needed() -> list[float]:
    return sorted({s for w in BURN_WINDOWS for s in (w.long, w.short)})


@dataclass(frozen=True)
class Report:
    """One SLO as the SLOs page shows it."""

    slo: Slo
    budget: Budget
    rates: dict[float, float | None]  # burn rate per window length
    burning: list[BurnWindow]
    problem: str | None = None


def report(slo_: Slo, windows: dict[float, Histogram | None], whole: Histogram | None) -> Report:
    try:
        rates = {seconds: burn_rate(slo_, h) for seconds, h in windows.items()}
        return Report(slo_, budget(slo_, whole), rates, burning(slo_, rates))
    except ThresholdNotABound as error:
        return Report(slo_, Budget(None, None), {}, [], str(error))
