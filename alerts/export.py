"""kneepoint's rules as Prometheus recording and alerting rules, for teams that run
Alertmanager: each metric a rule watches as a recording rule over vLLM's and dcgm-exporter's
own series (every spelling docs/reference/metrics.md lists), each rule as an alert on it."""

from __future__ import annotations

from typing import Any

import yaml

from kneepoint.config import Rule
from kneepoint.durations import format_duration


def _rate(counter: str, window: str = "5m") -> str:
    return f"sum by (instance) (rate({counter}[{window}]))"


def _ratio(part: str, whole: str, window: str = "5m") -> str:
    return f"{_rate(part, window)} / {_rate(whole, window)}"


def _p99(*histograms: str) -> str:
    rates = " or ".join(f"rate({h}_bucket[5m])" for h in histograms)
    return f"histogram_quantile(0.99, sum by (instance, le) ({rates}))"


HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"

# metric -> PromQL over the raw series, per replica (instance). Metrics with no faithful
# PromQL form (the recompute estimate, expected speedup, cost) are left out and listed.
EXPRESSIONS = {
    "kv_cache_occupancy": (
        "max by (instance) (vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc)"
    ),
    "requests_waiting": "sum by (instance) (vllm:num_requests_waiting)",
    "requests_waiting_capacity": (
        'sum by (instance) (vllm:num_requests_waiting_by_reason{reason="capacity"})'
    ),
    "preemptions_per_second": _rate("vllm:num_preemptions_total"),
    "prefix_cache_hit_rate": _ratio(HITS, QUERIES),
    "prefix_cache_hit_rate_drop": f"({_ratio(HITS, QUERIES, '1h')}) - ({_ratio(HITS, QUERIES)})",
    "spec_decode_acceptance_rate": _ratio(
        "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"
    ),
    "gpu_utilization": (
        "avg by (Hostname) (DCGM_FI_PROF_GR_ENGINE_ACTIVE or DCGM_FI_DEV_GPU_UTIL / 100)"
    ),
    "ttft_p99_seconds": _p99("vllm:time_to_first_token_seconds"),
    "itl_p99_seconds": _p99(
        "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"
    ),
    "up": 'up{job=~".*vllm.*"}',
    "xid_errors": "count by (Hostname) (DCGM_FI_DEV_XID_ERRORS > 0)",
}
WHERE = "{{ $labels.instance }}{{ $labels.Hostname }}"


def prometheus_rules(rules: list[Rule]) -> tuple[str, list[str]]:
    """The rules file (YAML) and the rules that could not be expressed, with why."""
    used = sorted({r.metric for r in rules if r.metric in EXPRESSIONS})
    recording = [{"record": f"kneepoint:{m}", "expr": EXPRESSIONS[m]} for m in used]
    alerting: list[dict[str, Any]] = []
    left_out = []
    for rule in rules:
        if rule.metric not in EXPRESSIONS:
            left_out.append(f"{rule.name}: {rule.metric} has no PromQL form here")
            continue
        alert: dict[str, Any] = {
            "alert": rule.name,
            "expr": f"kneepoint:{rule.metric} {rule.op} {rule.threshold:g}",
            "labels": {"severity": rule.severity, **rule.labels},
            "annotations": {
                "summary": f"{rule.metric} {rule.op} {rule.threshold:g} on {WHERE}",
                "value": "{{ $value }}",
                "runbook": rule.runbook,
            },
        }
        if rule.for_ > 0:
            alert["for"] = format_duration(rule.for_)
        if rule.resolve_threshold is not None:  # Prometheus has no hysteresis
            left_out.append(
                f"{rule.name}: resolve_threshold {rule.resolve_threshold:g} dropped (Prometheus "
                "alerts resolve at the threshold itself)"
            )
        alerting.append(alert)
    document = {
        "groups": [
            {"name": "kneepoint-recording", "rules": recording},
            {"name": "kneepoint-alerts", "rules": alerting},
        ]
    }
    return yaml.safe_dump(document, sort_keys=False, width=1000), left_out
