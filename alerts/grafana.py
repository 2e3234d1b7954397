"""Grafana dashboards for teams that live in Grafana (`kneepoint export grafana`): overview,
capacity, prefix cache and SLOs, built with grafana-foundation-sdk (Grafana's own typed
builders) over Prometheus.

The panels read the `kneepoint:*` recording rules `kneepoint alerts export` writes where
one exists for the number (so Grafana, Alertmanager and kneepoint agree), and otherwise
vLLM's and dcgm-exporter's own series with their real names: counters end in `_total`
(`vllm:num_preemptions_total`: the bare `vllm:num_preemptions` that vLLM's and llm-d's
example rules query does not exist and never fires). Series an older vLLM names differently
are joined with `or`, newest first, as alerts/export.py does.

Every function is pure: it returns the dashboard as a JSON-ready dict. The variables are
`datasource` (a Prometheus data source), `instance` (the replicas: vLLM's scrape targets) and
`host` (dcgm-exporter's `Hostname`); "All" sends each one's `.*`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from alerts.export import EXPRESSIONS
from alerts.slo import BURN_WINDOWS
from kneepoint.config import Slo
from kneepoint.durations import format_duration

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
REPLICA = 'instance=~"$instance"'
HOST = 'Hostname=~"$host"'
TOKENS_PER_SECOND = "suffix: tokens/s"  # Grafana's custom unit: the value, then the suffix
WINDOW = "5m"  # the recording rules' window (alerts/export.py)

# The number each recording rule carries, by the label it is kept per.
HOST_KEYED = {"gpu_utilization", "xid_errors"}
# A series every replica (every vLLM generation) and every GPU exposes, to keep an
# expression's rows to the chosen replicas or hosts where no recording rule carries the number.
ANCHOR = {
    "instance": f"vllm:num_requests_running{{{REPLICA}}}",
    "Hostname": f"DCGM_FI_DEV_GPU_TEMP{{{HOST}}}",
}
# A latency SLO's metric -> its vLLM histograms, newest name first.
HISTOGRAMS = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
}
# Prefix-cache counters (tokens), newest name first (gpu_prefix_cache_* up to vLLM 0.11).
HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
LABELS = {"ttft": "TTFT", "itl": "ITL", "e2e": "End-to-end latency", "queue": "Queue time"}
FAILED = 'finished_reason=~"error|abort"'  # alerts/slo.py: a finished request that failed
SERVER_ERROR = 'status=~"5.."'  # vLLM's API server groups codes: "2xx", "5xx"


@dataclass
class Target:
    expr: str
    legend: str = "{{instance}}"


@dataclass
class Panel:
    title: str
    description: str
    unit: str
    targets: list[Target]
    kind: str = "timeseries"  # or "stat"
    width: int = 12
    height: int = 8
    low: float | None = None
    high: float | None = None
    red_at: float | None = None  # red from here up: a threshold line or a stat's colour
    green_at: float | None = None  # red below, green from here up (a budget, a compliance)


@dataclass
class Section:
    title: str
    panels: list[Panel] = field(default_factory=list)


def recorded_metrics(rules_yaml: str) -> set[str]:
    """The metrics `kneepoint alerts export` writes a `kneepoint:<metric>` record for, read
    from the rules file it writes (alerts/export.py `prometheus_rules`)."""
    document = yaml.safe_load(rules_yaml)
    return {
        rule["record"].removeprefix("kneepoint:")
        for group in document["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


def _sel(name: str, *matchers: str, host: bool = False) -> str:
    return f"{name}{{{', '.join([HOST if host else REPLICA, *matchers])}}}"


def _rate(
    *names: str, by: str = "instance", matchers: tuple[str, ...] = (), window: str = WINDOW
) -> str:
    rates = " or ".join(f"rate({_sel(n, *matchers)}[{window}])" for n in names)
    return f"sum by ({by}) ({rates})"


def _quantile(q: float, histograms: tuple[str, ...], by: str = "instance") -> str:
    rates = " or ".join(f"rate({_sel(h + '_bucket')}[{WINDOW}])" for h in histograms)
    return f"histogram_quantile({q:g}, sum by ({by}, le) ({rates}))"


def metric(name: str, recorded: set[str]) -> str:
    """The per-replica (or per-host) PromQL of one of kneepoint's rule metrics: its
    recording rule where `kneepoint alerts export` writes one, else the rule's own expression
    kept to the chosen replicas or hosts."""
    host = name in HOST_KEYED
    if name in recorded:
        return f"kneepoint:{name}{{{HOST if host else REPLICA}}}"
    by = "Hostname" if host else "instance"
    return f"({EXPRESSIONS[name]}) and on ({by}) {ANCHOR[by]}"


# ---- the four dashboards ------------------------------------------------------------------


def _overview(recorded: set[str]) -> list[Section]:
    latency = [
        Panel(
            f"{label} p99",
            f"99th percentile of {what} per replica over {WINDOW}, from vLLM's histogram "
            "(interpolated inside the bucket, as PromQL's histogram_quantile does).",
            "s",
            [Target(expr)],
            width=8,
        )
        for label, what, expr in (
            (
                "Time to first token",
                "the time from a request's arrival to its first token",
                metric("ttft_p99_seconds", recorded)
                if "ttft_p99_seconds" in recorded
                else _quantile(0.99, HISTOGRAMS["ttft"]),
            ),
            (
                "Inter-token latency",
                "the time between two tokens of a request (one engine step)",
                metric("itl_p99_seconds", recorded)
                if "itl_p99_seconds" in recorded
                else _quantile(0.99, HISTOGRAMS["itl"]),
            ),
            (
                "End-to-end latency",
                "a request's whole time, arrival to last token",
                _quantile(0.99, HISTOGRAMS["e2e"]),
            ),
        )
    ]
    return [
        Section(
            "Fleet now",
            [
                Panel(
                    "Replicas up",
                    "Replicas whose last scrape answered (Prometheus's `up` for vLLM jobs, "
                    "recorded as kneepoint:up).",
                    "short",
                    [Target(f"sum({metric('up', recorded)})", "up")],
                    kind="stat",
                    width=4,
                    height=4,
                ),
                Panel(
                    "Requests running",
                    "Requests in the running batches of the chosen replicas.",
                    "short",
                    [Target(f"sum({_sel('vllm:num_requests_running')})", "running")],
                    kind="stat",
                    width=4,
                    height=4,
                ),
                Panel(
                    "Requests waiting",
                    "Requests queued: waiting for KV-cache capacity or deferred.",
                    "short",
                    [Target(f"sum({_sel('vllm:num_requests_waiting')})", "waiting")],
                    kind="stat",
                    width=4,
                    height=4,
                ),
                Panel(
                    "KV cache occupancy (highest replica)",
                    "The fullest replica's KV cache (a fraction, despite vLLM's `_perc` name). "
                    "Past 0.9 the next agent waits.",
                    "percentunit",
                    [Target(f"max({metric('kv_cache_occupancy', recorded)})", "max")],
                    kind="stat",
                    width=4,
                    height=4,
                    low=0,
                    high=1,
                    red_at=0.9,
                ),
                Panel(
                    "Prefix-cache hit rate",
                    "Prompt tokens found in the prefix cache over those looked up, token-"
                    f"weighted across the chosen replicas, over {WINDOW}.",
                    "percentunit",
                    [
                        Target(
                            f"sum({_rate(*HITS)}) / sum({_rate(*QUERIES)})",
                            "hit rate",
                        )
                    ],
                    kind="stat",
                    width=4,
                    height=4,
                    low=0,
                    high=1,
                ),
                Panel(
                    "Generated tokens",
                    f"Output tokens per second over the chosen replicas ({WINDOW} rate).",
                    TOKENS_PER_SECOND,
                    [Target(f"sum({_rate('vllm:generation_tokens_total')})", "generated")],
                    kind="stat",
                    width=4,
                    height=4,
                ),
            ],
        ),
        Section(
            "Throughput and load",
            [
                Panel(
                    "Token throughput",
                    f"Prompt and generated tokens per second per replica ({WINDOW} rate of "
                    "vllm:prompt_tokens_total and vllm:generation_tokens_total).",
                    TOKENS_PER_SECOND,
                    [
                        Target(_rate("vllm:prompt_tokens_total"), "{{instance}} prompt"),
                        Target(_rate("vllm:generation_tokens_total"), "{{instance}} generated"),
                    ],
                ),
                Panel(
                    "Requests running and waiting",
                    "Per replica: the running batch and the queue behind it. A queue that "
                    "grows while the batch stays flat is a replica at its knee.",
                    "short",
                    [
                        Target(
                            f"sum by (instance) ({_sel('vllm:num_requests_running')})",
                            "{{instance}} running",
                        ),
                        Target(
                            f"sum by (instance) ({_sel('vllm:num_requests_waiting')})",
                            "{{instance}} waiting",
                        ),
                    ],
                ),
                Panel(
                    "Finished requests by reason",
                    f"Requests finished per second by vLLM's finished_reason ({WINDOW} rate "
                    "of vllm:request_success_total): stop and length are served, error and "
                    "abort failed.",
                    "reqps",
                    [
                        Target(
                            _rate("vllm:request_success_total", by="finished_reason"),
                            "{{finished_reason}}",
                        )
                    ],
                ),
                Panel(
                    "Replica up",
                    "1 while Prometheus scrapes the replica, 0 when the scrape fails "
                    "(kneepoint:up). An engine that is up but stalled still shows 1: see "
                    "kneepoint's engine-stalled alert.",
                    "short",
                    [Target(metric("up", recorded))],
                    low=0,
                    high=1,
                ),
            ],
        ),
        Section("Latency", latency),
        Section(
            "Speculative decoding",
            [
                Panel(
                    "Draft acceptance rate",
                    "Accepted draft tokens over proposed draft tokens per replica "
                    "(kneepoint:spec_decode_acceptance_rate); no data without a drafter.",
                    "percentunit",
                    [Target(metric("spec_decode_acceptance_rate", recorded))],
                    width=24,
                    low=0,
                    high=1,
                ),
            ],
        ),
    ]


def _capacity(recorded: set[str]) -> list[Section]:
    return [
        Section(
            "KV cache and queue",
            [
                Panel(
                    "KV cache occupancy",
                    "Per replica, the fullest engine's KV cache (kneepoint:kv_cache_occupancy, "
                    "vllm:kv_cache_usage_perc or the older gpu_cache_usage_perc: a fraction). "
                    "The line at 0.9 is kneepoint's kv-cache-saturated rule.",
                    "percentunit",
                    [Target(metric("kv_cache_occupancy", recorded))],
                    low=0,
                    high=1,
                    red_at=0.9,
                ),
                Panel(
                    "Waiting for KV-cache capacity",
                    "Requests waiting because the KV cache is full "
                    "(kneepoint:requests_waiting_capacity, vLLM's num_requests_waiting_by_reason"
                    '{reason="capacity"}): the saturation signal. Older vLLM has no such split.',
                    "short",
                    [Target(metric("requests_waiting_capacity", recorded))],
                    low=0,
                ),
                Panel(
                    "Preemptions",
                    "Preemptions per second per replica (kneepoint:preemptions_per_second, the "
                    "rate of vllm:num_preemptions_total). Each one throws away a request's KV "
                    "cache and recomputes its prefill later.",
                    "suffix: preemptions/s",
                    [Target(metric("preemptions_per_second", recorded))],
                    low=0,
                ),
                Panel(
                    "Queue time p99",
                    "99th percentile of a request's first wait in the queue, per replica "
                    "(vllm:request_queue_time_seconds; waits after a preemption are not in it).",
                    "s",
                    [Target(_quantile(0.99, HISTOGRAMS["queue"]))],
                ),
                Panel(
                    "Concurrency",
                    "Requests in the system per replica (running + waiting): read it against "
                    "the replica's knee from `kneepoint knee`.",
                    "short",
                    [
                        Target(
                            f"sum by (instance) ({_sel('vllm:num_requests_running')}) + "
                            f"sum by (instance) ({_sel('vllm:num_requests_waiting')})"
                        )
                    ],
                    low=0,
                ),
                Panel(
                    "Tokens per engine step",
                    "Mean tokens an engine step processes per replica "
                    "(vllm:iteration_tokens_total, a histogram): low under load means small "
                    "batches.",
                    "short",
                    [
                        Target(
                            f"{_rate('vllm:iteration_tokens_total_sum')} / "
                            f"{_rate('vllm:iteration_tokens_total_count')}"
                        )
                    ],
                    low=0,
                ),
            ],
        ),
        Section(
            "GPUs (dcgm-exporter)",
            [
                Panel(
                    "GPU utilization",
                    "Per host, the graphics engine's active share (kneepoint:gpu_utilization: "
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE, else GPU_UTIL / 100, which only says a "
                    "kernel ran).",
                    "percentunit",
                    [Target(metric("gpu_utilization", recorded), "{{Hostname}}")],
                    low=0,
                    high=1,
                ),
                Panel(
                    "Memory bandwidth in use",
                    "DCGM_FI_PROF_DRAM_ACTIVE per GPU: decode is bandwidth-bound, so this is "
                    "its saturation signal. Absent on GPUs without profiling fields.",
                    "percentunit",
                    [Target(_sel("DCGM_FI_PROF_DRAM_ACTIVE", host=True), "{{Hostname}}/{{gpu}}")],
                    low=0,
                    high=1,
                ),
                Panel(
                    "Power",
                    "Board power draw per GPU (DCGM_FI_DEV_POWER_USAGE).",
                    "watt",
                    [Target(_sel("DCGM_FI_DEV_POWER_USAGE", host=True), "{{Hostname}}/{{gpu}}")],
                    low=0,
                ),
                Panel(
                    "Temperature",
                    "GPU temperature per GPU (DCGM_FI_DEV_GPU_TEMP).",
                    "celsius",
                    [Target(_sel("DCGM_FI_DEV_GPU_TEMP", host=True), "{{Hostname}}/{{gpu}}")],
                ),
                Panel(
                    "Frame buffer used",
                    "GPU memory in use per GPU (DCGM_FI_DEV_FB_USED, MiB). Flat near the top "
                    "is normal: vLLM preallocates its KV cache.",
                    "mbytes",
                    [Target(_sel("DCGM_FI_DEV_FB_USED", host=True), "{{Hostname}}/{{gpu}}")],
                    low=0,
                ),
                Panel(
                    "GPUs with an XID error",
                    "GPUs per host whose last XID is not 0 (kneepoint:xid_errors). No series: "
                    "no XID so far.",
                    "short",
                    [Target(metric("xid_errors", recorded), "{{Hostname}}")],
                    low=0,
                    red_at=1,
                ),
            ],
        ),
    ]


def _prefix_cache(recorded: set[str]) -> list[Section]:
    return [
        Section(
            "Prefix cache",
            [
                Panel(
                    "Hit rate",
                    "Prompt tokens found in the prefix cache over tokens looked up, per replica "
                    f"over {WINDOW} (kneepoint:prefix_cache_hit_rate). No data when caching is "
                    "off or the replica is idle.",
                    "percentunit",
                    [Target(metric("prefix_cache_hit_rate", recorded))],
                    low=0,
                    high=1,
                ),
                Panel(
                    "Hit-rate drop",
                    "The last hour's hit rate minus the last 5 minutes' "
                    "(kneepoint:prefix_cache_hit_rate_drop): a sudden rise means prompts stopped "
                    "sharing prefixes (a new prompt version, routing that scatters sessions).",
                    "percentunit",
                    [Target(metric("prefix_cache_hit_rate_drop", recorded))],
                ),
                Panel(
                    "Lookups and hits",
                    "Prompt tokens looked up in and found in the prefix cache per second per "
                    "replica (vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total; "
                    "gpu_prefix_cache_* before vLLM 0.12).",
                    TOKENS_PER_SECOND,
                    [
                        Target(_rate(*QUERIES), "{{instance}} looked up"),
                        Target(_rate(*HITS), "{{instance}} hit"),
                    ],
                    low=0,
                ),
                Panel(
                    "Prompt tokens by source",
                    "Where prompt tokens came from per second (vllm:prompt_tokens_by_source_"
                    "total): computed here, found in the local cache, or transferred from "
                    "another instance's KV cache.",
                    TOKENS_PER_SECOND,
                    [
                        Target(
                            _rate("vllm:prompt_tokens_by_source_total", by="instance, source"),
                            "{{instance}} {{source}}",
                        )
                    ],
                    low=0,
                ),
                Panel(
                    "External KV cache hit rate",
                    "Hits over lookups of a KV connector's cache (LMCache and the like: "
                    "vllm:external_prefix_cache_*_total). No data without a connector.",
                    "percentunit",
                    [
                        Target(
                            f"{_rate('vllm:external_prefix_cache_hits_total')} / "
                            f"{_rate('vllm:external_prefix_cache_queries_total')}"
                        )
                    ],
                    low=0,
                    high=1,
                ),
                Panel(
                    "Cached share of prompt tokens",
                    "Cached prompt tokens over all prompt tokens per replica "
                    "(vllm:prompt_tokens_cached_total / vllm:prompt_tokens_total): the "
                    "prefill work the cache saved.",
                    "percentunit",
                    [
                        Target(
                            f"{_rate('vllm:prompt_tokens_cached_total')} / "
                            f"{_rate('vllm:prompt_tokens_total')}"
                        )
                    ],
                    low=0,
                    high=1,
                ),
            ],
        )
    ]


def _le(threshold: float) -> str:
    """A matcher for the bucket bound `threshold` however the exposition wrote it (vLLM
    writes `0.5` and `1.0`; Prometheus 3 normalizes `1` to `1.0`)."""
    bound = f"{threshold:g}"
    pattern = re.escape(bound) + ("(\\.0+)?" if bound.isdigit() else "0*")
    return 'le=~"' + pattern.replace("\\", "\\\\") + '"'


def latency_bad_share(slo: Slo, window: str) -> str:
    """The share of the chosen replicas' requests slower than the SLO's threshold over
    `window`, from the histogram's cumulative count at the threshold (alerts/slo.py: the
    threshold must be a bucket bound)."""
    assert slo.metric is not None and slo.threshold is not None
    names = HISTOGRAMS[slo.metric]
    le = _le(slo.threshold)
    good = " or ".join(f"rate({_sel(n + '_bucket', le)}[{window}])" for n in names)
    every = " or ".join(f"rate({_sel(n + '_count')}[{window}])" for n in names)
    return f"1 - sum({good}) / sum({every})"


def availability_bad_share(window: str) -> str:
    """The larger of the engine's failed share (finished_reason error or abort over all
    finished requests) and the API server's 5xx share, over `window`, as alerts/slo.py counts
    an availability SLO's requests. Stalled time, which kneepoint adds, has no PromQL form."""
    engine = (
        f"sum(rate({_sel('vllm:request_success_total', FAILED)}[{window}]))"
        f" / sum(rate({_sel('vllm:request_success_total')}[{window}]))"
    )
    every = f"sum(rate({_sel('http_requests_total')}[{window}]))"
    # A status code has a series only once answered: no 5xx series yet is a share of 0.
    server = (
        f"(sum(rate({_sel('http_requests_total', SERVER_ERROR)}[{window}])) or 0 * {every})"
        f" / {every}"
    )
    return (
        f'max(label_replace({engine}, "layer", "engine", "", "") or '
        f'label_replace({server}, "layer", "server", "", ""))'
    )


def _bad_share(slo: Slo, window: str) -> str:
    return (
        availability_bad_share(window)
        if slo.kind == "availability"
        else latency_bad_share(slo, window)
    )


def _slo_section(slo: Slo) -> Section:
    allowed = 1 - slo.objective
    whole = format_duration(slo.window)
    if slo.kind == "availability":
        what = (
            "failed requests (vLLM's finished_reason error or abort, or the API server's 5xx, "
            "whichever share is larger); kneepoint also counts a stalled engine's time, which "
            "Prometheus series cannot, so these panels can read better than kneepoint's "
            "SLOs page while an engine is stalled"
        )
    else:
        what = f"requests whose {slo.metric} exceeded {slo.threshold:g}s"
    factors = ", ".join(
        f"{format_duration(w.long)} × {w.budget_share * slo.window / w.long:.3g} ({w.severity})"
        for w in BURN_WINDOWS
    )
    panels = [
        Panel(
            "Error budget left",
            f"The share of the {whole} error budget not yet spent: 1 − bad share ÷ "
            f"{allowed:.4g}, where bad means {what}.",
            "percentunit",
            [Target(f"1 - ({_bad_share(slo, whole)}) / {allowed:g}", "budget left")],
            kind="stat",
            width=6,
            green_at=0,
        ),
        Panel(
            "Compliance",
            f"The share of good requests over the SLO window ({whole}); the objective is "
            f"{slo.objective:.4g}.",
            "percentunit",
            [Target(f"1 - ({_bad_share(slo, whole)})", "good")],
            kind="stat",
            width=6,
            green_at=slo.objective,
        ),
        Panel(
            "Burn rate",
            "Bad share over each alert window ÷ the share the objective allows "
            f"({allowed:.4g}); at 1 the budget lasts exactly {whole}. kneepoint alerts when a "
            f"long window and its short one both pass the window's factor: {factors}.",
            "short",
            [
                Target(
                    f"({_bad_share(slo, format_duration(w.long))}) / {allowed:g}",
                    f"{format_duration(w.long)} window",
                )
                for w in BURN_WINDOWS
            ],
            low=0,
            red_at=min(w.budget_share * slo.window / w.long for w in BURN_WINDOWS),
        ),
    ]
    if slo.kind == "latency":
        assert slo.metric is not None and slo.threshold is not None
        panels.append(
            Panel(
                f"{LABELS[slo.metric]} at the objective's quantile",
                f"The {slo.objective:.4g} quantile of {slo.metric} per replica over {WINDOW} "
                f"against the threshold {slo.threshold:g}s (the line).",
                "s",
                [Target(_quantile(slo.objective, HISTOGRAMS[slo.metric]))],
                width=24,
                red_at=slo.threshold,
            )
        )
    return Section(
        f"SLO {slo.name}: {slo.kind}, objective {slo.objective:.4g} over {whole}", panels
    )


def _slos(slos: list[Slo]) -> list[Section]:
    outcomes = Section(
        "Request outcomes",
        [
            Panel(
                "Failed share (engine)",
                "Finished requests whose finished_reason is error or abort over all finished "
                f"requests, over {WINDOW} (vllm:request_success_total).",
                "percentunit",
                [
                    Target(
                        f"{_rate('vllm:request_success_total', matchers=(FAILED,))}"
                        f" / {_rate('vllm:request_success_total')}"
                    )
                ],
                low=0,
            ),
            Panel(
                "5xx share (API server)",
                f"Responses with status 5xx over all responses of vLLM's API server over {WINDOW} "
                "(http_requests_total; absent where the server does not expose it).",
                "percentunit",
                [
                    Target(
                        f"({_rate('http_requests_total', matchers=(SERVER_ERROR,))} or "
                        f"0 * {_rate('http_requests_total')}) / {_rate('http_requests_total')}"
                    )
                ],
                low=0,
            ),
        ],
    )
    return [outcomes, *(_slo_section(slo) for slo in slos)]


# ---- building -----------------------------------------------------------------------------


def _variables() -> list[Builder[dm.VariableModel]]:
    return [
        gd.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        gd.QueryVariable("instance")
        .label("Replica")
        .description("vLLM replicas (their scrape targets' instance label).")
        .datasource(DATASOURCE)
        .query("label_values(vllm:num_requests_running, instance)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*"),
        gd.QueryVariable("host")
        .label("GPU host")
        .description("dcgm-exporter hosts (its Hostname label).")
        .datasource(DATASOURCE)
        .query("label_values(DCGM_FI_DEV_GPU_TEMP, Hostname)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*"),
    ]


def _thresholds(spec: Panel) -> gd.ThresholdsConfig:
    if spec.green_at is not None:
        steps = [dm.Threshold(None, "red"), dm.Threshold(spec.green_at, "green")]
    else:
        steps = [dm.Threshold(None, "green")]
        if spec.red_at is not None:
            steps.append(dm.Threshold(spec.red_at, "red"))
    return gd.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps)


def _panel(spec: Panel, panel_id: int) -> timeseries.Panel | stat.Panel:
    built: timeseries.Panel | stat.Panel
    if spec.kind == "stat":
        built = (
            stat.Panel()
            .reduce_options(gc.ReduceDataOptions().calcs(["lastNotNull"]))
            .graph_mode(cm.BigValueGraphMode.AREA)
        )
    else:
        built = (
            timeseries.Panel()
            .legend(
                gc.VizLegendOptions()
                .display_mode(cm.LegendDisplayMode.LIST)
                .placement(cm.LegendPlacement.BOTTOM)
                .show_legend(True)
            )
            .tooltip(gc.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI))
            .fill_opacity(10)
        )
        if spec.red_at is not None:
            built = built.thresholds_style(
                gc.GraphThresholdsStyleConfig().mode(cm.GraphTresholdsStyleMode.DASHED)
            )
    built = (
        built.id(panel_id)
        .title(spec.title)
        .description(spec.description)
        .unit(spec.unit)
        .datasource(DATASOURCE)
        .span(spec.width)
        .height(spec.height)
        .thresholds(_thresholds(spec))
    )
    if spec.low is not None:
        built = built.min(spec.low)
    if spec.high is not None:
        built = built.max(spec.high)
    for index, target in enumerate(spec.targets):
        query = (
            prometheus.Dataquery()
            .expr(target.expr)
            .legend_format(target.legend)
            .ref_id(chr(ord("A") + index))
            .datasource(DATASOURCE)
        )
        built = built.with_target(query.instant() if spec.kind == "stat" else query.range())
    return built


def _dashboard(uid: str, title: str, description: str, sections: list[Section]) -> dict[str, Any]:
    board = (
        gd.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["kneepoint", "vllm", "llm-inference"])
        .time("now-6h", "now")
        .refresh("30s")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .editable()
        .variables(_variables())
        .link(
            gd.DashboardLink("kneepoint")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags(["kneepoint"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    panel_id = 1
    for section in sections:
        board = board.with_row(gd.Row(section.title).id(panel_id))
        panel_id += 1
        for spec in section.panels:
            board = board.with_panel(_panel(spec, panel_id))
            panel_id += 1
    # The encoder turns the SDK's models into plain JSON; a round trip gives plain dicts.
    document: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    # Grafana walks `annotations.list` on load; the SDK leaves it out when there are none.
    document.setdefault("annotations", {}).setdefault("list", [])
    return document


def dashboards(recorded: set[str], slos: list[Slo]) -> dict[str, dict[str, Any]]:
    """File name -> Grafana dashboard (JSON-ready), given the metrics `kneepoint alerts
    export` records (`recorded_metrics`) and the configured SLOs."""
    return {
        "kneepoint-overview.json": _dashboard(
            "kneepoint-overview",
            "kneepoint: overview",
            "The fleet at a glance: replicas up, load, throughput, latency, outcomes.",
            _overview(recorded),
        ),
        "kneepoint-capacity.json": _dashboard(
            "kneepoint-capacity",
            "kneepoint: capacity",
            "Is the fleet at its knee: KV cache, waiting for capacity, preemptions, "
            "concurrency, and the GPUs under it.",
            _capacity(recorded),
        ),
        "kneepoint-prefix-cache.json": _dashboard(
            "kneepoint-prefix-cache",
            "kneepoint: prefix cache",
            "How much prefill the prefix cache saves, and when it stops saving it.",
            _prefix_cache(recorded),
        ),
        "kneepoint-slos.json": _dashboard(
            "kneepoint-slos",
            "kneepoint: SLOs",
            "Each configured SLO's budget, compliance and burn rates, and the request "
            "outcomes the availability SLOs count.",
            _slos(slos),
        ),
    }


def expressions(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel of a dashboard."""
    return [
        (panel.get("title", ""), target["expr"])
        for panel in board.get("panels", [])
        for target in panel.get("targets") or []
        if "expr" in target
    ]
