"""The numbers rules watch, per replica and for the fleet: read from the same View the
pages show and the same status the CLI prints, never computed a second way."""

from __future__ import annotations

from typing import Any

from kneepoint.views import View

FLEET = ""  # the fleet's "replica" in an alert's identity


def _p99(block: dict[str, float | None] | None) -> float | None:
    return None if block is None else block.get("p99")


def _drop(baseline: float | None, now: float | None) -> float | None:
    return None if baseline is None or now is None else baseline - now


def replica_values(
    replica: dict[str, Any],
    extra: dict[str, Any],
    gpus: list[dict[str, Any]],
    baseline: dict[str, Any] | None,
) -> dict[str, float | None]:
    up = replica.get("up")
    return {
        "kv_cache_occupancy": replica["kv_cache_occupancy"],
        "requests_waiting": replica["requests_waiting"],
        "requests_waiting_capacity": replica["requests_waiting_capacity"],
        "preemptions_per_second": replica["preemptions_per_second"],
        "recompute_share_of_prefill": extra.get("recompute_share_of_prefill"),
        "prefix_cache_hit_rate": replica["prefix_cache_hit_rate"],
        "prefix_cache_hit_rate_drop": _drop(
            baseline["prefix_cache_hit_rate"] if baseline else None,
            replica["prefix_cache_hit_rate"],
        ),
        "spec_expected_speedup": extra.get("spec_expected_speedup"),
        "spec_decode_acceptance_rate": replica["spec_decode_acceptance_rate"],
        "gpu_utilization": replica["gpu_utilization"],
        "cost_per_million_tokens": replica["cost_per_million_tokens"],
        "ttft_p99_seconds": _p99(replica["ttft_seconds"]),
        "itl_p99_seconds": _p99(replica["itl_seconds"]),
        "up": None if up is None else float(up),
        "xid_errors": float(sum(1 for g in gpus if g.get("xid_error")))
        if gpus and any(g.get("xid_error") is not None for g in gpus)
        else None,
    }


def values(view: View, baseline: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Metric values keyed by replica name ("" for the fleet). `view` is the evaluation
    window's (5 minutes); `baseline` a status over the last hour, for drops."""
    before = {r["name"]: r for r in baseline["replicas"]}
    out = {}
    for replica in view.status["replicas"]:
        gpus = [g for g in view.status["gpus"] if g["replica"] == replica["name"]]
        out[replica["name"]] = replica_values(
            replica, view.rows.get(replica["name"], {}), gpus, before.get(replica["name"])
        )
    fleet = view.status["fleet"]
    shares = [v["recompute_share_of_prefill"] for v in out.values()]
    known_shares = [s for s in shares if s is not None]
    out[FLEET] = {
        **replica_values({**fleet, "up": None}, {}, view.status["gpus"], baseline["fleet"]),
        "recompute_share_of_prefill": max(known_shares) if known_shares else None,
    }
    return out
