"""Runbooks that act: for each built-in rule, what its numbers mean, the likely causes, how
to tell them apart, and the one command or knob for each.

This module is the source: `docs/reference/runbooks.md` is its Markdown (`python -m
kneepoint.runbooks > docs/reference/runbooks.md`; a test holds the file equal to it), and the
Alerts page shows a rule's section from here (`?page=alerts&rule=NAME`, the link in every
alert message), so the runbook travels with the installed package and opens for anyone who can
open the app."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlencode


@dataclass(frozen=True)
class Step:
    cause: str  # a likely cause
    check: str  # how to tell it is this one
    fix: str  # the one command or knob (Markdown)


@dataclass(frozen=True)
class Runbook:
    name: str  # the rule's name (or SLO_BURN for every SLO burn alert)
    meaning: str  # what the numbers mean
    steps: tuple[Step, ...]


SLO_BURN = "slo-burn"  # the section of every `<slo>-burn-<window>` rule

RUNBOOKS = {
    r.name: r
    for r in (
        Runbook(
            "kv-cache-saturated",
            "KV-cache occupancy (1 − free blocks ÷ blocks, max over the replica's engines) "
            "stayed above 90 % for 5 minutes; it resolves below 85 %. The next agent's "
            "sequence waits for blocks or evicts a running one (a preemption, recomputed "
            "later). Capacity page: occupancy, sequence slots left at the live mean context, "
            "time KV full.",
            (
                Step(
                    "KV cache in 16-bit",
                    "Capacity: the engine's cache dtype is auto/fp16/bf16",
                    "`--kv-cache-dtype fp8`: half the bytes per token, about twice the tokens",
                ),
                Step(
                    "Contexts longer than the agents need",
                    "Capacity: live mean context far above the typical transcript",
                    "`--max-model-len 32768` (a quarter of 128k fits four times the agents)",
                ),
                Step(
                    "GPU memory left unused",
                    "a dedicated card at the default `gpu_memory_utilization` 0.9",
                    "`--gpu-memory-utilization 0.95` (never higher on a shared node)",
                ),
                Step(
                    "Load past the knee",
                    "the likely cause says load; concurrency against the knee (Knee points)",
                    "add a replica, or cap admission at the knee's recommended concurrency in "
                    "the router",
                ),
            ),
        ),
        Runbook(
            "waiting-for-kv-capacity",
            "Sequences waited because no KV blocks were free (vLLM's waiting queue, by "
            "reason `capacity`) for 2 minutes: agents are queued at the door, and TTFT grows "
            "with the queue. Capacity page: peak waiting, queue p99.",
            (
                Step(
                    "KV cache full",
                    "KV occupancy above 90 % at the same time",
                    "`--kv-cache-dtype fp8`, or a shorter `--max-model-len`",
                ),
                Step(
                    "A burst of very long prompts (tool results of thousands of tokens)",
                    "mean prompt tokens jump in the window",
                    "an admission cap on prompt length at the gateway (reject or route "
                    "prompts above N tokens elsewhere)",
                ),
                Step(
                    "More agents than the fleet holds",
                    "every replica's occupancy high, concurrency at the knee",
                    "scale out (one more replica), or send the overflow to a hosted API",
                ),
            ),
        ),
        Runbook(
            "preemptions-sustained",
            "Over 0.05 preemptions a second for 10 minutes: the scheduler admitted more "
            "sequences than the KV cache can grow, evicts some and recomputes their prefill "
            "later. Latency gets worse the more load it takes, and throughput hides it.",
            (
                Step(
                    "`max_num_seqs` above what the cache holds at this context",
                    "running sequences at `max_num_seqs` while occupancy is near 100 %",
                    "lower `--max-num-seqs` (e.g. 256 → 128)",
                ),
                Step(
                    "Too little KV cache",
                    "occupancy saturated with fewer sequences than the knee",
                    "`--kv-cache-dtype fp8` or `--gpu-memory-utilization 0.95`",
                ),
            ),
        ),
        Runbook(
            "requests-refused",
            "The engine refused requests at admission for 5 minutes: vLLM answers HTTP 503 "
            "when its waiting queue reaches `--max-num-queued-reqs` or "
            "`--max-num-queued-tokens` (vllm:admission_rejections_total). Every refused "
            "request is a failed one in the availability SLO; the Overview shows the "
            "refused share per replica.",
            (
                Step(
                    "More load than the replica serves",
                    "requests waiting at the queue limit, KV occupancy or the token budget "
                    "full on the same replica",
                    "scale out, or route the overflow to another replica or a hosted API",
                ),
                Step(
                    "Queue limits set below what the replica holds",
                    "refusals while KV occupancy is low and TTFT within the SLO",
                    "raise `--max-num-queued-reqs` / `--max-num-queued-tokens`",
                ),
                Step(
                    "Uneven routing",
                    "one replica refuses while others have room",
                    "check the router's balancing (least-loaded or queue-aware)",
                ),
            ),
        ),
        Runbook(
            "recompute-share-high",
            "Over a fifth of the prefill work in 10 minutes redid preempted sequences' "
            "prompts (Capacity: recompute share; an estimate on V1 engines). That compute is "
            "lost to serving.",
            (
                Step(
                    "Preemptions from a full cache",
                    "preemptions/s above 0.05 on the same replica",
                    "lower `--max-num-seqs`, or `--kv-cache-dtype fp8`",
                ),
                Step(
                    "Long generations evicted late",
                    "long outputs (e2e far above TTFT) with preemptions",
                    "cap `max_tokens` per request at the gateway",
                ),
            ),
        ),
        Runbook(
            "prefix-hit-rate-low",
            "Prefix-cache hits ÷ queries below 30 % for 15 minutes (resolves above 40 %). "
            "Agents re-send their whole transcript every step; served by the replica that "
            "holds it, step 20 skips nearly all prefill, sent to a cold replica it prefills "
            "everything again.",
            (
                Step(
                    "Round-robin routing",
                    "Prefix cache page: replicas' hit rates far apart, the fleet's low",
                    "session-aware routing: vLLM production-stack router `--routing-logic "
                    "session --session-key x-session-id`, or `--routing-logic prefixaware` "
                    "(llm-d: the prefix-cache scorer)",
                ),
                Step(
                    "Prefix caching off",
                    "the replica's engine label says prefix caching off",
                    "`--enable-prefix-caching`",
                ),
                Step(
                    "Variable text at the top of the prompt (a timestamp, a request id)",
                    "the hit rate low on every replica, also with sticky routing",
                    "move per-request text to the end of the prompt",
                ),
            ),
        ),
        Runbook(
            "prefix-hit-rate-dropped",
            "The fleet's hit rate fell 30 points against its last hour, for 5 minutes: every "
            "agent prefills its whole transcript again, and capacity drops while other "
            "panels stay flat. Prefix cache page: detected drops and prefill storms; "
            "Timeline: what changed.",
            (
                Step(
                    "A new system prompt or tool schema was deployed",
                    "a prefill storm and a deploy marker at the drop",
                    "stagger prompt deploys across replicas (one at a time, minutes apart)",
                ),
                Step(
                    "Routing lost stickiness (router restart, replicas added or removed)",
                    "one replica's hit rate falls while sessions move",
                    "check the router's session key / consistent hashing "
                    "(`--routing-logic session --session-key x-session-id`)",
                ),
                Step(
                    "Replicas restarted (cold caches)",
                    "a restart on the Timeline just before",
                    "none: it recovers as sessions return; stagger restarts next time",
                ),
            ),
        ),
        Runbook(
            "spec-decode-slowing",
            "Expected speculative-decoding speedup (1 − α^(γ+1)) ÷ ((1 − α)(1 + cγ)) below 1 "
            "for 15 minutes: the drafter costs more than it saves.",
            (
                Step(
                    "A mismatched drafter",
                    "acceptance below 30 % (Speculative decoding page)",
                    "drop it (remove `--speculative-config`) or use a drafter of the same "
                    "family and tokenizer",
                ),
                Step(
                    "Too many speculative tokens",
                    "acceptance falls with position",
                    '`--speculative-config \'{"model": "DRAFTER", "num_speculative_tokens": 2}\'`',
                ),
            ),
        ),
        Runbook(
            "spec-decode-acceptance-low",
            "Accepted ÷ drafted tokens below 30 % for 15 minutes: the verifier rejects most "
            "drafts; both models run for little.",
            (
                Step(
                    "A drafter of another family or tokenizer",
                    "acceptance low at every position",
                    "a matched drafter in `--speculative-config`, or none",
                ),
                Step(
                    "Sampling at high temperature",
                    "acceptance varies with the clients' temperature",
                    "turn speculation off for sampled traffic (a separate lane)",
                ),
            ),
        ),
        Runbook(
            "gpu-idle",
            "GPU activity below 30 % for 6 hours. A GPU costs the same busy or idle: below "
            "~30 % a hosted API is usually cheaper per token (Cost page: load vs knee, "
            "break-even).",
            (
                Step(
                    "Fleet sized for a peak that is hours away",
                    "Overview: concurrency far below the knee for most of the day",
                    "fill the troughs with batch work (evals, embeddings, offline "
                    "classification), or scale the replica down off-peak",
                ),
                Step(
                    "Traffic routed elsewhere",
                    "the replica's requests/s near zero while others serve",
                    "check the router's target list",
                ),
            ),
        ),
        Runbook(
            "target-down",
            "kneepoint's last scrape of the replica failed, for a minute: the engine is down, "
            "restarting, or unreachable. Its other alerts are inhibited (consequences).",
            (
                Step(
                    "The engine process exited",
                    "Collector health: connection refused",
                    "`kubectl logs POD --previous` (or `journalctl -u vllm`), then restart it",
                ),
                Step(
                    "The network or the metrics port",
                    "timeouts, not refusals",
                    "`curl -s -o /dev/null -w '%{http_code}' http://REPLICA:8000/metrics` from "
                    "the collector's host",
                ),
            ),
        ),
        Runbook(
            "collector-stale",
            "Some targets were not scraped for over 2 × scrape_interval plus a grace: every "
            "other rule is watching old numbers.",
            (
                Step(
                    "The collector stopped or is stuck",
                    "`kneepoint health` shows the scrape job overdue",
                    "restart `kneepoint collect` (or `kneepoint serve`)",
                ),
                Step(
                    "The database refuses writes (disk full, locked)",
                    "Collector health: write errors",
                    "free the disk, or check PostgreSQL; `kneepoint health`",
                ),
            ),
        ),
        Runbook(
            "alert-pipeline-failing",
            "The alerts or deliver job fails or has not run lately, or a channel refused a "
            "message in the last hour: alerts may not reach you.",
            (
                Step(
                    "A channel's URL, token or signature is wrong",
                    "Alerts page: channel health `broken`, the delivery log's error",
                    "fix the channel, then `kneepoint alerts test --channel NAME`",
                ),
                Step(
                    "A job is failing",
                    "`kneepoint health`",
                    "read the job's error there; restart `kneepoint serve`",
                ),
            ),
        ),
        Runbook(
            "gpu-xid-error",
            "A GPU of the replica reports an XID error (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS: "
            "the last XID code). Some are the application's (13, 31, 43), some the "
            "hardware's (48 double-bit ECC, 63/64 row remapping, 79 fallen off the bus).",
            (
                Step(
                    "Hardware (48, 63, 64, 74, 79, 92, 94, 95)",
                    "`journalctl -k --grep=Xid` on the node",
                    "`kubectl cordon NODE && kubectl drain NODE --ignore-daemonsets`, then "
                    "reset (`nvidia-smi -r -i N`) or replace the GPU",
                ),
                Step(
                    "The engine's own fault (13, 31, 43: illegal memory access)",
                    "an engine upgrade or config change on the Timeline just before",
                    "roll back the engine version (`kubectl rollout undo deployment/NAME`)",
                ),
            ),
        ),
        Runbook(
            "cost-over-budget",
            "The fleet's true cost per 1M served tokens (GPU cost ÷ tokens actually served) "
            "stayed above `pricing.budget_per_million_tokens` for an hour.",
            (
                Step(
                    "Idle GPUs",
                    "Cost page: load vs knee below break-even",
                    "fewer replicas off-peak, or batch work in the troughs",
                ),
                Step(
                    "Low throughput per GPU",
                    "tokens/s far below the knee's",
                    "FP8 weights (`--quantization fp8`) and `--kv-cache-dtype fp8`",
                ),
            ),
        ),
        Runbook(
            "engine-stalled",
            "Requests are running or waiting and the replica's token counters (and engine "
            "step counter) have not moved for 60 s, while its API server still answers "
            "`/metrics` (and `/health` with 200): the engine core died or is wedged. Agents "
            "wait, dashboards look green, and the SLOs count it as unavailability.",
            (
                Step(
                    "The engine core process is hung (NCCL hang across tensor-parallel ranks, "
                    "a CUDA error)",
                    "`py-spy dump --pid $(pgrep -f EngineCore)`; `NCCL_DEBUG=INFO` in the log",
                    "restart the replica (`kubectl delete pod POD`), and make its liveness "
                    "probe a 1-token completion rather than `/health`",
                ),
                Step(
                    "A GPU failed under it",
                    "an XID on the replica's GPU (GPUs page, Timeline)",
                    "drain the node: `kubectl drain NODE --ignore-daemonsets`",
                ),
                Step(
                    "Not a failure: one very long prefill with nothing decoding beside it",
                    "a huge prompt in flight, steps still moving",
                    "`--enable-chunked-prefill --max-num-batched-tokens 8192`, or raise the "
                    "rule's `for:`",
                ),
            ),
        ),
        Runbook(
            "replica-saturated",
            "The replica's saturation verdict over the evaluation window says saturated, "
            "for at least one of five reasons, each named with its evidence in the status "
            "(`saturation.reasons`), on the Overview's Saturated column and in the likely "
            "cause: the KV cache above 90 % for a quarter of the window; requests waiting in "
            "most samples without draining, or a queue rising by two requests or more; most "
            "engine steps at the per-step token budget (`max_num_batched_tokens`); TTFT "
            "rising with load across the window; requests refused at admission. A replica "
            "can be saturated with its KV cache at 30 %: a prefill-heavy load fills the "
            "token budget, not the cache (docs/explanation/saturation.md).",
            (
                Step(
                    "More load than the replica serves (queue growing, TTFT rising)",
                    "the reasons say queue growing or TTFT rising; concurrency against the "
                    "knee (Knee points)",
                    "add a replica, or route load away; a queue that grows never drains by itself",
                ),
                Step(
                    "Prefill-heavy traffic: long prompts fill the per-step token budget",
                    "the reasons say token budget full while the KV cache is far from full",
                    "raise `--max-num-batched-tokens` (more prefill per step, longer decode "
                    "stalls), set the target's `max_num_batched_tokens` so the verdict judges "
                    "it exactly, or disaggregate prefill",
                ),
                Step(
                    "The KV cache is full",
                    "the reasons say KV full",
                    "the `kv-cache-saturated` steps: `--kv-cache-dtype fp8`, a shorter "
                    "`--max-model-len`, or more replicas",
                ),
                Step(
                    "The engine sheds load at its queue limit",
                    "the reasons say load shedding (vLLM's admission rejections)",
                    "add capacity, or raise `--max-num-queued-reqs` only if clients would "
                    "rather wait than retry",
                ),
            ),
        ),
        Runbook(
            SLO_BURN,
            "An SLO's error budget burns faster than its alert window allows (SRE workbook "
            "multiwindow burn rates: 1h/5m and 6h/30m page at 14.4× and 6×, 1d/2h and 3d/6h "
            "ticket at 3× and 1×, for 30 days). SLOs page: compliance, budget left, every "
            "burn rate, and the likely cause with its evidence; the message carries it too.",
            (
                Step(
                    "load: concurrency at or past a replica's knee",
                    "the cause's evidence: concurrency against the knee",
                    "scale out, or cap admission at the recommended concurrency; raise "
                    "`--max-num-seqs` only where the knee allows",
                ),
                Step(
                    "capacity: KV saturated, waiting for capacity, preemptions",
                    "Capacity page",
                    "`--kv-cache-dtype fp8`, a shorter `--max-model-len`",
                ),
                Step(
                    "hardware: XID or clock throttling",
                    "GPUs page, Timeline",
                    "drain the node (`kubectl drain NODE --ignore-daemonsets`)",
                ),
                Step(
                    "software: a restart, config change or deploy just before",
                    "Timeline",
                    "roll it back (`kubectl rollout undo deployment/NAME`)",
                ),
                Step(
                    "upstream: a stalled engine",
                    "the `engine-stalled` alert",
                    "restart the replica (see engine-stalled)",
                ),
                Step(
                    "ITL from long prefills beside decodes",
                    "ITL p99 spikes with long prompts",
                    "a smaller `--max-num-batched-tokens` (chunked prefill), or an admission "
                    "cap on prompt length",
                ),
            ),
        ),
    )
}

_BURN = re.compile(r"-burn-[0-9]+[smhd]$")


def section_for(rule: str) -> str | None:
    """The runbook section of a rule by name: its own, the SLO burn section for an SLO burn
    rule, else None (a rule of the config's own)."""
    if rule in RUNBOOKS:
        return rule
    return SLO_BURN if _BURN.search(rule) else None


def url(dashboard_url: str, rule: str) -> str | None:
    """The Alerts page showing the rule's runbook (None when it has none)."""
    if section_for(rule) is None:
        return None
    query = urlencode({"page": "alerts", "rule": rule})
    return f"{dashboard_url.rstrip('/')}/?{query}"


def section(name: str) -> str:
    """One runbook as Markdown, under a level-2 heading named after the rule."""
    book = RUNBOOKS[name]
    lines = [f"## {book.name}", "", book.meaning, ""]
    lines += ["| likely cause | how to tell | the one command or knob |", "|---|---|---|"]
    lines += [f"| {s.cause} | {s.check} | {s.fix} |" for s in book.steps]
    return "\n".join(lines) + "\n"


def markdown() -> str:
    """docs/reference/runbooks.md."""
    head = (
        "# Runbooks\n\n"
        "One section per built-in alert rule (and one for every SLO burn alert): what its "
        "numbers mean, the likely causes, how to tell them apart, and the one command or "
        "knob for each. Change one knob at a time and re-measure. Every alert message links "
        "to its section on the Alerts page (`?page=alerts&rule=NAME`), and the message and "
        "the SLOs and Alerts pages name the likely cause with its evidence "
        "(kneepoint/causes.py).\n\n"
        "Generated from `kneepoint/runbooks.py` (`python -m kneepoint.runbooks > "
        "docs/reference/runbooks.md`); a test holds the two equal.\n"
    )
    return head + "".join(f"\n{section(name)}" for name in RUNBOOKS)


if __name__ == "__main__":
    print(markdown(), end="")
