"""The Knee points page on a seeded store with workshop runs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import actions
from app.registry import PAGES_DIR
from kneepoint.config import load_config
from kneepoint.knee.runs import Point, Run
from kneepoint.store.db import open_store
from kneepoint.store.runs import load_runs, save_run
from tests.seed import seed

PAGE = str(PAGES_DIR / "knee.py")


def run(label: str, steps: dict[int, float]) -> Run:
    points = tuple(Point(c, t, ttft_p99_seconds=0.05 * c) for c, t in steps.items())
    return Run(label, "Qwen/Qwen3-4B", "vllm-bench", points)


@pytest.fixture
def seeded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = seed(tmp_path, time.time())
    (tmp_path / "kneepoint.yaml").write_text(
        config.read_text() + "slos: [{name: ttft, metric: ttft, threshold: 2s, objective: 0.99}]\n"
    )
    sessions = open_store(load_config(config).database)
    with sessions.begin() as session:
        save_run(session, run("bf16", {1: 37.5, 32: 714, 64: 800}), 1.0)
        save_run(session, run("fp8", {1: 53.4, 32: 1014, 64: 1140}), 2.0)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    return config


def test_runs_knees_and_the_production_headroom(seeded: Path) -> None:
    app = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not app.exception, [e.value for e in app.exception]
    summary = app.dataframe[0].value
    assert list(summary["run"]) == ["bf16", "fp8"]
    assert list(summary["knee"]) == [32, 32]
    assert list(summary["recommended"]) == [32, 32]  # 1.6 s p99 TTFT at 32 meets 2 s
    app.selectbox[0].select("replica-a").run()
    summary = app.dataframe[0].value
    # The seed runs replica-a at 0..31 running requests: peak 31, one step of headroom.
    assert list(summary["production peak"]) == [31, 31]
    assert list(summary["headroom to knee"]) == [1, 1]
    assert app.metric[0].value == "better"  # compare: fp8 (last) against bf16 (first)
    compared = app.dataframe[1].value  # a Styler (app/tables.py): its frame has the headers
    frame = getattr(compared, "data", compared)
    assert list(frame.columns) == [
        "Concurrency (requests)",
        "Baseline (tok/s)",
        "Candidate (tok/s)",
        "Throughput (× baseline)",
        "TTFT change",
        "ITL change",
        "Verdict",
    ]
    assert list(frame["Throughput (× baseline)"]) == pytest.approx(
        [53.4 / 37.5, 1014 / 714, 1140 / 800]
    )


def test_deleting_a_run(seeded: Path) -> None:
    app = AppTest.from_file(PAGE, default_timeout=60).run()
    app.selectbox(key="delete-run").select("bf16").run()
    app.button[0].click().run()
    assert not app.exception, [e.value for e in app.exception]
    sessions = open_store(load_config(seeded).database)
    assert [r.label for r in load_runs(sessions())] == ["fp8"]


def test_importing_uploaded_files_keeps_nothing_of_a_bad_one(seeded: Path) -> None:
    good = {"label": "up", "model_id": "m", "max_concurrency": 4, "output_throughput": 99.0}
    stored, refused = actions.import_results(
        [("good.json", json.dumps(good).encode()), ("bad.json", b'{"output_throughput": 1}')]
    )
    assert [(r.label, r.points[0].concurrency) for r in stored] == [("up", 4)]
    assert refused == [
        "bad.json: field 'max_concurrency' is missing: a concurrency step needs its concurrency"
    ]
    sessions = open_store(load_config(seeded).database)
    assert [r.label for r in load_runs(sessions())] == ["bf16", "fp8", "up"]


def test_no_runs_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(seed(tmp_path, time.time(), minutes=2)))
    app = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not app.exception
    assert "No runs yet" in app.info[0].value
