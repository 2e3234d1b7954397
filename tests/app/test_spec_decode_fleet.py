"""The Speculative decoding page in a fleet where few replicas draft: the view of a fleet
builds no per-replica series (kneepoint/views.py), so the page's chart must come from the
database whatever the number of drafting replicas (it raised KeyError on 35fae60)."""

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
from tests.conftest import VLLM_032, read

REPLICAS = 10  # over the fleet threshold (8)


@pytest.mark.parametrize("drafting", [0, 3])
def test_a_fleet_with_few_drafting_replicas_shows_its_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, drafting: int
) -> None:
    config = tmp_path / "kneepoint.yaml"
    targets = "".join(
        f'  - {{name: r{i}, kind: vllm, url: "http://127.0.0.1:9/{i}"}}\n' for i in range(REPLICAS)
    )
    config.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\nscrape_interval: 15s\ntargets:\n{targets}"
    )
    settings = load_config(config)
    sessions = open_store(settings.database)
    base = parse_vllm(read(VLLM_032))
    plain = copy.deepcopy(base)
    for key in [k for k in plain.counters if k.startswith("spec_decode")]:
        del plain.counters[key]
    now = time.time()
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in settings.targets])
        for step in range(4):
            for i in range(REPLICAS):
                sample = copy.deepcopy(base if i < drafting else plain)
                for key in sample.counters:
                    sample.counters[key] = (sample.counters[key] or 0.0) + 100.0 * step
                record_replica(session, ids[f"r{i}"], now - 60 + step * 15, sample)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    app = AppTest.from_file(str(PAGES_DIR / "spec_decode.py"), default_timeout=120)
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    if drafting:
        shown = [h.value for h in app.subheader]
        assert sum(name.startswith("r") for name in shown) == drafting, shown
    else:
        assert any("No replica ran speculative decoding" in i.value for i in app.info)
