"""kneepoint's rules as Prometheus recording and alerting rules, for teams that run
Alertmanager: each metric a rule watches as a recording rule over vLLM's and dcgm-exporter's
own series (every spelling docs/reference/metrics.md lists), each rule as an alert on it."""

from __future__ import annotations

from typing import Any

import yaml

from kneepoint import catalogue
from kneepoint.config import Rule
from kneepoint.durations import format_duration

# metric -> PromQL over the raw series, per replica (instance). Metrics with no faithful
# PromQL form (the recompute estimate, expected speedup, cost) are left out and listed.
EXPRESSIONS = catalogue.expressions()
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
