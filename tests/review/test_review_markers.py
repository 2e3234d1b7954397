"""The weekly review's charts mark the week's timeline, as every chart of the app does: a
store with a replica's scrapes and deploy markers posted with `kneepoint annotate`, one in
the week and one before it; the report built from it, its figures read."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from collectors.engines.vllm import parse_vllm
from dashboards.charts import CHANGES
from kneepoint.cli import app
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets, record_replica
from review.render import figures, html_report
from review.report import build_report
from tests.conftest import VLLM_032, migrated, read

WEEK = 7 * 86400.0
STEP = 300.0


def annotate(config_file: Path, text: str, at: float) -> None:
    result = CliRunner().invoke(
        app,
        ["annotate", "--config", str(config_file), "--replica", "r", "--text", text,
         "--at", str(at)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output


def test_each_review_chart_marks_the_week_s_changes_and_only_those(tmp_path: Path) -> None:
    config_file = tmp_path / "kneepoint.yaml"
    config_file.write_text(f"""
database: sqlite:///{tmp_path / "k.db"}
targets:
  - {{name: r, kind: vllm, url: "http://127.0.0.1:9/metrics"}}
""")
    migrated(config_file)
    config = load_config(config_file)
    now = float(int(time.time()))
    base = parse_vllm(read(VLLM_032))
    times = [now - 3 * 3600 + i * STEP for i in range(int(3 * 3600 // STEP) + 1)]
    with open_store(config.database).begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for i, ts in enumerate(times):
            sample = copy.deepcopy(base)
            sample.gauges["requests_running"] = float(i % 5)
            record_replica(session, ids["r"], ts, sample)
    inside = times[len(times) // 2]
    annotate(config_file, "prompt v42", inside)
    annotate(config_file, "prompt v41", now - WEEK - 3600)  # before the week

    with open_store(config.database)() as session:
        report = build_report(session, config, now, WEEK)
    charts = figures(report)
    assert charts
    for figure in charts:
        title = figure.layout.title.text
        assert any(t.name == "r" for t in figure.data), title  # the replica's line is drawn
        (changes,) = [t for t in figure.data if t.name == CHANGES]
        (text,) = changes.text  # the annotation's detail also names who posted it
        assert text.startswith("annotation on r: prompt v42"), title
        assert [pd.Timestamp(x) for x in changes.x] == [pd.Timestamp(inside, unit="s", tz="UTC")]
        assert list(changes.customdata) == ["annotation"]
        lines = [s for s in figure.layout.shapes if s.type == "line" and s.line.dash == "dot"]
        assert len(lines) == 1, title
    # The HTML file carries them too: the marker's hover text is in its figures' data.
    assert "annotation on r: prompt v42" in html_report(report)
    assert "prompt v41" not in html_report(report)
