"""Pages of a replica whose engine does not expose some numbers: "–" with the reason as the
metric's help, never a 0, and the engine named."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
from app.registry import PAGES_DIR
from collectors.engines.sglang import parse_sglang
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets, record_replica
from tests.conftest import OWN_FIXTURES, migrated, read


@pytest.fixture
def sglang_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "kneepoint.yaml"
    config.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        "targets:\n  - {name: sglang-old, kind: sglang, url: 'http://127.0.0.1:9/metrics'}\n"
    )
    migrated(config)
    settings = load_config(config, environ={})
    sample = parse_sglang(read(OWN_FIXTURES / "sglang-0.4.6.prom"))
    assert sample.unavailable["preemptions"] and sample.unavailable["kv_cache_capacity_tokens"]
    sessions = open_store(settings.database)
    now = time.time()
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in settings.targets])
        for ago in (60.0, 30.0):
            record_replica(session, ids["sglang-old"], now - ago, sample)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    return config


def metric(page: AppTest, label: str):  # type: ignore[no-untyped-def]
    (found,) = [m for m in page.metric if m.label == label]
    return found


def test_capacity_shows_a_dash_and_why_for_what_sglang_does_not_expose(
    sglang_fleet: Path,
) -> None:
    page = AppTest.from_file(str(PAGES_DIR / "capacity.py"), default_timeout=60).run()
    assert not page.exception, [e.value for e in page.exception]
    for label in ("Capacity", "Preemptions / s"):
        shown = metric(page, label)
        assert shown.value == "–"
        assert shown.proto.help.startswith("Not exposed by SGLang before 0.5.10")
    occupancy = metric(page, "KV occupancy")
    assert occupancy.value != "–"
    assert not occupancy.proto.help.startswith("Not exposed")
    assert any(c.value == "SGLang 0.4.6" for c in page.caption)


def test_the_overview_names_the_engine(sglang_fleet: Path) -> None:
    page = AppTest.from_file(str(PAGES_DIR / "overview.py"), default_timeout=60).run()
    assert not page.exception, [e.value for e in page.exception]
    assert any("SGLang 0.4.6" in c.value for c in page.caption)
    assert metric(page, "Running").value != "–"
