"""A fleet of several engines, scraped from a real loopback HTTP server by `kneepoint collect`
and read back by `kneepoint status --json`: each replica says its engine and what it cannot
give, the fleet adds across engines, `kind: auto` detects the engine, and a rule over a number
an engine does not expose never fires and says why in `kneepoint alerts list`."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kneepoint import clock
from kneepoint.cli import app
from tests.conftest import OWN_FIXTURES, VLLM_032, MetricsServer, Route, migrated, read

# name -> (kind in the config, fixture, the engine it is)
FLEET = {
    "vllm-a": ("vllm", VLLM_032, "vllm"),
    "sglang-a": ("sglang", OWN_FIXTURES / "sglang-0.5.23-priority.prom", "sglang"),
    "sglang-old": ("sglang", OWN_FIXTURES / "sglang-0.4.6.prom", "sglang"),
    "trtllm-a": ("trtllm", OWN_FIXTURES / "trtllm-full-iteration-stats.prom", "trtllm"),
    "auto-sglang": ("auto", OWN_FIXTURES / "sglang-0.5.10-tp2-all-schedulers.prom", "sglang"),
    "auto-vllm": ("auto", OWN_FIXTURES / "vllm-0.10.2-dp2.prom", "vllm"),
    "llamacpp-a": ("llamacpp", OWN_FIXTURES / "llamacpp-b11434-busy.prom", "llamacpp"),
    "auto-llamacpp-old": ("auto", OWN_FIXTURES / "llamacpp-7841fc7-busy.prom", "llamacpp"),
}
# Keys of a replica that the fleet adds up (docs/explanation/design.md: counts and rates add,
# fractions never).
ADDITIVE = (
    "engines",
    "requests_running",
    "requests_waiting",
    "kv_cache_capacity_tokens",
    "preemptions",
    "preemptions_per_second",
    "prompt_tokens_per_second",
    "generation_tokens_per_second",
)
_COUNTER = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*_total(?:\{[^}]*\})?) (\S+)$", re.M)


def bumped(text: str, by: float) -> str:
    """The exposition a while later: every counter sample (`…_total`) grown by `by`."""
    return _COUNTER.sub(lambda m: f"{m.group(1)} {float(m.group(2)) + by}", text)


def growing(text: str, step: float) -> Callable[[], bytes]:
    """A body that grows every counter by `step` on each scrape."""
    scrapes = iter(range(1_000_000))
    return lambda: bumped(text, step * next(scrapes)).encode()


@pytest.fixture
def fleet(metrics_server: MetricsServer, tmp_path: Path) -> Path:
    targets = []
    for index, (name, (kind, fixture, _)) in enumerate(FLEET.items()):
        metrics_server.routes[f"/{name}"] = Route(growing(read(fixture), 100.0 * (index + 1)))
        targets.append(
            f"  - {{name: {name}, kind: {kind}, url: '{metrics_server.url('/' + name)}'}}"
        )
    config = tmp_path / "kneepoint.yaml"
    config.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        "targets:\n" + "\n".join(targets) + "\n"
        "rules:\n"
        "  - {name: waiting-for-capacity-strict, metric: requests_waiting_capacity, op: '>',"
        " threshold: 0, for: 0s, no_data: alert}\n"
        "  - {name: no-retraction-counter, metric: preemptions_per_second, op: '>',"
        " threshold: 1000, for: 0s, no_data: alert}\n"
    )
    migrated(config)
    runner = CliRunner()
    for _ in range(3):
        result = runner.invoke(app, ["collect", "--once", "--config", str(config)])
        assert result.exit_code == 0, result.output
    return config


def status(config: Path) -> dict:
    result = CliRunner().invoke(
        app, ["status", "--json", "--window", "1h", "--config", str(config)]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_each_replica_says_its_engine_and_generation(fleet: Path) -> None:
    report = status(fleet)
    replicas = {r["name"]: r for r in report["replicas"]}
    assert set(replicas) == set(FLEET)
    for name, (_, _, engine) in FLEET.items():
        replica = replicas[name]
        assert replica["up"] is True, replica["last_error"]
        assert replica["engine"] == engine
        assert replica["engine_generation"]
        assert isinstance(replica["unavailable"], dict)
    assert replicas["sglang-a"]["engine_generation"] == "0.5.23"
    assert replicas["sglang-old"]["engine_generation"] == "0.4.6"
    # kind: auto stores what the first scrape's names say.
    assert replicas["auto-sglang"]["engine_generation"] == "0.5.10"
    assert replicas["auto-vllm"]["engine_generation"] == "v1-0.10"
    assert replicas["llamacpp-a"]["engine_generation"] == "cached-tokens"
    assert replicas["auto-llamacpp-old"]["engine_generation"] == "kv-gauges"
    assert report["fleet"]["engine"] == "mixed"


def test_what_an_engine_does_not_give_is_null_with_the_reason(fleet: Path) -> None:
    replicas = {r["name"]: r for r in status(fleet)["replicas"]}
    old = replicas["sglang-old"]
    for key in ("preemptions", "preemptions_per_second", "kv_cache_capacity_tokens"):
        assert old[key] is None
    assert old["unavailable"]["preemptions"].startswith("not exposed by SGLang before 0.5.10")
    assert "requests_waiting_capacity" in replicas["sglang-a"]["unavailable"]
    assert replicas["sglang-a"]["requests_waiting_capacity"] is None
    # The same numbers are there for the engines that give them.
    assert replicas["sglang-a"]["preemptions"] is not None
    assert replicas["vllm-a"]["requests_waiting_capacity"] is not None
    assert "requests_waiting_capacity" not in replicas["vllm-a"]["unavailable"]
    # llama.cpp: no KV gauge since May 2025, and before its cached-token counter no count of
    # all prompt tokens (its prompt_tokens_total leaves the cached ones out).
    new, old_cpp = replicas["llamacpp-a"], replicas["auto-llamacpp-old"]
    assert new["kv_cache_occupancy"] is None
    assert new["unavailable"]["kv_cache_occupancy"].startswith(
        "not exposed by llama.cpp since its KV gauges were removed"
    )
    assert new["prompt_tokens_per_second"] is not None and new["prefix_cache_hit_rate"] is not None
    assert old_cpp["kv_cache_occupancy"] is not None
    assert old_cpp["prompt_tokens_per_second"] is None
    assert "excludes" in old_cpp["unavailable"]["prompt_tokens"]


def test_fleet_totals_add_up_across_engines(fleet: Path) -> None:
    report = status(fleet)
    replicas, total = report["replicas"], report["fleet"]
    for key in ADDITIVE:
        known = [r[key] for r in replicas if r[key] is not None]
        assert total[key] == pytest.approx(sum(known)), key
    engines_with_tokens = {r["engine"] for r in replicas if r["prompt_tokens_per_second"]}
    assert engines_with_tokens == {"vllm", "sglang", "trtllm", "llamacpp"}
    # A fraction is never added: the fleet's occupancy is its fullest replica's.
    occupancy = [r["kv_cache_occupancy"] for r in replicas if r["kv_cache_occupancy"] is not None]
    assert total["kv_cache_occupancy"] == max(occupancy)
    # What some engine lacks is not unavailable for the fleet, which has it from the others.
    assert "preemptions" not in total["unavailable"]


def test_a_rule_over_a_number_an_engine_does_not_expose_never_fires_and_says_why(
    fleet: Path,
) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["alerts", "eval", "--once", "--config", str(fleet)])
    assert result.exit_code == 0, result.output
    listed = runner.invoke(app, ["alerts", "list", "--json", "--config", str(fleet)])
    assert listed.exit_code == 0, listed.output
    report = json.loads(listed.stdout)
    firing = {(a["rule"], a["replica"]) for a in report["alerts"]}
    # `no_data: alert` would fire on a missing value; on a number the engine lacks it does not.
    for name in ("sglang-a", "sglang-old", "auto-sglang"):
        assert ("waiting-for-capacity-strict", name) not in firing
    assert ("no-retraction-counter", "sglang-old") not in firing
    not_exposed = {(n["rule"], n["replica"]): n["reason"] for n in report["not_exposed"]}
    assert not_exposed[("no-retraction-counter", "sglang-old")].startswith(
        "not exposed by SGLang before 0.5.10"
    )
    assert not_exposed[("waiting-for-capacity-strict", "sglang-a")].startswith(
        "not exposed by SGLang"
    )
    assert ("waiting-for-capacity-strict", "vllm-a") not in not_exposed
    table = runner.invoke(app, ["alerts", "list", "--config", str(fleet)])
    assert "no-retraction-counter does not apply to sglang-old: not exposed by SGLang" in (
        table.output
    )


def test_an_alert_ends_with_the_reason_when_an_auto_target_changes_engine(
    metrics_server: MetricsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An `auto` target that served vLLM (3 sequences waiting for KV capacity: the rule fires)
    # and now serves SGLang, which has no such number: the alert is held by its `no_data`
    # (keep) while the new engine is new, then ends, and its history says why.
    bodies = {"now": read(OWN_FIXTURES / "vllm-0.10.2-dp2.prom")}
    metrics_server.routes["/r"] = Route(lambda: bodies["now"].encode())
    config = tmp_path / "kneepoint.yaml"
    config.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        f"targets:\n  - {{name: r, kind: auto, url: '{metrics_server.url('/r')}'}}\n"
        "rules:\n  - {name: capacity-wait, metric: requests_waiting_capacity, op: '>',"
        " threshold: 0, for: 0s}\n"
    )
    migrated(config)
    runner = CliRunner()

    def round_() -> None:
        for command in (["collect", "--once"], ["alerts", "eval", "--once"]):
            result = runner.invoke(app, [*command, "--config", str(config)])
            assert result.exit_code == 0, result.output

    round_()
    listed = json.loads(
        runner.invoke(app, ["alerts", "list", "--json", "--config", str(config)]).stdout
    )
    states = {a["rule"]: a["state"] for a in listed["alerts"]}
    assert states["capacity-wait"] == "firing"
    bodies["now"] = read(OWN_FIXTURES / "sglang-0.5.23-priority.prom")
    round_()
    listed = json.loads(
        runner.invoke(app, ["alerts", "list", "--json", "--config", str(config)]).stdout
    )
    held = {a["rule"]: a["state"] for a in listed["alerts"]}
    assert held["capacity-wait"] == "firing"  # the engine change alone ends nothing
    # Once the new engine has been seen for each rule's settle time (its `for`, at least
    # alerts.lifecycle.ENGINE_SETTLE; an hour is past both), both alerts end with the reason.
    later = time.time() + 3600
    monkeypatch.setattr(clock, "system_clock", lambda: later)
    result = runner.invoke(app, ["alerts", "eval", "--once", "--config", str(config)])
    assert result.exit_code == 0, result.output
    listed = json.loads(
        runner.invoke(app, ["alerts", "list", "--json", "--config", str(config)]).stdout
    )
    ended = {"capacity-wait", "waiting-for-kv-capacity"}  # the built-in one had pended
    assert not ended & {a["rule"] for a in listed["alerts"]}
    assert "capacity-wait" in {n["rule"] for n in listed["not_exposed"]}
    from kneepoint.config import load_config
    from kneepoint.store import queries
    from kneepoint.store.db import open_store

    sessions = open_store(load_config(config, environ={}).database)
    with sessions() as session:
        history = queries.alert_history(session, 0.0, 4e9)
    last = history[history.rule == "capacity-wait"].iloc[0]
    assert (last["before"], last["after"]) == ("firing", "resolved")
    assert last["note"].startswith("not exposed by SGLang")
