"""Runbooks: every built-in rule (and every SLO burn alert) has a section in
docs/reference/runbooks.md, the file is what kneepoint/runbooks.py renders, and each rule's link
opens it in the app."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from alerts.rules import effective_rules
from alerts.slo import burn_rules
from kneepoint import runbooks
from kneepoint.config import Config

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "runbooks.md"


def every_built_in_rule() -> list[str]:
    """Built-ins, the budget rule that exists only with a budget, and the burn rules."""
    config = Config.model_validate(
        {
            "pricing": {"budget_per_million_tokens": 1.0},
            "slos": [
                {"name": "fast-ttft", "metric": "ttft", "threshold": 0.5, "objective": 0.99},
                {"name": "up", "kind": "availability", "objective": 0.999},
            ],
        }
    )
    return [r.name for r in effective_rules(config) + burn_rules(config.slos)]


def test_every_built_in_rule_has_a_section_in_docs_runbooks_md() -> None:
    headings = set(re.findall(r"^## (\S+)$", DOC.read_text(), flags=re.M))
    names = every_built_in_rule()
    assert "kv-cache-saturated" in names and any("-burn-" in n for n in names)
    missing = [n for n in names if runbooks.section_for(n) not in headings]
    assert not missing, f"rules without a runbook section in docs/reference/runbooks.md: {missing}"
    assert "engine-stalled" in headings  # issue 16's page rule, whenever it is built in


def test_docs_runbooks_md_is_what_the_module_renders() -> None:
    assert DOC.read_text() == runbooks.markdown(), (
        "docs/reference/runbooks.md is stale: "
        "run `python -m kneepoint.runbooks > docs/reference/runbooks.md`"
    )


def test_each_section_names_causes_and_a_knob_for_each() -> None:
    for name, book in runbooks.RUNBOOKS.items():
        assert book.meaning and book.steps, name
        for step in book.steps:
            assert step.cause and step.check and step.fix, (name, step)
            assert "|" not in step.cause + step.check + step.fix, name  # a table cell
        text = runbooks.section(name)
        assert text.startswith(f"## {name}\n") and all(s.fix in text for s in book.steps)


def test_the_link_opens_the_rule_on_the_alerts_page_and_own_rules_have_none() -> None:
    link = runbooks.url("https://kneepoint.example.com/", "kv-cache-saturated")
    assert link is not None
    parsed = urlparse(link)
    assert parsed.netloc == "kneepoint.example.com"
    assert parse_qs(parsed.query) == {"page": ["alerts"], "rule": ["kv-cache-saturated"]}
    assert runbooks.section_for("fast-ttft-burn-1h") == runbooks.SLO_BURN
    assert runbooks.url("http://x", "my-own-rule") is None
    assert runbooks.section_for("my-burn-rule") is None
