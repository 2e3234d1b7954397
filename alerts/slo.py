"""SLOs on latency (from the engine's own histograms) and on availability: compliance, error
budget, and multiwindow, multi-burn-rate alerts (the SRE workbook's scheme).

The share of requests slower than the threshold is read from the histogram's cumulative
count at the threshold, so the threshold must be one of the histogram's bucket bounds (else
the share would be an interpolation, not a count). A burn rate is that bad share over a
window ÷ the share the objective allows (1 − objective): at 1 the budget lasts exactly the
SLO window. Each alert pairs a long window with a short one (so it stops soon after the
burning does) and fires when both burn faster than its factor; a factor is the share of the
whole budget the long window may spend × SLO window ÷ long window (2 % of 30 days in an hour
is 14.4).

An availability SLO (`kind: availability`) counts what failed instead: its bad share over a
window is

    1 − (1 − failed requests' share) × (1 − stalled share)

- The failed requests' share is the larger of two shares, each over the fleet: the engine's
  and the API server's (`http_requests_total` with status 5xx over all its requests, where
  the server exposes it). The engine's is

      (failed + refused) ÷ (finished + refused)

  where finished is vLLM's finished requests (any `finished_reason`: stop, length, abort,
  error, repetition), failed those of them whose reason is `error` or `abort`, and refused
  the requests it turned away at admission with a 503 because a queue limit was reached
  (load shedding, `vllm:admission_rejections_total`, vLLM 0.32 and later; 0 where the engine
  does not count them). A refused request never finishes, so it is added to both sides:
  the denominator is every request offered to the engine, finished or refused.
  Both shares count the same requests at two layers, so they are not added: a request that
  failed in the engine and answered 500 would count twice, and so would a refused one, as
  the API server counts the 503 it answered among its 5xx (and the request among its
  requests). Taking the larger still holds with refusals: each layer's share is complete
  for what it sees, so the larger one is at least each; it also catches what only one layer
  sees (a 500 before the engine, a request aborted mid-stream after its 200, a refusal
  where the API server's counter is not exposed).
- The stalled share is the replica-seconds a replica was stalled (kneepoint/derived/stall.py:
  work present, token counters frozen for 60 s or more) over the replica-seconds observed
  (first to last sample of each replica). A stalled engine finishes nothing, so its failure
  never reaches the request counters; its time counts as wholly bad instead.

Read together: a request sent to the fleet at a random replica-second fails if that replica was
stalled, and otherwise as often as finished requests failed. With no finished request and no
stall in a window there is nothing to judge (no burn rate), as with a latency SLO's empty
histogram.

Maintenance windows (alerts/maintenance.py) are cut out of every window before any of this is
counted, for both kinds: their requests, their stalled time and their observed time are left
out of budgets and burn rates."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from kneepoint import catalogue
from kneepoint.config import Rule, Slo
from kneepoint.durations import format_duration
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


@dataclass(frozen=True)
class Availability:
    """What an availability SLO counts over a window (sums over replicas and stretches)."""

    finished: float = 0.0  # requests vLLM finished, for any reason
    failed: float = 0.0  # of them: finished_reason error or abort
    http: float = 0.0  # the API server's requests (http_requests_total), where exposed
    http_failed: float = 0.0  # of them: status 5xx
    seconds: float = 0.0  # replica-seconds observed
    stalled: float = 0.0  # replica-seconds stalled
    refused: float = 0.0  # requests refused at admission (load shedding), never finished

    def __add__(self, other: Availability) -> Availability:
        return Availability(
            self.finished + other.finished,
            self.failed + other.failed,
            self.http + other.http,
            self.http_failed + other.http_failed,
            self.seconds + other.seconds,
            self.stalled + other.stalled,
            self.refused + other.refused,
        )

    def request_share(self) -> float:
        """The larger of the engine's failed share, (failed + refused) ÷ (finished +
        refused), and the API server's (0: none known)."""
        offered = self.finished + self.refused
        engine = (self.failed + self.refused) / offered if offered > 0 else 0.0
        server = self.http_failed / self.http if self.http > 0 else 0.0
        return max(engine, server)

    def stalled_share(self) -> float:
        return min(1.0, self.stalled / self.seconds) if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Measured:
    """The fleet over one window, maintenance left out: what each kind of SLO reads."""

    histograms: dict[str, Histogram | None]
    availability: Availability | None

    def of(self, slo: Slo) -> Histogram | Availability | None:
        if slo.kind == "availability":
            return self.availability
        assert slo.metric is not None  # the config requires it for a latency SLO
        return self.histograms.get(slo.metric)


class ThresholdNotABound(ValueError):
    pass


def check_threshold(slo: Slo, bounds: tuple[float, ...]) -> None:
    """The threshold must be a bucket bound of the histogram the SLO reads."""
    assert slo.threshold is not None  # a latency SLO's (the config requires it)
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


def bad_share(slo: Slo, window: Histogram | Availability | None) -> float | None:
    """Share of the window's requests slower than the threshold (latency) or failed, with
    stalled time (availability); None with nothing to judge."""
    if window is None:
        return None
    if isinstance(window, Availability):
        if (
            window.finished <= 0
            and window.refused <= 0
            and window.http <= 0
            and window.stalled <= 0
        ):
            return None
        return 1.0 - (1.0 - window.request_share()) * (1.0 - window.stalled_share())
    check_threshold(slo, window.bounds)  # even with no requests yet: the SLO is wrong now
    if window.count <= 0:
        return None
    threshold = slo.threshold
    assert threshold is not None
    index = next(i for i, b in enumerate(window.bounds) if math.isclose(b, threshold))
    return max(0.0, 1.0 - window.counts[index] / window.count)


def burn_rate(slo: Slo, window: Histogram | Availability | None) -> float | None:
    share = bad_share(slo, window)
    return None if share is None else share / (1.0 - slo.objective)


@dataclass(frozen=True)
class Budget:
    # Share of requests within the threshold (availability: good) over the SLO window.
    compliance: float | None
    budget_left: float | None  # 1 − bad share ÷ allowed share (negative: overspent)


def budget(slo: Slo, whole_window: Histogram | Availability | None) -> Budget:
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
    """The metric one SLO's rule for one burn window watches (kneepoint/catalogue.py)."""
    return catalogue.burn_metric(slo.name, window_label(window.long))


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


def report(
    slo_: Slo,
    windows: dict[float, Histogram | Availability | None],
    whole: Histogram | Availability | None,
) -> Report:
    try:
        rates = {seconds: burn_rate(slo_, h) for seconds, h in windows.items()}
        return Report(slo_, budget(slo_, whole), rates, burning(slo_, rates))
    except ThresholdNotABound as error:
        return Report(slo_, Budget(None, None), {}, [], str(error))


def report_json(report: Report) -> dict[str, Any]:
    """`report` as plain JSON values (what the leader stores for pages: alerts/slo_prepared.py);
    `report_of` reads them back equal. Floats go through JSON exactly (shortest repr), and
    the burn rates keep their windows' order as pairs (JSON's object keys are strings)."""
    return {
        "slo": report.slo.model_dump(mode="json"),
        "budget": [report.budget.compliance, report.budget.budget_left],
        "rates": [[seconds, rate] for seconds, rate in report.rates.items()],
        "burning": [asdict(w) for w in report.burning],
        "problem": report.problem,
    }


def report_of(values: dict[str, Any]) -> Report:
    """The Report `report_json` gave `values` of."""
    compliance, left = values["budget"]
    return Report(
        Slo.model_validate(values["slo"]),
        Budget(compliance, left),
        {float(seconds): rate for seconds, rate in values["rates"]},
        [BurnWindow(**w) for w in values["burning"]],
        values["problem"],
    )
