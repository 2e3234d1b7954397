"""The alert lifecycle, table-driven: each case a sentence, a rule, values over time, and
the states they must give."""

from __future__ import annotations

import pytest

from alerts.lifecycle import FIRING, PENDING, RESOLVED, evaluate, fingerprint
from alerts.rules import BUILT_IN, effective_rules
from kneepoint.config import Config, ConfigError, Rule


def rule(**overrides: object) -> Rule:
    base = {"name": "kv", "metric": "kv_cache_occupancy", "op": ">", "threshold": 0.9, "for": 60}
    return Rule.model_validate({**base, **overrides})


def run(the_rule: Rule, series: list[tuple[float, float | None]]) -> list[str]:
    """The alert's state after each (time, value) on one replica ("-" when inactive)."""
    alerts: dict = {}
    seen = []
    for now, value in series:
        alerts, _ = evaluate([the_rule], {"r": {the_rule.metric: value}}, alerts, now)
        seen.append(next(iter(alerts.values())).state if alerts else "-")
    return seen


CASES = {
    "a breach waits out for: before it fires": (
        rule(),
        [(0, 0.95), (30, 0.95), (60, 0.95), (90, 0.95)],
        [PENDING, PENDING, FIRING, FIRING],
    ),
    "a breach that ends before for: never fires": (
        rule(),
        [(0, 0.95), (30, 0.5), (60, 0.95)],
        [PENDING, "-", PENDING],
    ),
    "for: 0 fires at the first breach and resolves at the first good value": (
        rule(**{"for": 0}),
        [(0, 0.5), (10, 0.95), (20, 0.5), (30, 0.5)],
        ["-", FIRING, RESOLVED, RESOLVED],
    ),
    "with a resolve threshold a value hovering at the threshold does not flap": (
        rule(**{"for": 0, "resolve_threshold": 0.8}),
        [(0, 0.95), (10, 0.89), (20, 0.91), (30, 0.85), (40, 0.79)],
        [FIRING, FIRING, FIRING, FIRING, RESOLVED],
    ),
    "a resolved alert that breaches again starts over as pending": (
        rule(),
        [(0, 0.95), (60, 0.95), (70, 0.1), (80, 0.95), (140, 0.95)],
        [PENDING, FIRING, RESOLVED, PENDING, FIRING],
    ),
    "no data is not a breach, and keeps a firing alert firing (no_data: keep)": (
        rule(**{"for": 0}),
        [(0, None), (10, 0.95), (20, None), (30, None), (40, 0.5)],
        ["-", FIRING, FIRING, FIRING, RESOLVED],
    ),
    "no data keeps a pending alert pending, and for: keeps counting from its start": (
        rule(),
        [(0, 0.95), (30, None), (45, None), (60, 0.95)],
        [PENDING, PENDING, PENDING, FIRING],
    ),
    "no data alone never completes for: under keep": (
        rule(),
        [(0, 0.95), (30, None), (120, None)],
        [PENDING, PENDING, PENDING],
    ),
    "no_data: resolve resolves a firing alert and drops a pending one": (
        rule(no_data="resolve", **{"for": 0}),
        [(0, 0.95), (10, None), (20, 0.95)],
        [FIRING, RESOLVED, FIRING],
    ),
    "no_data: alert counts no data as a breach and fires after for:": (
        rule(no_data="alert"),
        [(0, None), (30, None), (60, None), (70, 0.5)],
        [PENDING, PENDING, FIRING, RESOLVED],
    ),
    "a below-threshold rule fires on low values": (
        rule(op="<", threshold=0.3, **{"for": 0}),
        [(0, 0.5), (10, 0.2)],
        ["-", FIRING],
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_lifecycle(case: str) -> None:
    the_rule, series, expected = CASES[case]
    assert run(the_rule, series) == expected


def test_transitions_are_reported_once_each() -> None:
    alerts: dict = {}
    kinds = []
    for now, value in [(0, 0.95), (30, 0.95), (60, 0.95), (90, 0.95), (100, 0.1), (110, 0.1)]:
        alerts, changes = evaluate([rule()], {"r": {"kv_cache_occupancy": value}}, alerts, now)
        kinds += [(now, c.before, c.after) for c in changes]
    assert kinds == [(0, None, PENDING), (60, PENDING, FIRING), (100, FIRING, RESOLVED)]


def test_scope_and_identity() -> None:
    fleet_rule = rule(scope="fleet", **{"for": 0})
    values = {"": {"kv_cache_occupancy": 0.95}, "a": {"kv_cache_occupancy": 0.95}}
    alerts, _ = evaluate([fleet_rule, rule(**{"for": 0})], values, {}, 0)
    assert sorted((a.rule, a.replica) for a in alerts.values()) == [("kv", ""), ("kv", "a")]
    assert fingerprint(rule(), "a") == fingerprint(rule(threshold=0.5), "a")  # same identity
    assert fingerprint(rule(), "a") != fingerprint(rule(), "b")
    assert fingerprint(rule(), "a") != fingerprint(rule(labels={"team": "x"}), "a")


def test_config_rules_override_built_ins_by_name_and_add_new_ones() -> None:
    config = Config.model_validate(
        {
            "rules": [
                {
                    "name": "kv-cache-saturated",
                    "metric": "kv_cache_occupancy",
                    "op": ">",
                    "threshold": 0.8,
                    "for": "1m",
                },
                {
                    "name": "slow-first-token",
                    "metric": "ttft_p99_seconds",
                    "op": ">",
                    "threshold": 2.0,
                },
            ]
        }
    )
    rules = {r.name: r for r in effective_rules(config)}
    assert len(rules) == len(BUILT_IN) + 1
    assert rules["kv-cache-saturated"].threshold == 0.8
    assert rules["kv-cache-saturated"].for_ == 60
    assert rules["slow-first-token"].metric == "ttft_p99_seconds"
    broken = Config.model_validate(
        {"rules": [{"name": "x", "metric": "vibes", "op": ">", "threshold": 1}]}
    )
    with pytest.raises(ConfigError, match=r"rules\[0\]\.metric: unknown metric 'vibes'"):
        effective_rules(broken)


def test_a_configured_budget_adds_the_cost_over_budget_rule() -> None:
    assert "cost-over-budget" not in {r.name for r in effective_rules(Config())}
    config = Config.model_validate({"pricing": {"budget_per_million_tokens": 0.5}})
    rules = {r.name: r for r in effective_rules(config)}
    budget = rules["cost-over-budget"]
    assert (budget.metric, budget.op, budget.threshold, budget.scope) == (
        "cost_per_million_tokens",
        ">",
        0.5,
        "fleet",
    )
    assert budget.for_ == 3600


def history(the_rule: Rule, series: list[tuple[float, float | None]]) -> list[tuple]:  # type: ignore[type-arg]
    """Every transition as (time, before, after, value carried)."""
    alerts: dict = {}
    seen = []
    for now, value in series:
        alerts, changes = evaluate([the_rule], {"r": {the_rule.metric: value}}, alerts, now)
        seen += [(now, c.before, c.after, c.alert.value) for c in changes]
    return seen


def test_a_transition_carries_the_value_seen_then_not_the_one_before() -> None:
    # gpu-idle's shape: below 0.3 is bad. The value that ended the pending state is 0.9,
    # and that is what the history must say (it used to repeat the earlier 0.1).
    idle = rule(metric="gpu_utilization", op="<", threshold=0.3)
    assert history(idle, [(0, 0.1), (15, 0.2), (30, 0.9)]) == [
        (0, None, PENDING, 0.1),
        (30, PENDING, "inactive", 0.9),
    ]
    assert history(idle, [(0, 0.1), (15, None)]) == [(0, None, PENDING, 0.1)]
    assert history(rule(no_data="resolve"), [(0, 0.95), (15, None)]) == [
        (0, None, PENDING, 0.95),
        (15, PENDING, "inactive", None),
    ]


def test_a_firing_alert_whose_data_goes_missing_says_no_data_once() -> None:
    changes = history(
        rule(**{"for": 0}), [(0, 0.95), (10, None), (20, None), (30, 0.95), (40, None)]
    )
    assert changes == [
        (0, None, FIRING, 0.95),
        (10, FIRING, FIRING, None),  # the data went: said once, not at every evaluation
        (40, FIRING, FIRING, None),
    ]


def test_a_gap_does_not_restart_for() -> None:
    alerts: dict = {}
    kv = rule()
    for now, value in [(0, 0.95), (20, None), (40, 0.95)]:
        alerts, _ = evaluate([kv], {"r": {"kv_cache_occupancy": value}}, alerts, now)
    (alert,) = alerts.values()
    assert (alert.state, alert.pending_since, alert.value) == (PENDING, 0, 0.95)


def test_no_data_must_be_keep_resolve_or_alert() -> None:
    assert rule().no_data == "keep"
    with pytest.raises(ValueError, match="no_data"):
        rule(no_data="ignore")


@pytest.mark.parametrize("no_data", ["keep", "resolve", "alert"])
def test_a_metric_the_engine_does_not_expose_never_pends_or_fires(no_data: str) -> None:
    the_rule = rule(**{"for": 0, "no_data": no_data})
    why = {"r": {"kv_cache_occupancy": "not exposed by llama.cpp since its KV gauges went"}}
    alerts: dict = {}
    for now in (0.0, 10.0, 20.0):
        alerts, changes = evaluate(
            [the_rule], {"r": {"kv_cache_occupancy": None}}, alerts, now, why
        )
        assert alerts == {} and changes == []


def test_an_alert_whose_metric_stops_being_exposed_ends_with_the_reason() -> None:
    # A metric the replica's engine does not expose, where the engine is not new (no
    # engine_since given: long ago): its firing alert ends at once, saying why. A new engine
    # holds it first, by `no_data` (tests/alerts/test_engine_change.py).
    the_rule = rule(**{"for": 0})
    alerts, _ = evaluate([the_rule], {"r": {"kv_cache_occupancy": 0.95}}, {}, 0.0)
    assert next(iter(alerts.values())).state == FIRING
    why = {"r": {"kv_cache_occupancy": "not exposed by llama.cpp since its KV gauges went"}}
    alerts, changes = evaluate([the_rule], {"r": {"kv_cache_occupancy": None}}, alerts, 10.0, why)
    (change,) = changes
    assert (change.before, change.after) == (FIRING, RESOLVED)
    assert change.note == why["r"]["kv_cache_occupancy"] and change.alert.value is None
    alerts, changes = evaluate([the_rule], {"r": {"kv_cache_occupancy": None}}, alerts, 20.0, why)
    assert changes == [] and next(iter(alerts.values())).state == RESOLVED
