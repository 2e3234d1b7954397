"""SLO replay: would a proposed SLO have been met over the stored history, and which of its
burn-rate alerts would have fired? Pure: it reads the fleet's measured windows, never the store
(alerts/evaluate.py `replay_series` and `measure` read them).

- Compliance and budget spent over the replayed window come from the fleet's window as the
  SLOs page measures it (alerts/evaluate.py `measure`, maintenance left out): compliance is
  1 − bad share (alerts/slo.py `bad_share`) and the budget spent is bad share ÷ (1 − objective)
  (1: exactly all of it; over 1: overspent).
- Burn-rate alerts are evaluated at every step of STEP seconds (the running sums' bucket,
  kneepoint/store/slo_sums.py) across the window: at each step, each burn window's rate is read
  from the buckets its long and short windows cover (their increases added up, as the running
  sums add them), and alerts/slo.py `burning` says which fire. A firing interval is a run of
  steps where one burn window fires: from its first step to the first step where it no longer
  does (`end` None: still firing at the window's end).
- A latency threshold must be a bucket bound for a count to be exact. A threshold between two
  bounds is answered with a range: the compliance at the bound below and at the bound above
  (both exact counts; below the first bound the one below is 0 s, where nothing is counted)
  and an interpolated estimate, linear within the bucket as PromQL's histogram_quantile
  assumes. The estimate is never presented as exact. The alerts of such a threshold are
  replayed at both bounds. A threshold above the last finite bound cannot be judged: the +Inf
  bucket does not tell how much slower its requests were."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from alerts import slo
from alerts.slo import Availability, BurnWindow
from kneepoint.config import Slo
from kneepoint.durations import format_duration
from kneepoint.samples import Histogram

STEP = 300.0  # the running sums' bucket (kneepoint/store/slo_sums.py BUCKET)
REACH = max(w.long for w in slo.BURN_WINDOWS)  # history read before the window's start

Measured = Histogram | Availability | None


@dataclass(frozen=True)
class Bracket:
    """Where a latency threshold falls among a histogram's bounds: `exact` when it is one;
    else the bounds either side (`lower` 0.0 below the first bound; `upper` None above the
    last finite one: not judgeable)."""

    exact: bool
    lower: float | None = None
    upper: float | None = None


def bracket(threshold: float, bounds: Sequence[float]) -> Bracket:
    if any(math.isclose(threshold, b, rel_tol=1e-9) for b in bounds):
        return Bracket(True)
    finite = [b for b in bounds if math.isfinite(b)]
    below = max((b for b in finite if b < threshold), default=0.0)
    above = min((b for b in finite if b > threshold), default=None)
    return Bracket(False, below, above)


def at_threshold(h: Histogram, threshold: float) -> Histogram:
    """`h` with a bound at `threshold` added where it has none: exactly 0 requests at 0 s (a
    latency is never negative); never a count interpolated (`interpolated_estimate` does)."""
    if any(math.isclose(threshold, b, rel_tol=1e-9) for b in h.bounds):
        return h
    if threshold == 0.0:
        return Histogram((0.0, *h.bounds), (0.0, *h.counts), h.total)
    raise ValueError(f"{threshold:g}s is not a bound of the histogram")


def interpolated_estimate(h: Histogram, threshold: float) -> float | None:
    """The share of requests at or under `threshold`, linear within the bucket holding it (as
    histogram_quantile assumes); None with no requests or above the last finite bound."""
    if h.count <= 0:
        return None
    lower, upper, below, above = 0.0, None, 0.0, 0.0
    for bound, count in zip(h.bounds, h.counts, strict=True):
        if not math.isfinite(bound):
            break
        if bound <= threshold:
            lower, below = bound, count
        else:
            upper, above = bound, count
            break
    if upper is None:
        return None
    estimate = below + (above - below) * (threshold - lower) / (upper - lower)
    return estimate / h.count


def _sub(a: Availability, b: Availability) -> Availability:
    """a − b, field by field (whatever counts Availability holds)."""
    return Availability(**{f.name: getattr(a, f.name) - getattr(b, f.name) for f in fields(a)})


def windows_at(
    slo_: Slo, series: Sequence[tuple[float, Measured]], lengths: Sequence[float]
) -> list[dict[float, Measured]]:
    """At each step of `series` (step end, the fleet's increases over that step), the fleet's
    window of each length ending there: the steps it covers added up (those before the
    series' first: none). Latency: the counts at the SLO's threshold bound (a step whose
    histogram lacks that bound adds nothing); None where no step in it had a histogram."""
    n = len(series)
    if slo_.kind == "availability":
        cum: list[Availability | None] = [Availability()]
        for _, m in series:
            prev = cum[-1]
            assert prev is not None
            cum.append(prev + m if isinstance(m, Availability) else prev)
        seen = [0]
        for _, m in series:
            seen.append(seen[-1] + int(isinstance(m, Availability)))
        out: list[dict[float, Measured]] = []
        for k in range(n):
            row: dict[float, Measured] = {}
            for length in lengths:
                first = max(0, k + 1 - round(length / STEP))
                a, b = cum[k + 1], cum[first]
                assert a is not None and b is not None
                row[length] = _sub(a, b) if seen[k + 1] > seen[first] else None
            out.append(row)
        return out
    threshold = slo_.threshold
    assert threshold is not None
    good, total, seen = [0.0], [0.0], [0]
    for _, m in series:
        counts = None
        if isinstance(m, Histogram):
            h = at_threshold(m, threshold) if threshold == 0.0 else m
            index = next(
                (i for i, b in enumerate(h.bounds) if math.isclose(b, threshold, rel_tol=1e-9)),
                None,
            )
            counts = None if index is None else (h.counts[index], h.count)
        good.append(good[-1] + (counts[0] if counts else 0.0))
        total.append(total[-1] + (counts[1] if counts else 0.0))
        seen.append(seen[-1] + int(counts is not None))
    bounds = (threshold, math.inf)
    out = []
    for k in range(n):
        row = {}
        for length in lengths:
            first = max(0, k + 1 - round(length / STEP))
            if seen[k + 1] == seen[first]:
                row[length] = None
                continue
            within, count = good[k + 1] - good[first], total[k + 1] - total[first]
            row[length] = Histogram(bounds, (within, count), 0.0)
        out.append(row)
    return out


@dataclass(frozen=True)
class Firing:
    """One burn-rate alert's firing interval in the replay."""

    window: BurnWindow
    factor: float
    start: float
    end: float | None  # the first step it no longer fired; None: still firing at the end


def firings(slo_: Slo, series: Sequence[tuple[float, Measured]], since: float) -> list[Firing]:
    """The burn-rate alerts `slo_` would have fired at the steps of `series` ending after
    `since`, each as its intervals, in order of start."""
    lengths = slo.windows_needed()
    steps = windows_at(slo_, series, lengths)
    open_: dict[BurnWindow, float] = {}
    out: list[Firing] = []
    for (ts, _), windows in zip(series, steps, strict=True):
        if ts <= since:
            continue
        rates = {length: slo.burn_rate(slo_, w) for length, w in windows.items()}
        now = set(slo.burning(slo_, rates))
        for w in slo.BURN_WINDOWS:
            if w in now and w not in open_:
                open_[w] = ts
            elif w not in now and w in open_:
                out.append(Firing(w, w.factor(slo_.window), open_.pop(w), ts))
    out += [Firing(w, w.factor(slo_.window), began, None) for w, began in open_.items()]
    return sorted(out, key=lambda f: (f.start, f.window.long))


@dataclass(frozen=True)
class Replayed:
    """One SLO replayed over [start, end]. For a latency threshold between two bucket bounds
    `exact` is None and the range and estimate are given; `firings` then holds the alerts at
    each bound ("at_lower_bound", "at_upper_bound"), else at the threshold ("exact")."""

    slo: Slo
    role: str  # "proposed" or "configured"
    start: float
    end: float
    exact: float | None = None  # compliance
    at_lower_bound: float | None = None
    at_upper_bound: float | None = None
    interpolated_estimate: float | None = None
    lower_bound: float | None = None
    upper_bound: float | None = None
    firings: dict[str, list[Firing]] | None = None
    # The first and last step with data the alerts were replayed at (None: none had any).
    alerts_from: float | None = None
    alerts_to: float | None = None
    problem: str | None = None

    def spent(self, compliance: float | None) -> float | None:
        """The error budget spent at a compliance: bad share ÷ (1 − objective)."""
        return None if compliance is None else (1.0 - compliance) / (1.0 - self.slo.objective)


def compliance_of(slo_: Slo, window: Measured) -> float | None:
    share = slo.bad_share(slo_, window)
    return None if share is None else 1.0 - share


def at(slo_: Slo, threshold: float) -> Slo:
    return slo_.model_copy(update={"threshold": threshold})


def replay(
    slo_: Slo,
    role: str,
    start: float,
    end: float,
    whole: Measured,
    series: Sequence[tuple[float, Measured]],
) -> Replayed:
    """`slo_` over [start, end]: `whole` is the fleet's window (maintenance left out), `series`
    the fleet's increases per STEP from REACH before `start` on."""
    steps = [ts for ts, m in series if ts > start and m is not None]  # those with data
    base = Replayed(
        slo_,
        role,
        start,
        end,
        alerts_from=steps[0] if steps else None,
        alerts_to=steps[-1] if steps else None,
    )
    if whole is None:
        return _with(base, problem="no requests were measured in the window")
    if isinstance(whole, Availability) or slo_.kind == "availability":
        return _with(
            base, exact=compliance_of(slo_, whole), firings={"exact": firings(slo_, series, start)}
        )
    threshold = slo_.threshold
    assert threshold is not None
    where = bracket(threshold, whole.bounds)
    if where.exact:
        return _with(
            base, exact=compliance_of(slo_, whole), firings={"exact": firings(slo_, series, start)}
        )
    if where.upper is None:
        last = max(b for b in whole.bounds if math.isfinite(b))
        return _with(
            base,
            lower_bound=where.lower,
            problem=f"{threshold:g}s is above the {slo_.metric} histogram's last finite bound "
            f"({last:g}s): the +Inf bucket cannot tell how much slower its requests were, so "
            "it cannot be judged",
        )
    assert where.lower is not None
    lower, upper = at(slo_, where.lower), at(slo_, where.upper)
    return _with(
        base,
        at_lower_bound=compliance_of(lower, at_threshold(whole, where.lower)),
        at_upper_bound=compliance_of(upper, whole),
        interpolated_estimate=interpolated_estimate(whole, threshold),
        lower_bound=where.lower,
        upper_bound=where.upper,
        firings={
            "at_lower_bound": firings(lower, series, start),
            "at_upper_bound": firings(upper, series, start),
        },
    )


def _with(base: Replayed, **changes: Any) -> Replayed:
    return replace(base, **changes)


def _firing_json(f: Firing) -> dict[str, Any]:
    return {
        "severity": f.window.severity,
        "long_window": format_duration(f.window.long),
        "short_window": format_duration(f.window.short),
        "factor": round(f.factor, 6),
        "start": f.start,
        "end": f.end,
    }


def replayed_json(r: Replayed) -> dict[str, Any]:
    """One replayed SLO as JSON (docs/reference/json.md, "kneepoint slo replay --json"). A
    compliance between bounds has "exact": null beside its range and labelled estimate."""
    compliance = {
        "exact": r.exact,
        "at_lower_bound": r.at_lower_bound,
        "at_upper_bound": r.at_upper_bound,
        "interpolated_estimate": r.interpolated_estimate,
        "lower_bound": r.lower_bound,
        "upper_bound": r.upper_bound,
    }
    spent = {
        "exact": r.spent(r.exact),
        # The lower bound's compliance is the lower one: it spends more.
        "at_lower_bound": r.spent(r.at_lower_bound),
        "at_upper_bound": r.spent(r.at_upper_bound),
        "interpolated_estimate": r.spent(r.interpolated_estimate),
    }
    return {
        "name": r.slo.name,
        "role": r.role,
        "slo": r.slo.model_dump(mode="json", exclude={"channels"}),
        "start": r.start,
        "end": r.end,
        "compliance": compliance,
        "budget_spent": spent,
        "alerts": None
        if r.firings is None
        else {key: [_firing_json(f) for f in found] for key, found in r.firings.items()},
        "alerts_replayed": {"from": r.alerts_from, "to": r.alerts_to, "step": STEP},
        "problem": r.problem,
    }


def replay_proposal(
    kind: str, metric: str, threshold: str | None, objective_percent: float, window: str
) -> Slo:
    """The proposed SLO the CLI's and the page's fields describe (ValueError: not a valid one);
    the objective in percent, the threshold and window as durations (450ms, 28d)."""
    if not 0 < objective_percent < 100:
        raise ValueError("the objective is a percentage between 0 and 100 (99.5)")
    fields_: dict[str, Any] = {
        "name": "proposed",
        "kind": kind,
        "objective": objective_percent / 100.0,
        "window": window,
    }
    if kind == "latency":
        fields_ |= {"metric": metric, "threshold": threshold}
    return Slo.model_validate(fields_)
