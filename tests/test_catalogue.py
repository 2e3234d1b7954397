"""The catalogue of numbers (kneepoint/catalogue.py) is the one home of every number: each
table that used to be written out beside the others is now its projection, equal to what it
was, and a number added to the catalogue reaches every one of them."""

from __future__ import annotations

import ast
from typing import Any

import pytest

from alerts.rules import effective_rules
from alerts.slo import BURN_WINDOWS, burn_rules, window_label
from alerts.values import replica_values
from app.format import metric_unit
from app.registry import PAGES as APP_PAGES
from collectors.engines import ENGINES, REGISTRY, parse_replica
from kneepoint import catalogue, runbooks
from kneepoint.catalogue import NUMBERS, Effect, Number, WeeklyRow
from kneepoint.config import Config, Slo
from kneepoint.whatif.predict import CONTRACT
from tests.conftest import ROOT

# The tables as they were written out at main 8cc7122, before the catalogue: a snapshot
# printed once from those modules (kneepoint/samples.py QUANTITIES, alerts/rules.py METRICS,
# alerts/export.py EXPRESSIONS, alerts/outbox.py PAGES, review/weekly.py ROWS, REPLICA_KEYS,
# VIEW_KEYS, review/effects.py METRICS, the runbook sections of kneepoint/runbooks.py, and
# app/format.py metric_unit of each rule metric); the pages' tooltips copied from
# app/screens/spec_decode.py and prefix_cache.py.

OLD_QUANTITIES = {
    "kv_cache_occupancy": ("kv_cache_occupancy", "kv_cache_occupancy_mean"),
    "kv_cache_capacity_tokens": ("kv_cache_capacity_tokens",),
    "requests_running": ("requests_running",),
    "requests_waiting": ("requests_waiting",),
    "requests_waiting_capacity": ("requests_waiting_capacity",),
    "preemptions": (
        "preemptions",
        "preemptions_per_second",
        "preemption_recompute_tokens",
        "recompute_share_of_prefill",
    ),
    "prefix_cache_hit_rate": ("prefix_cache_hit_rate", "prefix_cache_hit_rate_drop"),
    "prompt_tokens": ("prompt_tokens_per_second",),
    "generation_tokens": ("generation_tokens_per_second",),
    "ttft": ("ttft_seconds", "ttft_p99_seconds"),
    "itl": ("itl_seconds", "itl_p99_seconds"),
    "e2e": ("e2e_seconds",),
    "admission_rejections": ("requests_refused_per_second", "requests_refused_share"),
    "spec_decode_acceptance": (
        "spec_decode_acceptance_rate",
        "spec_decode_mean_acceptance_length",
        "spec_decode_per_position_acceptance",
        "spec_expected_speedup",
    ),
    # issue 27's (not in main 8cc7122's tables): prefix-cache hits by tier
    "prompt_tokens_by_tier": ("prefix_cache_tier_shares",),
}
OLD_RULE_METRICS = {
    "kv_cache_occupancy": "KV-cache occupancy, latest scrape, max over engines (0..1)",
    "requests_waiting": "sequences waiting, latest scrape",
    "requests_waiting_capacity": "sequences waiting for KV capacity, latest scrape",
    "preemptions_per_second": "preemptions per second over the window",
    "requests_refused_per_second": "requests refused at admission (HTTP 503, a queue limit "
    "reached) per second over the window",
    "recompute_share_of_prefill": "recomputed prefill tokens ÷ all prefill work (0..1)",
    "prefix_cache_hit_rate": "prefix-cache hits ÷ queries over the window (0..1)",
    "prefix_cache_hit_rate_drop": "the last hour's hit rate minus the window's (points, 0..1)",
    "spec_expected_speedup": "expected speculative-decoding speedup (×)",
    "spec_decode_acceptance_rate": "accepted ÷ drafted tokens (0..1)",
    "gpu_utilization": "GPU graphics-engine activity, mean over the replica's GPUs (0..1)",
    "cost_per_million_tokens": "true cost per 1M served tokens (USD)",
    "ttft_p99_seconds": "p99 time to first token over the window (s)",
    "itl_p99_seconds": "p99 inter-token latency over the window (s)",
    "up": "1 if the last scrape succeeded, 0 if it failed (no data once the target is stale)",
    "engine_stalled": "1 while requests run or wait and no prompt or generation token and no "
    "engine step is counted between scrapes (kneepoint.derived.stall), 0 "
    "otherwise",
    "replica_saturated": "1 when the replica's saturation verdict over the window says "
    "saturated (KV full, queue growing, token budget full, TTFT rising with load, or load "
    "shed), 0 when not",
    "xid_errors": "GPUs of the replica reporting an XID error",
    "stale_targets": "targets (fleet) not scraped for over 2 scrape intervals plus a grace",
    "alert_pipeline_problems": "fleet: alerts or deliver job failing or overdue, plus one if a "
    "notification was refused for good in the last hour",
}
OLD_EXPRESSIONS = {
    "kv_cache_occupancy": "max by (instance) (vllm:kv_cache_usage_perc or "
    "vllm:gpu_cache_usage_perc)",
    "requests_waiting": "sum by (instance) (vllm:num_requests_waiting)",
    "requests_waiting_capacity": "sum by (instance) "
    '(vllm:num_requests_waiting_by_reason{reason="capacity"})',
    "preemptions_per_second": "sum by (instance) (rate(vllm:num_preemptions_total[5m]))",
    "requests_refused_per_second": "sum by (instance) (rate(vllm:admission_rejections_total[5m]))",
    "prefix_cache_hit_rate": "sum by (instance) (rate(vllm:prefix_cache_hits_total[5m])) / sum "
    "by (instance) (rate(vllm:prefix_cache_queries_total[5m]))",
    "prefix_cache_hit_rate_drop": "(sum by (instance) (rate(vllm:prefix_cache_hits_total[1h])) / "
    "sum by (instance) "
    "(rate(vllm:prefix_cache_queries_total[1h]))) - (sum by "
    "(instance) (rate(vllm:prefix_cache_hits_total[5m])) / sum by "
    "(instance) (rate(vllm:prefix_cache_queries_total[5m])))",
    "spec_decode_acceptance_rate": "sum by (instance) "
    "(rate(vllm:spec_decode_num_accepted_tokens_total[5m])) / sum "
    "by (instance) "
    "(rate(vllm:spec_decode_num_draft_tokens_total[5m]))",
    "gpu_utilization": "avg by (Hostname) (DCGM_FI_PROF_GR_ENGINE_ACTIVE or DCGM_FI_DEV_GPU_UTIL "
    "/ 100)",
    "ttft_p99_seconds": "histogram_quantile(0.99, sum by (instance, le) "
    "(rate(vllm:time_to_first_token_seconds_bucket[5m])))",
    "itl_p99_seconds": "histogram_quantile(0.99, sum by (instance, le) "
    "(rate(vllm:inter_token_latency_seconds_bucket[5m]) or "
    "rate(vllm:time_per_output_token_seconds_bucket[5m])))",
    "up": 'up{job=~".*vllm.*"}',
    "xid_errors": "count by (Hostname) (DCGM_FI_DEV_XID_ERRORS > 0)",
}
OLD_PAGES = {
    "kv_cache_occupancy": "capacity",
    "requests_waiting": "capacity",
    "requests_waiting_capacity": "capacity",
    "preemptions_per_second": "capacity",
    "requests_refused_per_second": "overview",
    "requests_refused_share": "overview",
    "recompute_share_of_prefill": "capacity",
    "prefix_cache_hit_rate": "prefix-cache",
    "prefix_cache_hit_rate_drop": "prefix-cache",
    "spec_expected_speedup": "spec-decode",
    "spec_decode_acceptance_rate": "spec-decode",
    "gpu_utilization": "gpus",
    "xid_errors": "gpus",
    "cost_per_million_tokens": "cost",
    "up": "health",
    "stale_targets": "health",
    "engine_stalled": "overview",
    "replica_saturated": "overview",
    "ttft_p99_seconds": "knee",
    "itl_p99_seconds": "knee",
    "alert_pipeline_problems": "alerts",
}
OLD_ROWS = (
    ("peak_kv_occupancy", "Peak KV occupancy", "%", "highest KV-cache use seen"),
    ("p95_kv_occupancy", "p95 KV occupancy", "%", "95th percentile of the chart's points"),
    ("time_saturated", "Time KV full", "%", "share of time with KV above 90 %"),
    ("queue_p99_seconds", "Waiting time p99", "s", "queue time before a slot, p99"),
    ("preemptions", "Preemptions", "", "sequences evicted and recomputed"),
    ("recompute_share_of_prefill", "Recompute share", "%", "prefill work redone after eviction"),
    ("prefix_cache_hit_rate", "Prefix hit rate", "%", "prompt tokens served from cache"),
    ("generation_tokens_per_second", "Throughput", "tok/s", "generated tokens per second"),
    ("peak_running", "Peak concurrency", "", "most sequences running at once"),
    ("knee_concurrency", "Knee", "", "concurrency where more load stops paying"),
    ("headroom", "Headroom to knee", "", "knee − peak concurrency"),
    ("spec_verdict", "Speculative decoding", "", "paying off, marginal or slowing down"),
    ("utilization", "Load vs knee", "%", "generated tokens/s ÷ the knee's; not GPU busy"),
    ("idle_gpu_hours", "Idle GPU-hours", "h", "GPU time not busy (DCGM graphics activity)"),
    ("cost_per_million_tokens", "True $/1M tokens", "$", "GPU cost ÷ tokens served"),
    ("nominal_cost_per_million_generated_tokens", "Nominal $/1M generated", "$", "at the knee"),
    ("break_even_utilization", "Break-even vs API", "%", "load vs knee below which API is cheaper"),
    ("joules_per_million_tokens", "Energy / 1M tokens", "J", "GPU energy ÷ tokens served"),
    ("replica_saturated", "Saturated", "", "the week's saturation verdict and its reasons"),
)
OLD_REPLICA_KEYS = (
    "prefix_cache_hit_rate",
    "preemptions",
    "generation_tokens_per_second",
    "cost_per_million_tokens",
    "cost_per_million_generated_tokens",
)
OLD_VIEW_KEYS = (
    "peak_kv_occupancy",
    "time_saturated",
    "recompute_share_of_prefill",
    "peak_running",
    "peak_waiting",
    "spec_verdict",
    "spec_expected_speedup",
    "utilization",
    "idle_gpu_hours",
    "nominal_cost_per_million_generated_tokens",
    "break_even_utilization",
    "joules_per_million_tokens",
    "energy_kwh",
)
OLD_EFFECT_METRICS = (
    ("preemptions", "preemptions", ""),
    ("generation_tokens_per_second", "throughput", "tok/s"),
    ("ttft_p99_seconds", "TTFT p99", "s"),
    ("kv_cache_occupancy_p95", "p95 KV occupancy", "%"),
    ("cost_per_million_tokens", "$/1M tokens", "$"),
)
OLD_RUNBOOK_SECTIONS = (
    "kv-cache-saturated",
    "waiting-for-kv-capacity",
    "preemptions-sustained",
    "requests-refused",
    "recompute-share-high",
    "prefix-hit-rate-low",
    "prefix-hit-rate-dropped",
    "spec-decode-slowing",
    "spec-decode-acceptance-low",
    "gpu-idle",
    "target-down",
    "collector-stale",
    "alert-pipeline-failing",
    "gpu-xid-error",
    "cost-over-budget",
    "engine-stalled",
    "replica-saturated",
    "slo-burn",
)
OLD_RULE_UNITS = {
    "kv_cache_occupancy": "%",
    "requests_waiting": "",
    "requests_waiting_capacity": "",
    "preemptions_per_second": "/s",
    "requests_refused_per_second": "/s",
    "recompute_share_of_prefill": "%",
    "prefix_cache_hit_rate": "%",
    "prefix_cache_hit_rate_drop": "points",
    "spec_expected_speedup": "×",
    "spec_decode_acceptance_rate": "%",
    "gpu_utilization": "%",
    "cost_per_million_tokens": "$",
    "ttft_p99_seconds": "s",
    "itl_p99_seconds": "s",
    "up": "",
    "engine_stalled": "",
    "replica_saturated": "",
    "xid_errors": "",
    "stale_targets": "",
    "alert_pipeline_problems": "",
}

OLD_PAGE_HELP = {
    "spec_decode_acceptance_rate": "Δaccepted tokens ÷ Δdrafted tokens over the window.",
    "spec_decode_mean_acceptance_length": (
        "1 + Δaccepted ÷ Δdrafts: tokens emitted per verification step."
    ),
    "spec_expected_speedup": "(1 − α^(γ+1)) ÷ ((1 − α)(1 + cγ)), γ = positions seen, "
    "c = 0.1 draft cost. Below 1 the drafter slows the engine down.",
    "prefix_cache_hit_rate": "Δprefix_cache_hits ÷ Δprefix_cache_queries over the window.",
}

# Each table, where it lives, and the catalogue projection it is assigned from.
TABLES = (
    ("kneepoint/samples.py", "QUANTITIES", "quantities"),
    ("alerts/rules.py", "METRICS", "rule_metrics"),
    ("alerts/export.py", "EXPRESSIONS", "expressions"),
    ("alerts/outbox.py", "PAGES", "pages"),
    ("review/weekly.py", "ROWS", "weekly_rows"),
    ("review/weekly.py", "REPLICA_KEYS", "weekly_keys"),
    ("review/weekly.py", "VIEW_KEYS", "weekly_keys"),
    ("review/effects.py", "METRICS", "effect_metrics"),
)


def test_the_tables_read_in_order_are_what_they_were() -> None:
    """Rules' `known:` list, the exporter's recording rules, the review's rows and the
    what-if effect line all follow these orders."""
    from alerts.export import EXPRESSIONS
    from alerts.rules import METRICS
    from review.effects import METRICS as EFFECT_METRICS
    from review.weekly import ROWS

    assert list(METRICS.items()) == list(OLD_RULE_METRICS.items())
    assert list(EXPRESSIONS.items()) == list(OLD_EXPRESSIONS.items())
    assert ROWS == OLD_ROWS
    assert EFFECT_METRICS == OLD_EFFECT_METRICS


def test_the_tables_read_by_key_hold_the_same_numbers() -> None:
    """Only membership and lookups read these (kneepoint/status.py blanks a quantity's
    numbers, unavailable_reason finds a number's quantity, the review copies keys into a dict
    read by key, view_of looks a page up): one catalogue order cannot also be the order each
    was typed in (spec_expected_speedup comes before the acceptance rate among the rules,
    after it in its quantity), so their contents are compared, not their order."""
    from alerts.outbox import PAGES
    from kneepoint.samples import QUANTITIES
    from review.weekly import REPLICA_KEYS, VIEW_KEYS

    assert list(QUANTITIES) == list(OLD_QUANTITIES)
    assert {q: set(numbers) for q, numbers in QUANTITIES.items()} == {
        q: set(numbers) for q, numbers in OLD_QUANTITIES.items()
    }
    assert all(len(set(numbers)) == len(numbers) for numbers in QUANTITIES.values())
    assert PAGES == OLD_PAGES
    for keys, old in ((REPLICA_KEYS, OLD_REPLICA_KEYS), (VIEW_KEYS, OLD_VIEW_KEYS)):
        assert sorted(keys) == sorted(old) and len(set(keys)) == len(old)


def test_alert_units_and_page_tooltips_are_what_they_were() -> None:
    assert {metric: metric_unit(metric) for metric in OLD_RULE_UNITS} == OLD_RULE_UNITS
    assert metric_unit("no_such_metric") == ""
    assert metric_unit("generation_tokens_per_second") == ""  # no rule can watch it
    assert {name: catalogue.help_text(name) for name in OLD_PAGE_HELP} == OLD_PAGE_HELP


def assigned(path: str, name: str) -> ast.expr:
    """The expression a module-level `name = …` (or `name: T = …`) assigns."""
    for node in ast.parse((ROOT / path).read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return node.value
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
            and node.value is not None
        ):
            return node.value
    raise AssertionError(f"{path} assigns no {name}")


@pytest.mark.parametrize(("path", "name", "projection"), TABLES, ids=lambda v: str(v))
def test_each_table_is_assigned_from_its_catalogue_projection(
    path: str, name: str, projection: str
) -> None:
    """Not a literal that happens to be equal: the module reads the catalogue."""
    value = assigned(path, name)
    assert isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
    assert ast.unparse(value.func) == f"catalogue.{projection}"


def test_the_runbook_sections_are_what_they_were_and_name_the_catalogue_s_rules() -> None:
    assert tuple(runbooks.RUNBOOKS) == OLD_RUNBOOK_SECTIONS
    assert set(catalogue.rules().values()) == set(runbooks.RUNBOOKS) - {runbooks.SLO_BURN}
    config = Config.model_validate({"pricing": {"budget_per_million_tokens": 1.0}})
    built_in = effective_rules(config)
    assert {rule.metric: rule.name for rule in built_in} == catalogue.rules()


TOY = Number(
    "toy_share",
    "%",
    "higher is worse",
    "a toy number (0..1)",
    quantity="preemptions",
    alertable=True,
    page="capacity",
    rule="toy-rule",
    promql="sum by (instance) (toy)",
    weekly=WeeklyRow(len(OLD_ROWS) + 1, "Toy", "a toy row"),
    weekly_source="view",
    effect=Effect(len(OLD_EFFECT_METRICS) + 1, "toy"),
)


def test_a_number_added_to_the_catalogue_reaches_every_projection() -> None:
    numbers = (*NUMBERS, TOY)
    assert catalogue.quantities(numbers)["preemptions"][-1] == "toy_share"
    assert catalogue.rule_metrics(numbers)["toy_share"] == "a toy number (0..1)"
    assert catalogue.expressions(numbers)["toy_share"] == "sum by (instance) (toy)"
    assert catalogue.pages(numbers)["toy_share"] == "capacity"
    assert catalogue.rules(numbers)["toy_share"] == "toy-rule"
    assert catalogue.weekly_rows(numbers)[-1] == ("toy_share", "Toy", "%", "a toy row")
    assert catalogue.weekly_keys("view", numbers)[-1] == "toy_share"
    assert "toy_share" not in catalogue.weekly_keys("status", numbers)
    assert catalogue.effect_metrics(numbers)[-1] == ("toy_share", "toy", "%")
    # and the numbers as they are give the tables as they are
    assert catalogue.quantities(NUMBERS)["preemptions"][-1] != "toy_share"


def test_every_number_is_declared_once_and_whole() -> None:
    names = [number.name for number in NUMBERS]
    assert len(names) == len(set(names))
    assert {q.name for q in catalogue.QUANTITIES} == {
        n.quantity for n in NUMBERS if n.quantity is not None
    }
    # Every quantity covers the same engines: the five docs/reference/engines.md covers. An
    # engine added later (a module in collectors/engines/) works without a row here; its
    # normalizer says what it lacks.
    assert len({frozenset(q.sources) for q in catalogue.QUANTITIES}) == 1
    assert set(catalogue.QUANTITIES[0].sources) <= set(ENGINES)
    places = sorted(n.weekly.place for n in NUMBERS if n.weekly)
    assert places == list(range(1, len(places) + 1))
    effects = sorted(n.effect.place for n in NUMBERS if n.effect)
    assert effects == list(range(1, len(effects) + 1))
    paths = {spec.url_path for spec in APP_PAGES}
    for number in NUMBERS:
        assert number.page is None or number.page in paths, number.name
        assert number.promql is None or number.alertable, number.name
        engines = set(catalogue.QUANTITIES[0].sources) if number.quantity else set()
        assert set(catalogue.sources(number)) == engines, number.name


def test_what_if_effects_read_the_what_if_contract() -> None:
    assert {key for key, _, _ in catalogue.effect_metrics()} == set(CONTRACT)


def scrapes() -> list[tuple[str, str, set[str]]]:
    """(fixture, engine, quantities its normalizer marks unavailable) of every capture."""
    out = []
    for path in sorted((ROOT / "tests" / "fixtures").glob("*.prom")):
        sample = parse_replica("auto", path.read_text())
        out.append((path.name, sample.engine, set(sample.unavailable)))
    return out


def test_engine_sources_say_what_the_normalizers_do() -> None:
    """A quantity is marked unavailable in every capture of an engine whose source says
    "unavailable", in none where it says it is given, and in some but not all where it
    varies by generation or configuration (docs/reference/engines.md)."""
    seen: dict[tuple[str, str], set[bool]] = {}
    for fixture, engine, unavailable in scrapes():
        for quantity in catalogue.QUANTITIES:
            if engine not in quantity.sources:
                continue
            source = quantity.sources[engine]
            marked = quantity.name in unavailable
            seen.setdefault((engine, quantity.name), set()).add(marked)
            if not source.varies:
                assert marked == (source.how == "unavailable"), (fixture, quantity.name)
    varying = {
        (engine, quantity.name): seen.get((engine, quantity.name))
        for quantity in catalogue.QUANTITIES
        for engine, source in quantity.sources.items()
        if source.varies
    }
    assert {key: marks for key, marks in varying.items() if marks != {True, False}} == {}


class Blank(dict[str, Any]):
    """A status record without data: every number None."""

    def __missing__(self, key: str) -> None:
        return None


def test_every_metric_a_rule_can_watch_is_computed_under_its_catalogue_name() -> None:
    """A misspelt key in alerts/values.py would leave its rule without data, silently."""
    per_replica = set(replica_values(Blank(), {}, [], None))
    [monitor] = [
        node
        for node in ast.walk(ast.parse((ROOT / "alerts" / "values.py").read_text()))
        if isinstance(node, ast.FunctionDef) and node.name == "monitor_values"
    ]
    [returned] = [node.value for node in ast.walk(monitor) if isinstance(node, ast.Return)]
    assert isinstance(returned, ast.Dict)
    fleet_only = {key.value for key in returned.keys if isinstance(key, ast.Constant)}
    assert per_replica | fleet_only == set(catalogue.rule_metrics())
    assert not per_replica & fleet_only


def test_what_no_release_gives_is_what_each_engine_declares() -> None:
    """collectors/engines/<kind>.py ENGINE.unavailable: the quantities no release gives."""
    for kind, engine in REGISTRY.items():
        never = {
            q.name
            for q in catalogue.QUANTITIES
            if kind in q.sources
            and q.sources[kind].how == "unavailable"
            and not q.sources[kind].varies
        }
        if any(kind in q.sources for q in catalogue.QUANTITIES):
            assert never == set(engine.unavailable), kind


def test_a_burn_metric_reads_back_as_its_slo_and_window() -> None:
    """Every SLO burn rule's metric (alerts/slo.py burn_rules, built by the catalogue) parses
    back to its SLO and long window, an SLO name with ":" included; other metrics are none."""
    slo = Slo(name="chat:avail", kind="availability", objective=0.99)
    for rule, window in zip(burn_rules([slo]), BURN_WINDOWS, strict=True):
        assert catalogue.burn_slo(rule.metric) == slo.name
        assert catalogue.burn_window(rule.metric) == window_label(window.long)
    for metric in catalogue.NUMBER_NAMES:
        assert catalogue.burn_slo(metric) is None
        assert catalogue.burn_window(metric) is None
