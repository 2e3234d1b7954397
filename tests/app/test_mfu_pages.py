"""MFU and MBU on the GPUs and Cost pages: the replica's figure beside DCGM's SM and tensor
activity, and "–" with the reason where vLLM's FLOPs counter is off."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
from app.format import show
from app.registry import PAGES_DIR
from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import parse_vllm
from kneepoint.config import load_config
from kneepoint.derived import flops
from kneepoint.status import build_status
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets, record_gpus, record_replica
from tests.conftest import DCGM_T4, OWN_FIXTURES, VLLM_032, migrated, read


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """`t4` counts its FLOPs on DCGM's Tesla T4 (judged at fp16); `frozen` serves the shared
    0.32 capture, whose FLOPs counter stays at 0 (--enable-mfu-metrics off)."""
    config = tmp_path / "kneepoint.yaml"
    config.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        "targets:\n"
        "  - {name: t4, kind: vllm, url: 'http://127.0.0.1:9/metrics', gpus: [cp-bm14r7/0],"
        " compute_dtype: fp16}\n"
        "  - {name: frozen, kind: vllm, url: 'http://127.0.0.1:9/f', gpu_model: Tesla T4}\n"
        "  - {name: node, kind: dcgm, url: 'http://127.0.0.1:9/d'}\n"
    )
    migrated(config)
    settings = load_config(config, environ={})
    counting = parse_vllm(read(OWN_FIXTURES / "vllm-0.32.0-cpu-mfu-shedding.prom"))
    later = copy.deepcopy(counting)
    for key, grown in (("estimated_flops", 6e14), ("estimated_read_bytes", 5e11)):
        later.counters[key] = (counting.counters[key] or 0.0) + grown
    frozen = parse_vllm(read(VLLM_032))
    frozen_later = copy.deepcopy(frozen)
    frozen_later.counters["generation_tokens"] = (frozen.counters["generation_tokens"] or 0) + 9
    gpus = parse_dcgm(read(DCGM_T4), default_host="node")
    sessions = open_store(settings.database)
    now = time.time()
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in settings.targets])
        record_replica(session, ids["t4"], now - 60, counting)
        record_replica(session, ids["t4"], now - 30, later)
        record_replica(session, ids["frozen"], now - 60, frozen)
        record_replica(session, ids["frozen"], now - 30, frozen_later)
        record_gpus(session, ids["node"], now - 60, gpus)
        record_gpus(session, ids["node"], now - 30, gpus)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    with sessions() as session:
        status = build_status(session, settings, now=now, window=3600.0)
    return {r["name"]: r for r in status["replicas"]}


def shown(page: AppTest, label: str) -> list:
    return [m for m in page.metric if m.label == label]


def test_the_gpus_page_shows_the_replicas_mfu_beside_sm_and_tensor_activity(
    fleet: dict,
) -> None:
    assert fleet["t4"]["mfu"] is not None and fleet["t4"]["mbu"] is not None
    page = AppTest.from_file(str(PAGES_DIR / "gpus.py"), default_timeout=60).run()
    assert not page.exception, [e.value for e in page.exception]
    (mfu,) = shown(page, "MFU")
    assert mfu.value == show(fleet["t4"]["mfu"], "%") and mfu.value != "–"
    (mbu,) = shown(page, "MBU")
    assert mbu.value == show(fleet["t4"]["mbu"], "%")
    assert shown(page, "SM active") and shown(page, "Tensor active")


def test_the_cost_page_shows_mfu_or_why_not(fleet: dict) -> None:
    page = AppTest.from_file(str(PAGES_DIR / "cost.py"), default_timeout=60).run()
    assert not page.exception, [e.value for e in page.exception]
    values = [m.value for m in shown(page, "MFU")]
    assert show(fleet["t4"]["mfu"], "%") in values
    (off,) = [m for m in shown(page, "MFU") if m.value == "–"]
    assert f"No figure: {flops.OFF}." in off.proto.help
    (whole,) = shown(page, "Fleet MFU")
    assert whole.value == show(fleet["t4"]["mfu"], "%")  # the one replica with a figure
