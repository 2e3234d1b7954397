"""The numbers rules watch, per replica and for the fleet: read from the same View the
pages show and the same status the CLI prints, never computed a second way."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from alerts.rules import METRICS
from kneepoint.config import Config
from kneepoint.health import check_jobs
from kneepoint.records import (
    FleetNumbers,
    GpuStatus,
    HitRate,
    HitRates,
    Numbers,
    PageNumbers,
    Status,
)
from kneepoint.samples import unavailable_reason
from kneepoint.status import stale_targets
from kneepoint.store.models import NotificationRow
from kneepoint.views import View

FLEET = ""  # the fleet's "replica" in an alert's identity
PIPELINE_JOBS = ("alerts", "deliver")  # evaluation and delivery of notifications
FAILED_WITHIN = 3600.0  # notifications refused for good this recently count as a problem


def _p99(block: dict[str, float | None] | None) -> float | None:
    return None if block is None else block.get("p99")


def _stalled(replica: Numbers) -> float | None:
    """1 while work has sat with frozen counters since the previous sample (any length: the
    `engine-stalled` rule's `for` is the time it must last), 0 when not (and for a target
    whose scrapes fail: that is `target-down`), None without data (kneepoint.status._stall)."""
    if replica.get("stalled") is None:
        return None
    return 1.0 if replica.get("stall_seconds") else 0.0


def _saturated(replica: Numbers) -> float | None:
    """1 when the replica's saturation verdict says saturated, 0 when not, None when it
    could not be judged (kneepoint.derived.saturation; its reasons are in the status)."""
    verdict = replica.get("saturation")
    if not isinstance(verdict, dict) or verdict.get("saturated") is None:
        return None
    return 1.0 if verdict["saturated"] else 0.0


def _drop(baseline: float | None, now: float | None) -> float | None:
    return None if baseline is None or now is None else baseline - now


def replica_values(
    replica: Numbers,
    extra: PageNumbers | None,  # the replica's row of the view; None for the fleet
    gpus: list[GpuStatus],
    baseline: HitRate | None,
) -> dict[str, float | None]:
    # A stale target's `up` is no data, not a failed scrape: `collector-stale` says that
    # kneepoint stopped watching, `target-down` stays for targets that refuse.
    up = None if replica.get("stale") else replica.get("up")
    return {
        "kv_cache_occupancy": replica["kv_cache_occupancy"],
        "requests_waiting": replica["requests_waiting"],
        "requests_waiting_capacity": replica["requests_waiting_capacity"],
        "preemptions_per_second": replica["preemptions_per_second"],
        "requests_refused_per_second": replica["requests_refused_per_second"],
        "recompute_share_of_prefill": extra["recompute_share_of_prefill"] if extra else None,
        "prefix_cache_hit_rate": replica["prefix_cache_hit_rate"],
        "prefix_cache_hit_rate_drop": _drop(
            baseline["prefix_cache_hit_rate"] if baseline else None,
            replica["prefix_cache_hit_rate"],
        ),
        "spec_expected_speedup": extra["spec_expected_speedup"] if extra else None,
        "spec_decode_acceptance_rate": replica["spec_decode_acceptance_rate"],
        "gpu_utilization": replica["gpu_utilization"],
        "cost_per_million_tokens": replica["cost_per_million_tokens"],
        "ttft_p99_seconds": _p99(replica["ttft_seconds"]),
        "itl_p99_seconds": _p99(replica["itl_seconds"]),
        "up": None if up is None else float(up),
        "engine_stalled": _stalled(replica),
        "replica_saturated": _saturated(replica),
        "xid_errors": float(sum(1 for g in gpus if g.get("xid_error")))
        if gpus and any(g.get("xid_error") is not None for g in gpus)
        else None,
    }


def values(view: View, baseline: HitRates | Status) -> dict[str, dict[str, float | None]]:
    """Metric values keyed by replica name ("" for the fleet). `view` is the evaluation
    window's (5 minutes); `baseline` the last hour's hit rates, for drops: a status over it,
    or kneepoint.status.hit_rates (the same numbers, only those)."""
    before = {r["name"]: r for r in baseline["replicas"]}
    gpus_of: dict[str | None, list[GpuStatus]] = {}
    for gpu in view.status["gpus"]:
        gpus_of.setdefault(gpu["replica"], []).append(gpu)
    out = {}
    for replica in view.status["replicas"]:
        gpus = gpus_of.get(replica["name"], [])
        out[replica["name"]] = replica_values(
            replica, view.rows.get(replica["name"]), gpus, before.get(replica["name"])
        )
    fleet: FleetNumbers = {**view.status["fleet"], "up": None}
    shares = [v["recompute_share_of_prefill"] for v in out.values()]
    known_shares = [s for s in shares if s is not None]
    out[FLEET] = {
        **replica_values(fleet, None, view.status["gpus"], baseline["fleet"]),
        "replica_saturated": None,  # a replica's verdict: the fleet's is saturated_replicas
        "recompute_share_of_prefill": max(known_shares) if known_shares else None,
    }
    return out


def not_exposed(status: Status) -> dict[str, dict[str, str]]:
    """Per replica ("" for the fleet): each rule metric its engine does not expose, and why
    (from the replica's `unavailable` in the status; the fleet's lists what no replica
    exposes).

    An asleep replica (vLLM's sleep mode: `asleep` in the status) exposes none: it was put
    to sleep on purpose, so no rule applies to it while it sleeps (kneepoint.derived.stall:
    never stalled). Through alerts.lifecycle.evaluate that means no rule pends or fires on
    it, and an alert pending or firing when it goes to sleep ends, resolved, with the reason
    (`asleep`); the fleet's rules still count it as they did."""
    blocks = [(r["name"], r.get("unavailable") or {}) for r in status["replicas"]]
    blocks.append((FLEET, status["fleet"].get("unavailable") or {}))
    out: dict[str, dict[str, str]] = {}
    for name, unavailable in blocks:
        reasons = {
            metric: reason
            for metric in METRICS
            if (reason := unavailable_reason(unavailable, metric)) is not None
        }
        if reasons:
            out[name] = reasons
    for replica in status["replicas"]:
        if replica.get("asleep"):
            reason = asleep(replica.get("sleep_state"))
            out[replica["name"]] = dict.fromkeys(METRICS, reason)
    return out


def asleep(state: str | None) -> str:
    """Why no rule applies to an asleep replica (the note of an alert it ends)."""
    return f"the replica is asleep ({state or 'sleep mode'}): put to sleep on purpose"


def engine_since(status: Status, stored: dict[str, float | None]) -> dict[str, float]:
    """Per replica of the status ("" for the fleet): when its engine was first seen (epoch
    seconds; `stored`: targets.engine_since by name, None not known: left out, read as long
    ago). The fleet's is its latest replica's: a metric no replica exposes any more stopped
    being exposed when the last one that did changed its engine."""
    out = {
        name: since
        for replica in status["replicas"]
        if (since := stored.get(name := replica["name"])) is not None
    }
    if out:
        out[FLEET] = max(out.values())
    return out


def monitor_values(session: Session, config: Config, now: float) -> dict[str, float]:
    """The fleet's numbers about kneepoint itself: `stale_targets`, how many configured
    targets have not been scraped lately (kneepoint.status.is_stale), and
    `alert_pipeline_problems`, how many of these hold: the alerts job failing or overdue,
    the deliver job failing or overdue (each only once it has run: kneepoint.health), and
    notifications refused for good in the last hour."""
    checks = {c.job: c for c in check_jobs(session, config, now)}
    problems = sum(1 for job in PIPELINE_JOBS if job in checks and not checks[job].ok)
    failed = session.scalar(
        select(func.count())
        .select_from(NotificationRow)
        .where(NotificationRow.state == "failed", NotificationRow.created_at >= now - FAILED_WITHIN)
    )
    return {
        "stale_targets": float(len(stale_targets(session, config, now))),
        "alert_pipeline_problems": float(problems + (1 if failed else 0)),
    }
