from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path

import pytest

from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import parse_vllm
from kneepoint.config import Config, Target
from kneepoint.derived.tiers import TIERS
from kneepoint.status import build_status, stale_after, stale_targets
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets, record_failure, record_gpus, record_replica
from tests.conftest import DCGM_T4, OWN_FIXTURES, ROOT, VLLM_032, read


def contract_keys(block: str) -> set[str]:
    """The keys the JSON contract's example shows for one block of `kneepoint status --json`."""
    contracts = (ROOT / "docs" / "reference" / "json.md").read_text()
    example = contracts.split("## `kneepoint status --json`")[1].split("```")[1]
    section = example.split(f'"{block}": [{{')[1].split("}]")[0]
    # Keys inside a value: a quantile's, and prefix_cache_tier_shares' tiers.
    return set(re.findall(r'"([a-z_0-9]+)":', section)) - {"p50", "p90", "p99", *TIERS}


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config(
        database=f"sqlite:///{tmp_path / 's.db'}",
        targets=[
            Target(name="a", kind="vllm", url="http://a/metrics", gpus=["cp-bm14r7/0"]),
            Target(name="b", kind="vllm", url="http://b/metrics"),
            Target(name="down", kind="vllm", url="http://c/metrics"),
            Target(name="node", kind="dcgm", url="http://d/metrics"),
        ],
    )


@pytest.fixture
def status(config: Config) -> dict:
    sessions = open_store(config.database)
    first = parse_vllm(read(VLLM_032))
    later = copy.deepcopy(first)
    later.counters["generation_tokens"] = (first.counters["generation_tokens"] or 0) + 3000
    later.counters["prompt_tokens"] = (first.counters["prompt_tokens"] or 0) + 15000
    later.counters["preemptions"] = 6
    later.gauges["kv_cache_usage"], later.gauges["requests_running"] = 0.8, 12
    dp = parse_vllm(read(OWN_FIXTURES / "vllm-0.10.2-dp2.prom"))
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        record_replica(session, ids["a"], 1000.0, first)
        record_replica(session, ids["a"], 1030.0, later)
        record_replica(session, ids["b"], 1020.0, dp)
        record_failure(session, ids["down"], 1025.0, "cannot connect: connection refused")
        t4 = parse_dcgm(read(DCGM_T4), default_host="node")
        record_gpus(session, ids["node"], 1000.0, t4)
        t4[0].energy_mj = (t4[0].energy_mj or 0) + 60_000_000
        record_gpus(session, ids["node"], 1030.0, t4)
    with sessions() as session:
        return build_status(session, config, now=1040.0, window=300.0)


def test_every_key_of_the_contract_is_present(status: dict) -> None:
    for replica in status["replicas"]:
        assert contract_keys("replicas") <= set(replica)
    assert contract_keys("replicas") <= set(status["fleet"])
    assert contract_keys("gpus") <= set(status["gpus"][0])
    assert {"generated_at", "window_seconds", "replicas", "fleet", "gpus"} <= set(status)
    assert status["window_seconds"] == 300
    assert status["generated_at"] == "1970-01-01T00:17:20Z"


def test_point_values_are_the_latest_scrape_and_windowed_values_use_every_scrape(
    status: dict,
) -> None:
    a = status["replicas"][0]
    assert a["up"] is True and a["last_error"] is None
    assert a["engine_generation"] == "v1" and a["engines"] == 1 and a["model_names"] == ["tiny"]
    assert a["kv_cache_occupancy"] == 0.8
    assert a["requests_running"] == 12
    assert a["kv_cache_capacity_tokens"] == 2097152
    assert a["generation_tokens_per_second"] == pytest.approx(3000 / 30)
    assert a["prompt_tokens_per_second"] == pytest.approx(15000 / 30)
    assert a["preemptions"] == 6
    assert a["preemptions_per_second"] == pytest.approx(6 / 30)


def test_one_scrape_gives_point_values_but_no_rates(status: dict) -> None:
    b = status["replicas"][1]
    assert b["engine_generation"] == "v1-0.10" and b["engines"] == 2
    assert b["kv_cache_occupancy"] == 0.9 and b["kv_cache_occupancy_mean"] == pytest.approx(0.7)
    assert b["requests_waiting_capacity"] == 3
    assert b["generation_tokens_per_second"] is None
    assert b["preemptions"] is None


def test_a_down_replica_says_why_and_has_nulls_not_zeros(status: dict) -> None:
    down = status["replicas"][2]
    assert down["up"] is False
    assert down["last_error"] == "cannot connect: connection refused"
    assert down["kv_cache_occupancy"] is None and down["requests_running"] is None


def test_the_fleet_sums_queues_and_rates_but_never_a_fraction(status: dict) -> None:
    fleet = status["fleet"]
    assert fleet["up"] is False
    assert fleet["requests_running"] == 12 + 16
    assert fleet["kv_cache_occupancy"] == 0.9  # the fullest replica
    assert fleet["engines"] == 3
    assert fleet["engine_generation"] == "mixed"
    assert fleet["kv_cache_capacity_tokens"] == 2097152 + 262144


def test_gpus_join_their_replica_and_report_energy_over_the_window(status: dict) -> None:
    [gpu] = status["gpus"]
    assert (gpu["host"], gpu["index"], gpu["model"], gpu["replica"]) == (
        "cp-bm14r7",
        0,
        "Tesla T4",
        "a",
    )
    assert gpu["energy_joules"] == pytest.approx(60_000.0)
    assert gpu["xid_error"] is None and gpu["memory_temperature_c"] is None
    # The replica's utilization is work done (GR_ENGINE_ACTIVE), not GPU_UTIL's 91 %.
    assert status["replicas"][0]["gpu_utilization"] == pytest.approx(0.156205)


def test_a_target_not_scraped_for_two_intervals_and_a_grace_is_stale_and_down(
    config: Config, status: dict
) -> None:
    # Scrapes at 1030 (a), 1020 (b), 1025 (down, failed); interval 15 s, grace 15 s: stale
    # after 45 s.
    assert stale_after(config) == 45.0
    assert stale_after(config.model_copy(update={"scrape_interval": 300.0})) == 660.0  # grace ≤ 60
    sessions = open_store(config.database)
    with sessions() as session:
        at_45 = build_status(session, config, now=1065.0, window=300.0)
        fresh = build_status(session, config, now=1066.0, window=300.0)
        later = build_status(session, config, now=1075.5, window=300.0)
        stale_now = stale_targets(session, config, 1075.5)
    assert [(r["name"], r["up"], r["stale"]) for r in fresh["replicas"]] == [
        ("a", True, False),
        ("b", False, True),  # 46 s since its scrape
        ("down", False, False),  # 41 s: down because it failed, not stale
    ]
    assert [(r["name"], r["up"], r["stale"]) for r in later["replicas"]] == [
        ("a", False, True),
        ("b", False, True),
        ("down", False, True),
    ]
    assert at_45["replicas"][1]["stale"] is False  # 45 s is not over 45 s
    assert later["fleet"]["stale"] is True and fresh["fleet"]["up"] is False
    assert stale_now == ["a", "b", "down", "node"]  # the DCGM exporter too (1030)


def test_status_json_says_stale_and_down_and_the_pages_show_it_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamlit.testing.v1 import AppTest
    from typer.testing import CliRunner

    from app.registry import PAGES_DIR
    from kneepoint.cli import app
    from tests.seed import seed

    now = time.time()
    config_file = seed(tmp_path, now - 600, minutes=15)  # its last scrapes ten minutes ago
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config_file))
    result = CliRunner().invoke(app, ["status", "--json", "--config", str(config_file)])
    assert result.exit_code == 0, result.output
    replicas = {r["name"]: r for r in json.loads(result.output)["replicas"]}
    assert replicas["replica-a"]["up"] is False and replicas["replica-a"]["stale"] is True
    at = str(now - 600)  # when they were fresh
    result = CliRunner().invoke(app, ["status", "--json", "--at", at, "--config", str(config_file)])
    fresh = {r["name"]: r for r in json.loads(result.output)["replicas"]}
    assert fresh["replica-a"]["up"] is True and fresh["replica-a"]["stale"] is False

    overview = AppTest.from_file(str(PAGES_DIR / "overview.py"), default_timeout=60).run()
    assert not overview.exception, [e.value for e in overview.exception]
    tiles = [m.value for m in overview.markdown]
    # The tile's name links to the Overview on that replica.
    assert any(
        tile.startswith("[**replica-a**](") and tile.endswith(") :red[● down]") for tile in tiles
    ), tiles
    assert any(c.value.startswith("stale: not scraped since") for c in overview.caption)
    health = AppTest.from_file(str(PAGES_DIR / "health.py"), default_timeout=60).run()
    assert not health.exception, [e.value for e in health.exception]
    targets = health.dataframe[0].value.set_index("Target")  # headers for people
    assert targets.loc["replica-a", "State"] == "● stale"  # stale: counted as down
