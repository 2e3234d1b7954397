"""The Prefix cache page's hit rate by tier and the Overview tile's LoRA adapters and
corrupted requests, from a store seeded with the real vLLM 0.32 capture."""

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


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "kneepoint.yaml"
    config.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        "targets:\n  - {name: tiered, kind: vllm, url: 'http://127.0.0.1:9/metrics'}\n"
    )
    migrated(config)
    settings = load_config(config, environ={})
    first = parse_vllm(read(VLLM_032))
    first.counters["corrupted_requests"] = 0.0
    later = copy.deepcopy(first)
    # 10,000 prompt tokens more, 3,000 of them from the GPU's cache and 1,000 from the CPU's.
    later.counters["prompt_tokens"] = (first.counters["prompt_tokens"] or 0) + 10000
    later.counters["prompt_tokens_cached_device"] = (
        first.counters["prompt_tokens_cached_device"] or 0
    ) + 3000
    later.counters["prompt_tokens_cached_host"] = 1000.0
    later.counters["corrupted_requests"] = 3.0
    later.lora = {"running": ["sql"], "waiting": ["code"], "max_lora": 2}
    sessions = open_store(settings.database)
    now = time.time()
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in settings.targets])
        record_replica(session, ids["tiered"], now - 60.0, first)
        record_replica(session, ids["tiered"], now - 30.0, later)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    return config


def test_the_prefix_cache_page_shows_the_hit_rate_by_tier(fleet: Path) -> None:
    page = AppTest.from_file(str(PAGES_DIR / "prefix_cache.py"), default_timeout=60).run()
    assert not page.exception, [e.value for e in page.exception]
    assert any(h.value == "Hit rate by tier" for h in page.subheader)
    tables = [d.value for d in page.dataframe if "GPU" in d.value.columns]
    (table,) = tables
    rows = table.set_index("Replica")
    assert str(rows.loc["tiered", "GPU"]).startswith("30")  # 3,000 ÷ 10,000
    assert str(rows.loc["tiered", "CPU offload"]).startswith("10")  # 1,000 ÷ 10,000
    assert "fleet" in rows.index


def test_the_overview_tile_lists_lora_adapters_and_corrupted_requests(fleet: Path) -> None:
    page = AppTest.from_file(str(PAGES_DIR / "overview.py"), default_timeout=60).run()
    assert not page.exception, [e.value for e in page.exception]
    assert any("LoRA: running sql · waiting code · max 2" in c.value for c in page.caption)
    assert any("3 corrupted requests" in m.value for m in page.markdown)
