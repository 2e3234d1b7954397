"""Recommendations for the capacity review: the tuning playbook of docs/explanation/domain.md,
one knob each, and only where the week's numbers are evidence for it. Each rule is a pure
function of the report's numbers; its thresholds are named here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from review.weekly import Period, WeeklyReport

SATURATED_SHARE = 0.05  # KV above 90 % for 5 % of the week: KV-bound
RECOMPUTE_SHARE = 0.05  # …or preemptions redoing 5 % of the prefill work
CAP_SHARE = 0.2  # running at its peak in a fifth of the intervals: a cap binds
KV_ROOM = 0.70  # …while KV stays below this: the cap, not memory, is the limit
LONG_PROMPT_QUANTILE = 0.75
ITL_SPIKE = 2.0  # an interval's ITL p99 over twice the week's median interval
SPIKES_WITH_LONG_PROMPTS = 0.6
DIVERGENCE = 0.20  # hit rates 20 points apart across replicas
STORM_AFTER_DROP = pd.Timedelta(minutes=15)
LOW_UTILIZATION = 0.30
BUDGET_LOW = 0.5


@dataclass(frozen=True)
class Recommendation:
    replica: str  # "fleet" for the whole fleet
    title: str
    knob: str  # the one thing to change
    evidence: tuple[str, ...]  # the numbers that call for it
    # The what-if change the knob stands for (kneepoint.whatif.Change keys), None where the
    # twin has no such change; review/effects.py replays the week under it.
    change: dict[str, Any] | None = field(default=None, compare=False)
    effect: str = ""  # the predicted effect, or why there is none (review/effects.py)


def recommend(report: WeeklyReport) -> list[Recommendation]:
    found: list[Recommendation | None] = []
    for name, numbers in report.this.replicas.items():
        found += [
            kv_bound(name, numbers),
            raise_max_num_seqs(name, numbers),
            admission_cap(name, report.this.intervals.get(name)),
            drop_drafter(name, numbers),
            fill_troughs(name, numbers),
            more_gpus(name, numbers, report.this),
        ]
    found += [route_by_prefix(report.this), stagger_deploys(report.this)]
    return [r for r in found if r is not None]


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def kv_bound(name: str, n: dict[str, Any]) -> Recommendation | None:
    """KV-bound: saturated for a share of the week, or preempting (vLLM preempts only when
    the KV cache runs out) with a real share of prefill redone."""
    saturated, recompute = n.get("time_saturated"), n.get("recompute_share_of_prefill")
    preempted = n.get("preemptions") or 0
    if (saturated is None or saturated < SATURATED_SHARE) and (
        not preempted or recompute is None or recompute < RECOMPUTE_SHARE
    ):
        return None
    return Recommendation(
        name,
        "The KV cache is the limit",
        "--kv-cache-dtype fp8 (twice the tokens in the same memory), or a shorter --max-model-len",
        (
            f"KV above 90 % for {_pct(saturated)} of the week",
            f"peak KV occupancy {_pct(n.get('peak_kv_occupancy'))}",
            f"{preempted:,.0f} preemptions, {_pct(recompute)} of prefill recomputed",
        ),
        {"kv_cache_dtype": "fp8"},
    )


def raise_max_num_seqs(name: str, n: dict[str, Any]) -> Recommendation | None:
    at_cap, waiting, kv = (
        n.get("running_at_cap_share"),
        n.get("peak_waiting"),
        n.get("p95_kv_occupancy"),
    )
    if at_cap is None or waiting is None or kv is None:
        return None
    if at_cap < CAP_SHARE or waiting <= 0 or kv >= KV_ROOM:
        return None
    return Recommendation(
        name,
        "Requests wait while KV memory is free",
        f"raise --max-num-seqs above {n.get('peak_running') or 0:.0f}",
        (
            f"running at its peak of {n.get('peak_running') or 0:.0f} "
            f"in {_pct(at_cap)} of intervals",
            f"up to {waiting:.0f} waiting",
            f"p95 KV occupancy only {_pct(kv)}",
        ),
        {"max_num_seqs": max(2, 2 * round(n.get("peak_running") or 1))},
    )


def admission_cap(name: str, intervals: pd.DataFrame | None) -> Recommendation | None:
    if intervals is None or intervals.empty:
        return None
    known = intervals.dropna(subset=["mean_prompt_tokens", "itl_p99_seconds"])
    if len(known) < 8:
        return None
    long_prompt = known.mean_prompt_tokens.quantile(LONG_PROMPT_QUANTILE)
    median_itl = known.itl_p99_seconds.median()
    spikes = known[known.itl_p99_seconds > ITL_SPIKE * median_itl]
    if len(spikes) < 2:
        return None
    with_long = (spikes.mean_prompt_tokens >= long_prompt).mean()
    if with_long < SPIKES_WITH_LONG_PROMPTS:
        return None
    return Recommendation(
        name,
        "Long prompts come with inter-token latency spikes",
        f"an admission cap on prompt length near {long_prompt:.0f} tokens "
        "(or a separate lane for long-context work)",
        (
            f"{len(spikes)} intervals with ITL p99 over {ITL_SPIKE:g}× the median "
            f"({median_itl * 1000:.0f} ms)",
            f"{_pct(with_long)} of them had mean prompts ≥ {long_prompt:.0f} tokens "
            "(the week's 75th percentile)",
        ),
    )


def drop_drafter(name: str, n: dict[str, Any]) -> Recommendation | None:
    if n.get("spec_verdict") != "slowing down":
        return None
    return Recommendation(
        name,
        "Speculative decoding slows this engine down",
        "drop the drafter, or replace it with one that matches the model (--speculative-config)",
        (f"expected speedup {n.get('spec_expected_speedup') or 0:.2f}× (below 1)",),
        {"num_speculative_tokens": 0},
    )


def fill_troughs(name: str, n: dict[str, Any]) -> Recommendation | None:
    utilization = n.get("utilization")
    if utilization is None or utilization >= LOW_UTILIZATION:
        return None
    return Recommendation(
        name,
        "The replica runs far below its knee",
        "fill the troughs with batch work, or serve this traffic from a hosted API",
        (
            f"load vs knee {_pct(utilization)} (generated tokens/s ÷ the knee's)",
            f"{n.get('idle_gpu_hours') or 0:.1f} idle GPU-hours",
            f"break-even against the API at {_pct(n.get('break_even_utilization'))}",
        ),
    )


def more_gpus(name: str, n: dict[str, Any], period: Period) -> Recommendation | None:
    headroom = n.get("headroom")
    if headroom is None or headroom > 0:
        return None
    burning = [
        s
        for s in period.slos
        if s.burning or (s.budget.budget_left is not None and s.budget.budget_left < BUDGET_LOW)
    ]
    if not burning:
        return None
    return Recommendation(
        name,
        "Production runs at the knee and the SLO budget burns",
        "more or bigger GPUs (another replica behind the router)",
        (
            f"peak concurrency {n.get('peak_running') or 0:.0f} against a knee of "
            f"{n.get('knee_concurrency')}",
            *(f"{s.slo.name}: budget left {_pct(s.budget.budget_left)}" for s in burning),
        ),
        {"replicas": 2},
    )


def route_by_prefix(period: Period) -> Recommendation | None:
    divergence = period.fleet.get("hit_rate_divergence")
    drops = period.view.events.get("hit_rate_drops", [])
    if (divergence is None or divergence < DIVERGENCE) and not drops:
        return None
    rates = ", ".join(
        f"{name} {_pct(n.get('prefix_cache_hit_rate'))}" for name, n in period.replicas.items()
    )
    evidence = [f"prefix hit rates: {rates}"]
    if divergence is not None and divergence >= DIVERGENCE:
        evidence.append(f"{divergence:.0%} points apart")
    evidence += [
        f"fleet hit rate fell to {e.value:.0%} (from {e.baseline:.0%}) at {e.start:%a %H:%M}"
        for e in drops[:5]
    ]
    return Recommendation(
        "fleet",
        "Prefix-cache hits are lost to routing",
        "prefix- or session-aware routing, so each agent's turns land where its prefix is cached",
        tuple(evidence),
    )


def stagger_deploys(period: Period) -> Recommendation | None:
    storms = period.view.events.get("prefill_storms", [])
    drops = period.view.events.get("hit_rate_drops", [])
    after_drop = [
        s for s in storms if any(abs(s.start - d.start) <= STORM_AFTER_DROP for d in drops)
    ]
    if not after_drop:
        return None
    return Recommendation(
        "fleet",
        "Prefill storms follow prompt or tool deploys",
        "stagger prompt and tool-schema deploys across replicas (one first, the rest once its "
        "cache is warm)",
        tuple(
            f"prefill burst at {s.start:%a %H:%M}: {s.value:,.0f} computed prompt tokens/s "
            f"against {s.baseline:,.0f}, with the hit rate falling"
            for s in after_drop[:5]
        ),
    )
