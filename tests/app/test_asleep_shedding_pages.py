"""Load shedding and an asleep engine where an engineer looks: the Overview (fleet tile,
replica tiles, the fleet's status line) and Collector health, on a store seeded from the
real vLLM 0.32 capture: one replica refusing requests, one asleep (weights offloaded, its
counters frozen while requests sit on it), one serving quietly."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
from app.registry import PAGES_DIR
from collectors.engines.vllm import parse_vllm
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets, record_replica
from tests.conftest import VLLM_032, migrated, read

STEPS, STEP = 6, 30.0
REFUSED, FINISHED = 2.0, 6.0  # per step on the shedding replica


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "kneepoint.yaml"
    config.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        "scrape_interval: 30s\n"
        "targets:\n"
        "  - {name: shedder, kind: vllm, url: 'http://127.0.0.1:9/a'}\n"
        "  - {name: sleeper, kind: vllm, url: 'http://127.0.0.1:9/b'}\n"
        "  - {name: quiet, kind: vllm, url: 'http://127.0.0.1:9/c'}\n"
    )
    migrated(config)
    settings = load_config(config, environ={})
    base = parse_vllm(read(VLLM_032))
    sessions = open_store(settings.database)
    now = time.time()
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in settings.targets])
        for step in range(STEPS):
            ts = now - 5 - (STEPS - 1 - step) * STEP
            for name in ids:
                sample = copy.deepcopy(base)
                tokens = 0 if name == "sleeper" else 100.0 * step
                for key in ("prompt_tokens", "generation_tokens"):
                    sample.counters[key] = (base.counters[key] or 0) + tokens
                if name == "shedder":
                    sample.counters["admission_rejections"] = REFUSED * step
                    sample.counters["requests_finished_stop"] = FINISHED * step
                if name == "sleeper":  # asleep with requests on it: frozen on purpose
                    sample.gauges["sleep_level"] = 1.0
                    sample.gauges["requests_running"] = 2.0
                record_replica(session, ids[name], ts, sample)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    return config


def _run(page: str) -> AppTest:
    app = AppTest.from_file(str(PAGES_DIR / page), default_timeout=60).run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def test_the_overview_shows_shedding_and_the_asleep_replica(fleet: Path) -> None:
    page = _run("overview.py")
    texts = [m.value for m in page.markdown]
    # The fleet's status line counts the asleep replica as a note, not a problem.
    status = next(m for m in texts if m.startswith("#### "))
    assert "1 replica asleep" in status
    assert "stalled" not in status and "Down" not in status
    # The asleep replica: its tile and its line say asleep, never stalled, down or idle.
    tile = next(m for m in texts if m.startswith("[**sleeper**]"))
    assert "asleep (weights offloaded)" in tile
    assert not any(word in tile for word in ("stalled", "down", "idle"))
    assert any(m.startswith(":blue-badge[asleep (weights offloaded)] **sleeper**") for m in texts)
    assert not any("**sleeper**" in m and ":red-badge" in m for m in texts)
    # Shedding: the fleet tile and the refusing replica, in red; by hand, 2 refused and 6
    # finished per 30 s step: 2 ÷ 30 s refused per second, 2 ÷ (6 + 2) of the requests.
    per_second, share = REFUSED / STEP, REFUSED / (FINISHED + REFUSED)
    expected = f"{per_second:,.2f}/s ({share:.1%})"
    fleet_tile = next(m for m in page.metric if m.label == "Requests refused")
    assert fleet_tile.value == expected
    assert f":red[● refusing requests: {expected}]" in texts
    refusing = [m for m in texts if m.startswith(":red[● refusing")]
    assert len(refusing) == 1  # the shedder's alone
    # The others refuse nothing (no request finished either: no share).
    assert sum(c.value == "Refused: 0.00/s" for c in page.caption) == 2


def test_collector_health_names_the_asleep_replica_asleep(fleet: Path) -> None:
    page = _run("health.py")
    (table,) = [d.value for d in page.dataframe if "Target" in d.value.columns]
    states = dict(zip(table["Target"], table["State"], strict=True))
    assert "asleep (weights offloaded)" in str(states["sleeper"])
    assert str(states["quiet"]).endswith("up")
    assert str(states["shedder"]).endswith("up")
