"""The built-in rules (the signals for agent serving of docs/explanation/domain.md, and
kneepoint watching itself) and the config's own, which are added to them or override one by
name.

Every rule has `no_data` (kneepoint.config.Rule): what an evaluation without a value does.
The default, `keep`, holds the alert's state, so a firing alert never resolves because its
data went missing: it stays firing and says "no data". The built-ins keep that default."""

from __future__ import annotations

from kneepoint import catalogue
from kneepoint.config import Config, ConfigError, Rule
from kneepoint.derived.stall import STALL_AFTER

# Every metric a rule can watch: what alerts.values computes per replica (and the fleet),
# with its description (kneepoint/catalogue.py).
METRICS = catalogue.rule_metrics()

MINUTE = 60.0
BUILT_IN = tuple(
    Rule.model_validate(rule)
    for rule in (
        {
            "name": "kv-cache-saturated",
            "metric": "kv_cache_occupancy",
            "op": ">",
            "threshold": 0.9,
            "resolve_threshold": 0.85,
            "for": 5 * MINUTE,
            "severity": "page",
            "runbook": "The next agent will wait: fp8 KV cache, a shorter max_model_len, or "
            "more replicas (see Capacity).",
        },
        {
            "name": "waiting-for-kv-capacity",
            "metric": "requests_waiting_capacity",
            "op": ">",
            "threshold": 0,
            "for": 2 * MINUTE,
            "severity": "page",
            "runbook": "Sequences queue for KV blocks: shed load, cap prompt length, add capacity.",
        },
        {
            "name": "preemptions-sustained",
            "metric": "preemptions_per_second",
            "op": ">",
            "threshold": 0.05,
            "for": 10 * MINUTE,
            "severity": "ticket",
            "runbook": "The cache is full and work is evicted and recomputed: lower "
            "max_num_seqs or add KV capacity.",
        },
        {
            # Load shedding (vLLM 0.32+): the engine refuses requests with a 503 because its
            # queue limits are reached. The availability SLO counts them as failed too.
            "name": "requests-refused",
            "metric": "requests_refused_per_second",
            "op": ">",
            "threshold": 0,
            "for": 5 * MINUTE,
            "severity": "ticket",
            "runbook": "The engine refuses requests (HTTP 503): its queue limits "
            "(max_num_queued_reqs, max_num_queued_tokens) are reached. Add capacity or "
            "route the overflow elsewhere.",
        },
        {
            "name": "recompute-share-high",
            "metric": "recompute_share_of_prefill",
            "op": ">",
            "threshold": 0.2,
            "for": 10 * MINUTE,
            "severity": "ticket",
            "runbook": "Over a fifth of prefill redoes preempted work.",
        },
        {
            "name": "prefix-hit-rate-low",
            "metric": "prefix_cache_hit_rate",
            "op": "<",
            "threshold": 0.3,
            "resolve_threshold": 0.4,
            "for": 15 * MINUTE,
            "severity": "ticket",
            "runbook": "Agents' re-sent transcripts miss the cache: check session-aware routing.",
        },
        {
            "name": "prefix-hit-rate-dropped",
            "metric": "prefix_cache_hit_rate_drop",
            "op": ">",
            "threshold": 0.3,
            "for": 5 * MINUTE,
            "severity": "page",
            "scope": "fleet",
            "runbook": "The fleet's hit rate fell 30 points against its last hour: a prompt "
            "or tool-schema deploy, or routing lost stickiness (see Prefix cache).",
        },
        {
            "name": "spec-decode-slowing",
            "metric": "spec_expected_speedup",
            "op": "<",
            "threshold": 1.0,
            "for": 15 * MINUTE,
            "severity": "ticket",
            "runbook": "The drafter costs more than it saves: drop or replace it.",
        },
        {
            "name": "spec-decode-acceptance-low",
            "metric": "spec_decode_acceptance_rate",
            "op": "<",
            "threshold": 0.3,
            "for": 15 * MINUTE,
            "severity": "info",
            "runbook": "Most drafted tokens are rejected: a mismatched drafter.",
        },
        {
            "name": "gpu-idle",
            "metric": "gpu_utilization",
            "op": "<",
            "threshold": 0.3,
            "for": 6 * 60 * MINUTE,
            "severity": "info",
            "runbook": "Below 30 % a hosted API is usually cheaper: fill with batch work "
            "(evals, embeddings) or fall back to an API.",
        },
        {
            "name": "target-down",
            "metric": "up",
            "op": "==",
            "threshold": 0,
            "for": 1 * MINUTE,
            "severity": "page",
            "runbook": "kneepoint cannot scrape the replica (see Collector health).",
        },
        {
            # The API server answers, the engine does nothing: requests running or waiting
            # and no token counted for `for` (60 s by default: above a normal long prefill,
            # whose prompt tokens vLLM counts only when it ends; kneepoint.derived.stall).
            # The same `for` is how long `kneepoint status` waits before `stalled: true`.
            "name": "engine-stalled",
            "metric": "engine_stalled",
            "op": "==",
            "threshold": 1,
            "for": STALL_AFTER,
            "severity": "page",
            "runbook": "The replica answers its scrapes but its engine produces no token while "
            "requests wait: the engine core is wedged or dead (a hung GPU, a NCCL hang, a "
            "crashed engine process). Check the server's log and the GPU, then restart the "
            "replica and route traffic away meanwhile.",
        },
        {
            # The saturation verdict (kneepoint/derived/saturation.py), whatever the KV
            # gauge says; its reasons are in the status and the page's likely cause.
            "name": "replica-saturated",
            "metric": "replica_saturated",
            "op": "==",
            "threshold": 1,
            "for": 5 * MINUTE,
            # A page: its message carries the likely cause, which names the reasons.
            "severity": "page",
            "runbook": "The replica serves all it can: its queue grows, its per-step token "
            "budget is full, TTFT climbs with load, it sheds requests or its KV cache is full "
            "(the reasons are on the Overview). Add a replica or route load away.",
        },
        {
            # The scrape job stopped, is stuck, or cannot write: every other rule is
            # watching old numbers (kneepoint.status.is_stale).
            "name": "collector-stale",
            "metric": "stale_targets",
            "op": ">",
            "threshold": 0,
            "severity": "page",
            "scope": "fleet",
            "runbook": "kneepoint has not scraped some targets for over twice the scrape "
            "interval: the collector is stopped, stuck or cannot write its database (see "
            "Collector health, `kneepoint health`).",
        },
        {
            # Evaluation or delivery is failing, or a channel refuses messages. When the
            # alerts job itself is dead this rule cannot run: the heartbeat covers that.
            "name": "alert-pipeline-failing",
            "metric": "alert_pipeline_problems",
            "op": ">",
            "threshold": 0,
            "for": 1 * MINUTE,
            "severity": "page",
            "scope": "fleet",
            "runbook": "Alerts may not reach you: the alerts or deliver job fails or has not "
            "run lately, or a channel refused a message (see Alerts: channel health and "
            "the delivery log, and `kneepoint health`).",
        },
        {
            "name": "gpu-xid-error",
            "metric": "xid_errors",
            "op": ">",
            "threshold": 0,
            "severity": "page",
            "runbook": "A GPU reported an XID error: check dmesg and the node.",
        },
    )
)


def effective_rules(config: Config) -> list[Rule]:
    """Built-in rules, each replaced by a config rule of the same name, then the config's
    new ones. A rule on an unknown metric is a configuration error naming it."""
    own = {rule.name: rule for rule in config.rules}
    for index, rule in enumerate(config.rules):
        if rule.metric not in METRICS:
            raise ConfigError(
                f"rules[{index}].metric: unknown metric {rule.metric!r}; "
                f"known: {', '.join(METRICS)}"
            )
    built_in = list(BUILT_IN)
    budget = config.pricing.budget_per_million_tokens
    if budget is not None:
        built_in.append(
            Rule.model_validate(
                {
                    "name": "cost-over-budget",
                    "metric": "cost_per_million_tokens",
                    "op": ">",
                    "threshold": budget,
                    "for": 60 * MINUTE,
                    "severity": "ticket",
                    "scope": "fleet",
                    "runbook": "A served token costs more than pricing.budget_per_million_tokens:"
                    " idle GPUs or light load (see Cost: utilization and break-even).",
                }
            )
        )
    merged = [own.pop(rule.name, rule) for rule in built_in]
    return merged + list(own.values())
