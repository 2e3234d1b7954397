"""Behaviour unchanged: what kneepoint shows, on fixed stores at a fixed clock, equals the
golden files under tests/golden/, generated from the code before issue 26's restructuring.

Outputs: `kneepoint status --json` at three windows on three stores, `kneepoint alerts list
--json`, every message each chat and incident platform is sent while built-in rules and SLO
burn-rate rules fire and resolve (as posted, secrets masked by kneepoint's own masking),
every page of the app (each element's text, help, tables as CSV, charts' figure JSON), the
Prometheus rules export and the Grafana dashboards.

The stores:
- "engines": vLLM replicas that restart, stall, go stale, go down, refuse scrapes and miss
  them, an SGLang, a llama.cpp, a TGI and a TensorRT-LLM replica from captured scrapes, a
  GPU node, a latency and an availability SLO, a maintenance window, a channel of every
  kind; evaluated and delivered as the alerts job does, at fixed times.
- "seed": tests/seed.py's two vLLM replicas with an hour of scrapes, a GPU node, a dead one.
- "twin": six hours of one twin replica backfilled as `kneepoint demo` does (fixed seeds).

Regenerating (`KNEEPOINT_REGEN_GOLDEN=1 .venv/bin/python -m pytest
tests/test_behaviour_golden.py`, then `git diff tests/golden`) is legitimate only for an
intended change of behaviour: the commit that does it names the change and why. A refactor
(a move, a rename, a new home for a table) must never need it: a difference is a change of
behaviour to fix in the code, not in the golden files.

Left out, each because it differs from run to run and says nothing of behaviour:
- the stores' temporary folder (the config's path on every page's footer): written as
  $STORE (the twin's loopback ports, new on every run, are in no output);
- a page element's widget id and a download button's deferred file id (tests/golden.py
  INVISIBLE), and a download button's URL (a hash of its file; tests/golden.py `_node`);
- plotly's div ids in the weekly review's HTML (uuid4 per figure): written as $UUID;
- the order in which a delivery round's channels are sent (one thread each): messages are
  recorded by channel, then in their outbox order.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import streamlit as st
from sqlalchemy import select
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
from alerts.channels.base import Outgoing
from alerts.channels.send import Result, Sender, where
from alerts.channels.send import scrub as scrub_request
from alerts.evaluate import evaluate_once
from alerts.outbox import deliver_due
from alerts.rules import BUILT_IN
from app import data as app_data
from app.registry import PAGES
from collectors.dcgm import parse_dcgm
from collectors.engines import parse_replica
from kneepoint.cli import app as cli
from kneepoint.config import load_config
from kneepoint.demo import write_config
from kneepoint.samples import Histogram, ReplicaSample
from kneepoint.secrets import forget_all
from kneepoint.store.db import open_store
from kneepoint.store.models import NotificationRow
from kneepoint.store.writer import ensure_targets, record_failure, record_gpus, record_replica
from kneepoint.twin.backfill import backfill_week
from kneepoint.twin.fleet import Fleet, FleetSpec
from tests.conftest import DCGM_T4, OWN_FIXTURES, VLLM_032, migrated, read
from tests.golden import check, dumps, page_record
from tests.seed import seed
from tests.whatif.conftest import PEAK_SESSIONS, REPLICA
from tests.whatif.conftest import SPEC as TWIN_SPEC

ROOT = Path(__file__).resolve().parent.parent
MAIN = str(ROOT / "app" / "main.py")
NOW = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC, a Wednesday: every store's clock
MINUTE = 60.0
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
WINDOWS = ("5m", "1h", "6h")
# The engines store's captured scrapes, one replica each, beside its vLLM replicas.
CAPTURES = {
    "sglang-a": ("sglang", OWN_FIXTURES / "sglang-0.5.10-tp2-all-schedulers.prom"),
    "llamacpp-a": ("llamacpp", OWN_FIXTURES / "llamacpp-b11434-busy.prom"),
    "tgi-a": ("tgi", OWN_FIXTURES / "tgi-3.3.7-speculate2.prom"),
    "trtllm-a": ("trtllm", OWN_FIXTURES / "trtllm-1.3-kv-gauges.prom"),
}
VLLM = ("vllm-a", "vllm-b", "vllm-stuck", "vllm-gap", "vllm-stale")
CHANNELS: list[dict[str, Any]] = [
    {
        "name": "slack",
        "type": "slack",
        "url": "https://hooks.slack.com/services/T01/B02/slacktoken0123456",
    },
    {
        "name": "discord",
        "type": "discord",
        "url": "https://discord.com/api/webhooks/1234/discordtoken0123",
    },
    {
        "name": "teams",
        "type": "teams",
        "url": "https://contoso.webhook.office.com/webhookb2/a-b/IncomingWebhook/teamstoken01234",
    },
    {
        "name": "feishu",
        "type": "feishu",
        "url": "https://open.feishu.cn/open-apis/bot/v2/hook/feishutoken0123",
        "secret": "feishu-signing-secret",
    },
    {
        "name": "dingtalk",
        "type": "dingtalk",
        "url": "https://oapi.dingtalk.com/robot/send?access_token=dingtalktoken0123",
        "secret": "SECdingtalk0123456",
    },
    {
        "name": "wecom",
        "type": "wecom",
        "url": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=wecomkey01234",
    },
    {
        "name": "telegram",
        "type": "telegram",
        "token": "123456:telegramtoken0123",
        "chat_id": "-100123",
    },
    {"name": "pagerduty", "type": "pagerduty", "routing_key": "pagerdutyroutingkey0123"},
    {
        "name": "webhook",
        "type": "webhook",
        "url": "https://hooks.example.com/kneepoint/webhooktoken0123",
        "secret": "webhook-signing-secret",
        "headers": {"Authorization": "Bearer webhookbearer0123"},
    },
    {"name": "alertmanager", "type": "alertmanager", "url": "https://alertmanager.example.com"},
]


@dataclass
class Store:
    config: Path
    folder: Path
    end: float  # the store's last moment: status and pages are taken as of it

    def masked(self, text: str) -> str:
        """`text` without its temporary folder's name, new on every run."""
        return text.replace(str(self.folder), "$STORE")


def run_cli(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


def status_goldens(name: str, store: Store) -> None:
    for window in WINDOWS:
        shown = run_cli(
            "status",
            "--json",
            "--window",
            window,
            "--at",
            str(store.end),
            "--config",
            str(store.config),
        )
        check(f"status/{name}-{window}.json", store.masked(dumps(json.loads(shown))))


# ---------------------------------------------------------------------------------------------
# The engines store: alerts fire and resolve, and every channel is sent their news.


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def engines_config(folder: Path) -> Path:
    """Targets, SLOs, a maintenance window, every channel, and the built-in rules routed to
    every channel (a config rule of a built-in's name replaces it: alerts/rules.py)."""
    names = [c["name"] for c in CHANNELS]
    targets: list[dict[str, Any]] = [
        {"name": n, "kind": "vllm", "url": f"http://127.0.0.1:9/{n}"} for n in VLLM
    ]
    targets[0]["gpus"] = ["cp-bm14r7/0"]
    for name in ("vllm-down", "vllm-refused"):
        targets.append({"name": name, "kind": "vllm", "url": f"http://127.0.0.1:9/{name}"})
    targets += [
        {"name": n, "kind": kind, "url": f"http://127.0.0.1:9/{n}"}
        for n, (kind, _) in CAPTURES.items()
    ]
    targets.append({"name": "gpu-node", "kind": "dcgm", "url": "http://127.0.0.1:9/gpus"})
    rules = [
        {**rule.model_dump(by_alias=True, mode="json"), "channels": names} for rule in BUILT_IN
    ]
    config = {
        "database": f"sqlite:///{folder / 'kneepoint.db'}",
        "scrape_interval": "60s",
        "dashboard_url": "https://kneepoint.example.com",
        "targets": targets,
        "slos": [
            {
                "name": "fast-ttft",
                "metric": "ttft",
                # A bound of every TTFT histogram here (vLLM's, SGLang's, TensorRT-LLM's):
                # the fleet's histogram has only the bounds its replicas share.
                "threshold": "1s",
                "objective": 0.99,
                "channels": names,
            },
            # fast-ttft's burns reach every platform; this one's only the webhook (its
            # messages would be the same shapes again, 40 more of them).
            {"name": "served", "kind": "availability", "objective": 0.999, "channels": ["webhook"]},
        ],
        "maintenance": [
            {
                "name": "gap-upgrade",
                "start": _iso(NOW - 40 * MINUTE),
                "end": _iso(NOW - 20 * MINUTE),
                "replicas": ["vllm-gap"],
            }
        ],
        "channels": CHANNELS,
        "rules": rules,
        "pricing": {"gpu_hour": {"default": 2.0}, "budget_per_million_tokens": 0.01},
    }
    path = folder / "kneepoint.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return migrated(path)


def scaled(sample: ReplicaSample, factor: float) -> ReplicaSample:
    """The capture's sample with its counters and histograms at `factor` of their values:
    a replica whose totals grow with time."""
    grown = copy.deepcopy(sample)
    grown.counters = {k: None if v is None else v * factor for k, v in sample.counters.items()}
    grown.histograms = {
        k: Histogram(h.bounds, tuple(c * factor for c in h.counts), h.total * factor)
        for k, h in sample.histograms.items()
    }
    return grown


def vllm_sample(base: ReplicaSample, done: float, running: float) -> ReplicaSample:
    """vLLM's capture having served `done` minutes of requests, nine in ten within 250 ms
    and one in ten beyond every bucket: slower than the fast-ttft SLO's 1 s, its budget
    spent (as tests/app/test_overview_landing.py's store)."""
    sample = copy.deepcopy(base)
    bounds = base.histograms["ttft"].bounds
    fast = bounds.index(0.25)
    good, bad = 90.0 * done, 10.0 * done
    finite = tuple(good if i >= fast else 0.0 for i in range(len(bounds) - 1))
    sample.histograms["ttft"] = Histogram(bounds, (*finite, good + bad), 0.1 * done)
    sample.counters["generation_tokens"] = done * 900.0
    sample.counters["prompt_tokens"] = done * 4000.0
    sample.counters["preemptions"] = done * 3.0
    sample.gauges["requests_running"] = running
    sample.gauges["requests_waiting"] = max(0.0, running - 8.0)
    sample.gauges["kv_cache_usage"] = min(1.0, running / 10.0)
    return sample


def write_minutes(store: Path, steps: range, at: float) -> None:
    """Scrapes every minute at `at + step * MINUTE` for each step (step 60: `at` + 1 h)."""
    config = load_config(store)
    sessions = open_store(config.database)
    base = parse_replica("vllm", read(VLLM_032))
    captures = {n: parse_replica(kind, read(path)) for n, (kind, path) in CAPTURES.items()}
    gpus = parse_dcgm(read(DCGM_T4), default_host="gpu-node")
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for step in steps:
            ts = at + step * MINUTE
            plan = {
                "vllm-a": (step, 6.0 + step % 6),
                "vllm-b": (step if step < 30 else step - 30, 3.0),  # restarted at step 30
                "vllm-stuck": (min(step, 50), 4.0),  # counts nothing after step 50
                "vllm-gap": (step, 2.0) if not 20 <= step < 40 else None,  # 20 minutes missed
                "vllm-stale": (step, 1.0) if step < 40 else None,  # last seen at step 39
                "vllm-refused": (step, 2.0) if not 45 <= step <= 60 else None,  # refused, below
            }
            for name, done in plan.items():
                if done is not None:
                    record_replica(session, ids[name], ts, vllm_sample(base, *done))
            for name, sample in captures.items():
                record_replica(session, ids[name], ts, scaled(sample, 1.0 + step / 10.0))
            record_gpus(session, ids["gpu-node"], ts, gpus)
            # vllm-down is down for the hour and back after it; vllm-refused answers 503 for
            # its last quarter: target-down fires on both in one round (one grouped message
            # where the platform groups) and resolves on both in one round.
            if step <= 60:
                record_failure(session, ids["vllm-down"], ts, "cannot connect: connection refused")
            else:
                record_replica(session, ids["vllm-down"], ts, vllm_sample(base, step - 60, 2.0))
            if 45 <= step <= 60:
                record_failure(session, ids["vllm-refused"], ts, "HTTP 503 Service Unavailable")


def as_posted(request: Outgoing) -> dict[str, Any]:
    """A request as it went out, masked by kneepoint's own masking: the URL as errors show
    it (alerts/channels/send.py `where`), headers and body through `scrub` (every secret of
    the config, and the URL's parts). The body is recorded as JSON (keys sorted); the
    webhook's X-Kneepoint-Signature, an HMAC of the bytes posted, is kept and pins them."""
    body = request.content.decode() if request.content is not None else json.dumps(request.json)
    return {
        "url": where(request.url),
        "headers": {k: scrub_request(v, request.url) for k, v in request.headers.items()},
        "body": json.loads(scrub_request(body, request.url)),
    }


def keeping(sent: dict[int, Outgoing]) -> Sender:
    """A sender that keeps each request by its outbox row and answers 200, as a platform
    that took the message does."""

    def send(request: Outgoing) -> Result:
        # The Idempotency-Key is kneepoint-<outbox row id>-<created, ms> (alerts/outbox.py).
        sent[int(request.headers["Idempotency-Key"].split("-")[1])] = request
        return Result(200, '{"ok": true}')

    return send


def deliveries(store: Path, times: list[float]) -> list[dict[str, Any]]:
    """At each time, evaluate the rules and deliver what is due, as the alerts and deliver
    jobs do; record the transitions and each request posted, by channel in outbox order."""
    config = load_config(store)  # its secrets are remembered now: `scrub` masks them
    sessions = open_store(config.database)
    kinds = {c.name: c.type for c in config.channels}
    rounds = []
    for at in times:
        with sessions.begin() as session:
            changes = evaluate_once(session, config, at)
        sent: dict[int, Outgoing] = {}  # outbox row id -> its request
        with sessions() as session:
            counts = deliver_due(session, config, at, keeping(sent))
            rows = session.scalars(select(NotificationRow).where(NotificationRow.id.in_(sent)))
            channel_of = {row.id: row.channel for row in rows}
        posted = sorted(sent, key=lambda row_id: (channel_of[row_id], row_id))
        rounds.append(
            {
                "at": _iso(at),
                "transitions": sorted(
                    f"{c.alert.rule} on {c.alert.replica or 'the fleet'}: {c.before} -> {c.after}"
                    for c in changes
                ),
                # The round's outcomes that happened (sent, muted, …), not every zero: a
                # new kind of outcome is no change to these messages.
                "delivered": {outcome: n for outcome, n in counts.items() if n},
                "posted": [
                    {
                        "channel": channel_of[row_id],
                        "type": kinds[channel_of[row_id]],
                        **as_posted(sent[row_id]),
                    }
                    for row_id in posted
                ],
            }
        )
    return rounds


@dataclass
class Engines:
    store: Store
    rounds: list[dict[str, Any]]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Engines:
    """An hour of scrapes ending at NOW, the alerts evaluated and delivered three times in
    its last ten minutes (rules pend, then fire); three minutes more (vllm-down and
    vllm-refused are back) and a round (target-down resolves); three minutes more, the
    store's end."""
    # A test's secrets stay remembered until the next test starts (tests/conftest.py), and
    # this runs before that: forget them, so only this store's are masked in its messages.
    forget_all()
    folder = tmp_path_factory.mktemp("engines")
    config = engines_config(folder)
    start = NOW - 60 * MINUTE
    write_minutes(config, range(61), start)
    rounds = deliveries(config, [NOW - 10 * MINUTE, NOW - 5 * MINUTE, NOW])
    write_minutes(config, range(61, 64), start)
    rounds += deliveries(config, [NOW + 3 * MINUTE])
    write_minutes(config, range(64, 67), start)
    return Engines(Store(config, folder, NOW + 6 * MINUTE), rounds)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Store:
    folder = tmp_path_factory.mktemp("seed")
    return Store(seed(folder, NOW), folder, NOW)


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """Six hours of the twin replica of tests/whatif/conftest.py, backfilled as `kneepoint
    demo` does: its engine and its load are seeded (kneepoint/twin/backfill.py)."""
    folder = tmp_path_factory.mktemp("twin")
    fleet = Fleet(FleetSpec.model_validate(TWIN_SPEC)).start()
    try:
        config = migrated(write_config(folder, fleet))
        backfill_week(
            open_store(load_config(config).database),
            fleet,
            {REPLICA: PEAK_SESSIONS},
            NOW,
            days=0.25,
        )
    finally:
        fleet.stop()
    return Store(config, folder, NOW)


def test_status_json_of_the_engines_store(engines: Engines) -> None:
    status_goldens("engines", engines.store)


def test_status_json_of_the_seeded_store(seeded: Store) -> None:
    status_goldens("seed", seeded)


def test_status_json_of_the_twin_store(twin: Store) -> None:
    status_goldens("twin", twin)


def test_the_messages_each_platform_is_sent(engines: Engines) -> None:
    check("messages.json", engines.store.masked(dumps(engines.rounds)))


def test_alerts_list_json(engines: Engines) -> None:
    shown = run_cli("alerts", "list", "--json", "--config", str(engines.store.config))
    check("alerts-list.json", engines.store.masked(dumps(json.loads(shown))))


def test_the_prometheus_rules_and_grafana_dashboards(engines: Engines, tmp_path: Path) -> None:
    config = str(engines.store.config)
    check("exports/prometheus-rules.yaml", run_cli("alerts", "export", "--config", config))
    written = run_cli("export", "grafana", "--out", str(tmp_path), "--config", config)
    files = [Path(line) for line in written.splitlines()]
    assert files, "the dashboards"
    for path in files:
        check(f"exports/grafana/{path.name}", dumps(json.loads(path.read_text())))


@pytest.fixture
def held_clock(engines: Engines, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """The app on the engines store, its clock (app/data.py's `time`) held at the store's
    end, nothing cached from another test's store."""
    store = engines.store
    monkeypatch.setattr(app_data, "time", SimpleNamespace(time=lambda: store.end))
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(store.config))
    st.cache_data.clear()
    yield store
    st.cache_data.clear()


@pytest.mark.parametrize("page", [spec.url_path for spec in PAGES])
def test_the_page(held_clock: Store, page: str) -> None:
    shown = AppTest.from_file(MAIN, default_timeout=120)
    shown.query_params["page"] = page
    shown.run()
    assert not shown.exception, [e.value for e in shown.exception]
    check(f"pages/{page}.json", held_clock.masked(dumps(page_record(shown))))


def test_the_weekly_report(engines: Engines, tmp_path: Path) -> None:
    """`kneepoint report`: its Markdown summary, and its HTML page (3.5 MB with plotly.js
    inlined) as a digest, plotly's random div ids (uuid4 per figure) masked."""
    store = engines.store
    config = str(store.config)
    run_cli("report", "--at", str(store.end), "--out", str(tmp_path), "--config", config)
    (page,) = tmp_path.glob("*.html")
    (summary,) = tmp_path.glob("*.md")
    check("report/summary.md", store.masked(summary.read_text()))
    html = UUID.sub("$UUID", store.masked(page.read_text()))
    digest = hashlib.sha256(html.encode()).hexdigest()
    check("report/page.txt", f"{page.name} sha256:{digest} ({len(html)} characters)\n")
