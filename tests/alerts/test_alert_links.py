"""Each alert message's link lands on the app's view that explains its rule: a page the app
has, on the alert's replica, and for an SLO's burn rate on the SLO."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from alerts.lifecycle import FIRING, PENDING, Alert, Transition
from alerts.messages import notice_for
from alerts.outbox import PAGES, view_of
from alerts.rules import BUILT_IN, METRICS
from alerts.slo import burn_rules
from app.registry import PAGES as APP_PAGES
from kneepoint.config import Config, Rule, Slo

NOW = 1_800_000_000.0
PATHS = {spec.url_path for spec in APP_PAGES}


def link_of(rule: Rule, replica: str, slos: list[Slo] | None = None) -> dict[str, list[str]]:
    config = Config.model_validate(
        {"dashboard_url": "http://kneepoint.example:8501", "slos": slos or []}
    )
    alert = Alert("f", rule.name, replica, FIRING, 1.0, rule.threshold, NOW - 300, NOW - 60)
    link = notice_for(Transition(alert, PENDING, FIRING), rule, config, NOW).link
    assert link.startswith("http://kneepoint.example:8501/?")
    return parse_qs(urlsplit(link).query)


def test_every_metric_a_rule_can_watch_has_a_page_the_app_has() -> None:
    assert set(METRICS) <= set(PAGES)
    assert set(PAGES.values()) <= PATHS


@pytest.mark.parametrize("rule", BUILT_IN, ids=lambda r: r.name)
def test_every_built_in_rule_links_to_its_page_on_its_replica(rule: Rule) -> None:
    replica = "" if rule.scope == "fleet" else "qwen-a"
    query = link_of(rule, replica)
    assert query["page"] == [PAGES[rule.metric]] and query["page"][0] in PATHS
    assert query.get("replica") == ([replica] if replica else None)
    assert "slo" not in query


@pytest.mark.parametrize(
    ("name", "page"),
    [
        ("kv-cache-saturated", "capacity"),
        ("engine-stalled", "overview"),
        ("target-down", "health"),
        ("collector-stale", "health"),
        ("alert-pipeline-failing", "alerts"),
        ("gpu-xid-error", "gpus"),
    ],
)
def test_the_rules_on_call_meets_most_open_the_view_that_explains_them(
    name: str, page: str
) -> None:
    rule = next(r for r in BUILT_IN if r.name == name)
    assert link_of(rule, "" if rule.scope == "fleet" else "qwen-a")["page"] == [page]


def test_an_slo_burn_links_to_the_slos_page_on_its_slo() -> None:
    slo = Slo.model_validate(
        {"name": "chat:ttft", "metric": "ttft", "threshold": 0.5, "objective": 0.99}
    )
    rules = burn_rules([slo])
    assert rules
    for rule in rules:
        assert view_of(rule.metric) == ("slos", "chat:ttft")
        query = link_of(rule, "", [slo])
        assert query["page"] == ["slos"] and query["slo"] == ["chat:ttft"]
        assert query["range"] == ["1h"]


def test_a_config_rule_on_another_metric_falls_back_to_the_overview() -> None:
    assert view_of("no-such-metric") == ("overview", "")
