"""The Overview as the on-call landing page: on a store where an SLO's budget is spent (so its
burn-rate alerts fire), a ticket alert fires and a replica is down, the page opens on the
fleet's status with its reasons, then lists the alerts `kneepoint alerts list --json` lists,
each linking to the view that explains it, the SLO's budget, and the down replica; no
"None" or "NaN" anywhere."""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
from alerts.evaluate import evaluate_once
from alerts.outbox import view_of
from alerts.rules import effective_rules
from alerts.slo import burn_rules
from app.registry import PAGES, PAGES_DIR
from collectors.engines.vllm import parse_vllm
from kneepoint.cli import app as cli
from kneepoint.config import load_config
from kneepoint.samples import Histogram
from kneepoint.store.db import open_store
from kneepoint.store.models import AlertRow
from kneepoint.store.writer import ensure_targets, record_failure, record_replica
from tests.conftest import VLLM_032, migrated, read

OVERVIEW = str(PAGES_DIR / "overview.py")
LINK = re.compile(r"\]\(\./\?([^)]*)\)")
# Machine values a person should never read: an ISO time, a float in exponent notation.
RAW = re.compile(r"\d{4}-\d{2}-\d{2}T\d|\d\.\d+e[+-]\d+")


@pytest.fixture
def troubled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config_file = troubled_store(tmp_path)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config_file))
    return config_file


def troubled_store(folder: Path) -> Path:
    """Two replicas serving an hour of requests, a tenth of them slower than the SLO's
    250 ms (budget spent: 10 % bad against 1 % allowed), one replica refusing its scrape, one
    stalled for its last ten minutes; alerts evaluated on it (target-down and engine-stalled
    pend, then fire), and a ticket alert firing on replica-b. Returns the config."""
    config_file = folder / "kneepoint.yaml"
    config_file.write_text(f"""
database: sqlite:///{folder / "kneepoint.db"}
scrape_interval: 60s
targets:
  - {{name: replica-a, kind: vllm, url: "http://127.0.0.1:9/a"}}
  - {{name: replica-b, kind: vllm, url: "http://127.0.0.1:9/b"}}
  - {{name: replica-down, kind: vllm, url: "http://127.0.0.1:9/down"}}
  - {{name: replica-stuck, kind: vllm, url: "http://127.0.0.1:9/stuck"}}
slos:
  - {{name: fast-ttft, metric: ttft, threshold: 0.25s, objective: 0.99}}
""")
    migrated(config_file)
    config = load_config(config_file)
    sessions = open_store(config.database)
    base = parse_vllm(read(VLLM_032))
    bounds = base.histograms["ttft"].bounds
    fast = bounds.index(0.25)
    now = time.time()
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for step in range(61):  # every minute for an hour, the last a few seconds ago
            ts = now - 5 - (60 - step) * 60
            for name in ("replica-a", "replica-b", "replica-stuck"):
                # replica-stuck counts nothing for its last ten minutes, four requests running.
                done = min(step, 50) if name == "replica-stuck" else step
                sample = copy.deepcopy(base)
                good, bad = 90.0 * done, 10.0 * done
                finite = tuple(good if i >= fast else 0.0 for i in range(len(bounds) - 1))
                sample.histograms["ttft"] = Histogram(bounds, (*finite, good + bad), 0.1 * done)
                sample.counters["generation_tokens"] = done * 900.0
                sample.counters["prompt_tokens"] = done * 4000.0
                sample.gauges["requests_running"] = 4.0
                sample.gauges["requests_waiting"] = 0.0
                record_replica(session, ids[name], ts, sample)
        record_failure(session, ids["replica-down"], now - 5, "cannot connect: connection refused")
    for at in (now - 90, now):  # target-down and engine-stalled pend, then fire after a minute
        with sessions.begin() as session:
            evaluate_once(session, config, at)
    with sessions.begin() as session:
        session.add(
            AlertRow(
                fingerprint="own-ticket",
                rule="preemptions-sustained",
                replica="replica-b",
                state="firing",
                value=0.2,
                threshold=0.05,
                pending_since=now - 1500,
                fired_at=now - 900,
                resolved_at=None,
                updated_at=now,
                notified_at=now - 900,
            )
        )
    return config_file


def listed(config_file: Path) -> list[dict[str, object]]:
    result = CliRunner().invoke(cli, ["alerts", "list", "--json", "--config", str(config_file)])
    assert result.exit_code == 0, result.output
    return list(json.loads(result.stdout)["alerts"])


def everything(app: AppTest) -> list[str]:
    """Every text the page shows: markdown (with its hover help), headers, captions, tiles."""
    texts = [m.value for m in app.markdown] + [str(m.help or "") for m in app.markdown]
    texts += [h.value for h in (*app.title, *app.subheader, *app.caption)]
    texts += [f"{m.label} {m.value} {m.help or ''}" for m in app.metric]
    texts += [e.value for e in (*app.info, *app.success, *app.warning, *app.error)]
    return texts


def test_the_overview_opens_on_the_fleet_status_and_the_firing_alerts(troubled: Path) -> None:
    alerts_now = listed(troubled)
    firing = [a for a in alerts_now if a["state"] == "firing"]
    assert any(str(a["rule"]).startswith("fast-ttft-burn-") for a in firing)  # page severity
    assert any(a["rule"] == "preemptions-sustained" for a in firing)

    app = AppTest.from_file(OVERVIEW, default_timeout=90).run()
    assert not app.exception, [e.value for e in app.exception]
    lines = [m.value for m in app.markdown]

    # The status line first: down (a replica down, one stalled, of the four scraped), then
    # the SLO's spent budget (burning), then the ticket, each level naming its reasons.
    rules = {r.name: r for r in effective_rules(load_config(troubled))}
    rules |= {r.name: r for r in burn_rules(load_config(troubled).slos)}
    status = lines[0]
    assert status.startswith("#### :red[:material/error: Down: "), status
    assert "Down: 1 of 4 replicas down; 1 of 4 replicas stalled · " in status, status
    assert " · Burning: SLO fast-ttft budget exhausted" in status, status
    assert " · Degraded: preemptions-sustained firing on replica-b (ticket)" in status, status
    assert status.index("Down:") < status.index("Burning:") < status.index("Degraded:")
    reasons = lines[1]  # the worst first, each a link to the view that explains it
    assert "[replica-stuck stalled](./?page=overview&range=1h&replica=replica-stuck)" in reasons
    down = "[target-down firing on replica-down (page)](./?page=health&range=1h&replica="
    assert down + "replica-down)" in reasons and reasons.endswith(" more below")

    # Every alert the CLI lists, firing and pending, on a line of its own, firing first,
    # severity badge, where, how long, and the link to the view that explains it.
    alert_lines = [line for line in lines if re.match(r":\w+-badge\[(page|ticket|info)\]", line)]
    assert len(alert_lines) == len(alerts_now)
    states = []
    for alert in alerts_now:
        where = alert["replica"] or "fleet"
        (line,) = [x for x in alert_lines if f"**{alert['rule']}** · {where} · " in x]
        rule = rules[str(alert["rule"])]
        assert line.startswith(f":{'red' if rule.severity == 'page' else 'orange'}-badge[")
        assert f"[{alert['state']}] for " in line
        query = parse_qs(LINK.search(line).group(1))  # type: ignore[union-attr]
        page, slo = view_of(rule.metric)
        assert query["page"] == [page] and query["range"] == ["1h"]
        assert query.get("slo") == ([slo] if slo else None)
        assert query.get("replica") == ([alert["replica"]] if alert["replica"] else None)
        states.append((alert_lines.index(line), alert["state"]))
    assert [s for _, s in sorted(states)] == sorted(s for _, s in states)  # firing first

    # Each SLO's budget and burn; the down replica called out with its error.
    (slo_line,) = [x for x in lines if "**fast-ttft** · budget left" in x]
    assert ":red-badge[budget exhausted]" in slo_line and "page=slos" in slo_line
    (down,) = [x for x in lines if x.startswith(":red-badge[down] **replica-down**")]
    assert "connection refused" in down and "page=health&range=1h&replica=replica-down" in down
    (stuck,) = [x for x in lines if x.startswith(":red-badge[stalled] **replica-stuck**")]
    assert re.search(r"no token counted for \d+ min while requests wait", stuck), stuck
    assert "page=overview&range=1h&replica=replica-stuck" in stuck
    assert any(a["rule"] == "engine-stalled" and a["replica"] == "replica-stuck" for a in firing)

    # Then the tiles and the charts, GPU busy named apart from load vs knee.
    assert any("GPU busy (DCGM)" in c.value and "load vs knee" in c.value for c in app.caption)
    assert app.metric and len(app.get("plotly_chart")) == 4

    shown = "\n".join(everything(app))
    assert "None" not in shown and "NaN" not in shown and "nan %" not in shown
    raw = [line for line in everything(app) if RAW.search(line)]
    assert not raw, raw  # no ISO time, no 1.86933e+09 anywhere on the page


def test_a_burning_slo_with_every_replica_serving_reads_burning_not_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fleet serves on every replica while an SLO's budget burns: "Burning", never
    "Down" (the burn-rate page alerts fire, but no replica is down)."""
    config_file = troubled_store(tmp_path)
    kept = [
        line
        for line in config_file.read_text().splitlines()
        if "replica-down" not in line and "replica-stuck" not in line
    ]
    config_file.write_text("\n".join(kept))
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config_file))
    assert any(str(a["rule"]).startswith("fast-ttft-burn-") for a in listed(config_file))
    app = AppTest.from_file(OVERVIEW, default_timeout=90).run()
    assert not app.exception, [e.value for e in app.exception]
    status = app.markdown[0].value
    assert status.startswith("#### :violet[:material/local_fire_department: Burning: "), status
    assert "SLO fast-ttft budget exhausted" in status and "Down" not in status


def test_every_link_on_it_opens_a_page_of_the_app(troubled: Path) -> None:
    app = AppTest.from_file(OVERVIEW, default_timeout=90)
    app.query_params["range"] = "6h"
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    paths = {spec.url_path for spec in PAGES}
    links = [parse_qs(q) for m in app.markdown for q in LINK.findall(m.value)]
    assert links
    for query in links:
        assert query.get("page", [""])[0] in paths or "rule" in query, query
        if "rule" not in query:  # the runbook links keep their own form
            assert query["range"] == ["6h"]  # the page's time range travels with the link


def test_an_slo_burn_link_opens_the_slos_page_on_its_slo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.seed import seed

    config_file = seed(tmp_path, time.time())
    config_file.write_text(
        config_file.read_text()
        + "slos:\n"
        + "  - {name: first, metric: ttft, threshold: 0.25s, objective: 0.99}\n"
        + "  - {name: second, metric: ttft, threshold: 0.5s, objective: 0.99}\n"
    )
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config_file))
    rule = next(r for r in burn_rules(load_config(config_file).slos) if r.name.startswith("sec"))
    page, slo = view_of(rule.metric)
    assert (page, slo) == ("slos", "second")
    slos = str(PAGES_DIR / "slos.py")
    plain = AppTest.from_file(slos, default_timeout=60).run()
    linked = AppTest.from_file(slos, default_timeout=60)
    linked.query_params["slo"] = slo
    linked.run()
    assert not plain.exception and not linked.exception
    assert plain.subheader[0].value.startswith("first: ")
    assert linked.subheader[0].value.startswith("second: ")


def test_a_fleet_with_nothing_wrong_reads_ok(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.seed import seed

    config_file = seed(tmp_path, time.time())
    kept = [line for line in config_file.read_text().splitlines() if "replica-down" not in line]
    # The two replicas that serve, their last sample 15 s ago well within a minute's scrapes.
    config_file.write_text("\n".join(kept).replace("scrape_interval: 5s", "scrape_interval: 60s"))
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config_file))
    assert listed(config_file) == []
    app = AppTest.from_file(OVERVIEW, default_timeout=60).run()
    assert not app.exception, [e.value for e in app.exception]
    lines = [m.value for m in app.markdown]
    assert lines[0] == "#### :green[:material/check_circle: OK]"
    assert ":green[Nothing is firing or pending.]" in lines
    assert ":green[Every scraped replica is up and serving.]" in lines
    assert [h.value for h in app.subheader][:2] == [
        "Alerts: 0 firing, 0 pending",
        "Replicas: 0 of 2 down, stale or stalled",
    ]
