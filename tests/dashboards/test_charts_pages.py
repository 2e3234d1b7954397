"""Every chart on every page, as the app renders it on a seeded store: a title, axis titles
with their unit, the PNG named after it, and a CSV button beside it."""

from __future__ import annotations

import base64
import copy
import json
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
from app.registry import PAGES_DIR
from collectors.engines.vllm import parse_vllm
from kneepoint.config import load_config
from kneepoint.knee.runs import Point, Run
from kneepoint.store.db import open_store
from kneepoint.store.runs import save_run
from kneepoint.store.writer import ensure_targets, record_replica
from tests.conftest import OWN_FIXTURES, read
from tests.seed import seed

UNIT = re.compile(r"\S.* \(.+\)$")
SOURCES = {path: path.read_text() for path in sorted(PAGES_DIR.glob("*.py"))}
# Pages whose charts come after a calibration and a button: tests/app/test_whatif_page.py
# checks each of their charts' title, units and CSV button.
ACTION_FIRST = {"whatif"}
CHART_PAGES = [
    path for path, text in SOURCES.items() if "chart(" in text and path.stem not in ACTION_FIRST
]


@pytest.fixture
def seeded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    now = time.time()
    config = seed(tmp_path, now)
    # A replica drafting speculative tokens (the seed's do not), for that page's charts.
    config.write_text(
        config.read_text()
        + '  - {name: replica-spec, kind: vllm, url: "http://127.0.0.1:9/spec", timeout: 2s}\n'
    )
    settings = load_config(config)
    sessions = open_store(settings.database)
    drafting = parse_vllm(read(OWN_FIXTURES / "vllm-0.32.0-cpu-ngram-spec-decode.prom"))
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in settings.targets])
        for step in range(1, 21):
            sample = copy.deepcopy(drafting)
            sample.counters["spec_decode_drafts"] = 100.0 * step
            sample.counters["spec_decode_draft_tokens"] = 300.0 * step
            sample.counters["spec_decode_accepted_tokens"] = 180.0 * step
            sample.accepted_per_position = [90.0 * step, 60.0 * step, 30.0 * step]
            record_replica(session, ids["replica-spec"], now - 300 + step * 15, sample)
        for label, scale in (("big", 1.0), ("small", 0.1)):
            steps = {1: 60.0, 4: 230, 16: 800, 64: 1420, 128: 1450}
            points = tuple(Point(c, t * scale, ttft_p99_seconds=0.02 * c) for c, t in steps.items())
            save_run(session, Run(label, "m", "vllm-bench", points), 1.0)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    return config


def values(encoded: list[float] | dict[str, str]) -> list[float]:
    """A trace's values as the page sent them (Plotly writes arrays as base64 and a dtype)."""
    if isinstance(encoded, dict):
        return np.frombuffer(base64.b64decode(encoded["bdata"]), dtype=encoded["dtype"]).tolist()
    return list(encoded)


def test_pages_show_charts_only_through_the_helper() -> None:
    """st.plotly_chart directly would lose the PNG name and the CSV button."""
    direct = [path.name for path, text in SOURCES.items() if "plotly_chart(" in text]
    assert not direct
    assert len(CHART_PAGES) >= 5


@pytest.mark.parametrize("page", CHART_PAGES, ids=lambda path: path.stem)
def test_every_chart_reads_and_downloads(seeded: Path, page: Path) -> None:
    app = AppTest.from_file(str(page), default_timeout=90).run()
    assert not app.exception, [e.value for e in app.exception]
    shown = app.get("plotly_chart")
    assert shown, f"{page.stem}: no chart on the seeded store"
    for element in shown:
        spec = json.loads(element.proto.spec)
        layout = spec["layout"]
        title = (layout.get("title") or {}).get("text")
        assert title, f"{page.stem}: a chart without a title"
        # Named categories ("measured", "predicted") on x have no unit to give.
        xs = [x for t in spec["data"] if isinstance(t.get("x"), list) for x in t["x"]]
        categories = bool(xs) and all(isinstance(x, str) for x in xs)
        if categories:  # times come as ISO strings too
            times = pd.to_datetime(pd.Series(xs), errors="coerce", utc=True, format="ISO8601")
            categories = bool(times.isna().any())
        for axis in ("yaxis",) if categories else ("xaxis", "yaxis"):
            text = ((layout.get(axis) or {}).get("title") or {}).get("text") or ""
            assert UNIT.match(text), f"{page.stem} / {title}: {axis} {text!r} has no (unit)"
        options = json.loads(element.proto.config).get("toImageButtonOptions") or {}
        assert options.get("format") == "png" and options.get("filename"), title
    csv = [b for b in app.get("download_button") if b.proto.label == "CSV"]
    assert len(csv) == len(shown), f"{page.stem}: a CSV button per chart"


def test_the_knee_page_shows_each_run_against_its_own_peak_or_all_in_tok_s(seeded: Path) -> None:
    page = str(PAGES_DIR / "knee.py")
    app = AppTest.from_file(page, default_timeout=90).run()
    app.multiselect[0].set_value(["big", "small"]).run()

    def chart() -> tuple[str, dict[str, float]]:
        (shown,) = app.get("plotly_chart")
        spec = json.loads(shown.proto.spec)
        tops = {
            t["name"]: max(values(t["y"]))
            for t in spec["data"]
            if t["name"].startswith(("big:", "small:")) and t.get("yaxis") != "y2"
        }
        return spec["layout"]["yaxis"]["title"]["text"], tops

    axis, tops = chart()
    assert "% of the run's peak" in axis
    assert tops == {"big: % of peak": pytest.approx(1.0), "small: % of peak": pytest.approx(1.0)}
    (scale,) = [r for r in app.radio if r.label == "Throughput axis"]
    scale.set_value("shared").run()
    assert not app.exception, [e.value for e in app.exception]
    axis, tops = chart()
    assert axis == "throughput (output tok/s)"
    assert tops["small: tok/s"] < tops["big: tok/s"] / 5
