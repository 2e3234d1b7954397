"""The on-call cockpit on the pages: the Alerts page opens a rule's runbook from the message's
link (?rule=NAME) and names each firing alert's likely cause; the Capacity page shows each
replica's headroom forecast."""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from streamlit.testing.v1 import AppTest

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
from app.registry import PAGES_DIR
from kneepoint import runbooks
from kneepoint.causes import CAPACITY, UPSTREAM
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.models import AlertRow
from tests.seed import seed

ALERTS = str(PAGES_DIR / "alerts.py")
CAPACITY_PAGE = str(PAGES_DIR / "capacity.py")
SLOS = str(PAGES_DIR / "slos.py")


@pytest.fixture
def seeded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = seed(tmp_path, time.time())
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    return config


def texts(app: AppTest) -> str:
    return "\n".join(m.value for m in app.markdown)


def test_the_message_link_opens_the_rule_s_runbook(seeded: Path) -> None:
    app = AppTest.from_file(ALERTS, default_timeout=60)
    app.query_params["rule"] = "kv-cache-saturated"
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    shown = texts(app)
    assert "Runbook: kv-cache-saturated" in shown
    for step in runbooks.RUNBOOKS["kv-cache-saturated"].steps:
        assert step.fix in shown
    burn = AppTest.from_file(ALERTS, default_timeout=60)
    burn.query_params["rule"] = "fast-ttft-burn-1h"
    burn.run()
    assert f"Runbook: fast-ttft-burn-1h · {runbooks.SLO_BURN}" in texts(burn)
    own = AppTest.from_file(ALERTS, default_timeout=60)
    own.query_params["rule"] = "my-own-rule"
    own.run()
    assert not own.exception and "my-own-rule" in own.warning[0].value


def test_a_firing_alert_shows_its_likely_cause_and_runbook_link(seeded: Path) -> None:
    now = time.time()
    sessions = open_store(load_config(seeded).database)
    with sessions.begin() as session:
        session.add(
            AlertRow(
                fingerprint="f1",
                rule="kv-cache-saturated",
                replica="replica-a",
                state="firing",
                value=0.97,
                threshold=0.9,
                pending_since=now - 400,
                fired_at=now - 100,
                resolved_at=None,
                updated_at=now,
                notified_at=now - 100,
            )
        )
    app = AppTest.from_file(ALERTS, default_timeout=60).run()
    assert not app.exception, [e.value for e in app.exception]
    line = next(m.value for m in app.markdown if m.value.startswith("**kv-cache-saturated**"))
    assert "on replica-a (firing): " in line
    # The seed's KV occupancy climbs past SATURATION every ten minutes while its tokens keep
    # moving, with no stored run (no knee), no XID and no change in the hour before: the
    # cause is capacity, and its evidence is replica-a's KV peak.
    kind, evidence = line.split("(firing): ", 1)[1].split(": ", 1)
    assert kind == CAPACITY, line
    assert evidence.startswith("replica-a: KV cache at "), line
    assert "(./?page=alerts&rule=kv-cache-saturated)" in line


def test_the_slos_page_names_a_burn_s_likely_cause_and_links_its_runbook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spent budget (tests/app/test_overview_landing.py `troubled_store`) while one replica's
    engine is stalled: the burn's likely cause is upstream, naming the stalled replica, and
    its runbook link opens the SLO-burn runbook on the Alerts page."""
    from tests.app.test_overview_landing import troubled_store

    monkeypatch.setenv("KNEEPOINT_CONFIG", str(troubled_store(tmp_path)))
    app = AppTest.from_file(SLOS, default_timeout=120).run()
    assert not app.exception, [e.value for e in app.exception]
    (burning,) = [m.value for m in app.metric if m.label == "Burning"]
    assert burning != "no"  # the budget burns: the page says why
    (line,) = [w.value for w in app.warning if w.value.startswith("Likely cause: ")]
    kind, evidence = line.removeprefix("Likely cause: ").split(": ", 1)
    assert kind == UPSTREAM, line
    assert evidence.startswith("replica-stuck's engine stalled since "), line
    (query,) = re.findall(r"\]\(\./\?([^)]*)\)", line)
    params = parse_qs(query)
    assert params == {"page": ["alerts"], "rule": [runbooks.SLO_BURN]}
    book = AppTest.from_file(ALERTS, default_timeout=60)
    book.query_params["rule"] = params["rule"][0]
    book.run()
    assert not book.exception, [e.value for e in book.exception]
    shown = texts(book)
    assert f"Runbook: {runbooks.SLO_BURN}" in shown
    for step in runbooks.RUNBOOKS[runbooks.SLO_BURN].steps:
        assert step.fix in shown


def test_the_capacity_page_shows_each_replica_s_forecast(seeded: Path) -> None:
    app = AppTest.from_file(CAPACITY_PAGE, default_timeout=60).run()
    assert not app.exception, [e.value for e in app.exception]
    assert "Headroom forecast" in [h.value for h in app.subheader]
    table = next(d.value for d in app.dataframe if "Why no date" in d.value.columns)
    assert {"replica-a", "replica-b"} <= set(table["Replica"])
    # An hour of history: too few days, so no date and a note that says so.
    assert (table["Reaches the knee"] == "–").all()
    assert all("day(s) of history" in note for note in table["Why no date"])
