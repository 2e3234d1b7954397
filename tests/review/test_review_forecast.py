"""The weekly review's headroom forecast: one line per replica saying when its daily peak
reaches its knee (with the range) or why there is no date."""

from __future__ import annotations

import copy
import html
from pathlib import Path

from collectors.engines.vllm import parse_vllm
from kneepoint import forecast
from kneepoint.config import load_config
from kneepoint.knee.runs import Point, Run
from kneepoint.store.db import connect_store
from kneepoint.store.runs import save_run
from kneepoint.store.writer import ensure_targets, record_replica
from review.render import html_report, markdown
from review.report import build_report
from tests.conftest import VLLM_032, migrated, read

DAY = forecast.DAY
START = 1_780_000_000.0 // DAY * DAY
KNEE, DAYS = 32, 10
GROWTH = {"growing": 2.0, "steady": 0.0}  # requests per day added to the daily peak


def test_the_review_carries_each_replica_s_forecast(tmp_path: Path) -> None:
    config_file = tmp_path / "kneepoint.yaml"
    config_file.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\ntargets:\n"
        + "".join(f"  - {{name: {n}, kind: vllm, url: 'http://127.0.0.1:9/{n}'}}\n" for n in GROWTH)
    )
    migrated(config_file)
    config = load_config(config_file)
    sessions = connect_store(config.database)
    sample = parse_vllm(read(VLLM_032))
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for name, growth in GROWTH.items():
            for day in range(DAYS):
                for hour in range(0, 24, 2):
                    row = copy.deepcopy(sample)
                    peak = 8.0 + growth * day + (day % 2) * 0.5
                    row.gauges["requests_running"] = peak if hour == 14 else 1.0
                    row.gauges["requests_waiting"] = 0.0
                    record_replica(session, ids[name], START + day * DAY + hour * 3600, row)
            points = tuple(Point(c, 40.0 * min(c, KNEE) + 0.01 * c) for c in (1, 8, KNEE, 64, 128))
            save_run(session, Run(f"{name}-sweep", "m", "sweep", points), START)
    now = START + DAYS * DAY + 3600
    with sessions() as session:
        report = build_report(session, config, now, 7 * DAY)
    by_name = {f.replica: f for f in report.forecasts}
    assert set(by_name) == set(GROWTH)
    assert by_name["growing"].verdict == forecast.CROSSES and by_name["growing"].crossing
    assert by_name["steady"].verdict == forecast.FLAT and by_name["steady"].crossing is None
    summary = markdown(report)
    section = summary.split("## Headroom forecast\n", 1)[1].split("\n## ", 1)[0]
    page = html_report(report)
    assert "<h2>Headroom forecast</h2>" in page
    for outlook in report.forecasts:
        assert f"- {outlook.replica}: {outlook.note}" in section
        assert html.escape(outlook.note) in page
    assert forecast._date(by_name["growing"].crossing) in section
