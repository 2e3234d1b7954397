"""The weekly report from the demo's backfilled week: files written, numbers those of
`kneepoint status --json` for the same window, recommendations backed by the week."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kneepoint.cli import app
from review.render import value

WEEK = 7 * 86400


@pytest.fixture(scope="module")
def written(demo_week: tuple[Path, float]) -> tuple[Path, Path, str]:
    config_file, now = demo_week
    out = config_file.parent / "reports"
    result = CliRunner().invoke(
        app, ["report", "--config", str(config_file), "--out", str(out), "--at", str(now)]
    )
    assert result.exit_code == 0, result.output
    html_file, md_file = sorted(out.glob("kneepoint-report-*.html")), sorted(out.glob("*.md"))
    assert len(html_file) == len(md_file) == 1
    return html_file[0], md_file[0], result.output


def test_the_report_s_numbers_are_those_of_status_for_the_same_window(
    demo_week: tuple[Path, float], written: tuple[Path, Path, str]
) -> None:
    config_file, now = demo_week
    result = CliRunner().invoke(
        app,
        ["status", "--json", "--window", "7d", "--at", str(now), "--config", str(config_file)],
    )
    status = json.loads(result.output)
    summary = written[1].read_text()
    page = written[0].read_text()
    fleet = status["fleet"]
    assert fleet["generation_tokens_per_second"] > 0
    row = f"| Throughput | {value(fleet['generation_tokens_per_second'], 'tok/s')} |"
    assert row in summary, row
    assert f"| Prefix hit rate | {value(fleet['prefix_cache_hit_rate'], '%')} |" in summary
    assert f"| True $/1M tokens | {value(fleet['cost_per_million_tokens'], '$')} |" in summary
    for replica in status["replicas"]:
        section = summary.split(f"## {replica['name']}\n", 1)[1]
        rate = value(replica["prefix_cache_hit_rate"], "%")
        assert f"| Prefix hit rate | {rate} |" in section, replica["name"]
        assert f"<td>{value(replica['generation_tokens_per_second'], 'tok/s')}</td>" in page


def test_the_week_s_evidence_brings_its_recommendations(written: tuple[Path, Path, str]) -> None:
    summary = written[1].read_text()
    recommendations = summary.split("## Recommendations", 1)[1].split("## Fleet", 1)[0]
    # The twin deploys a new prompt every day at 10:00: hit rates drop and prefill bursts.
    assert "fleet: Prefix-cache hits are lost to routing" in recommendations
    assert "fleet: Prefill storms follow prompt or tool deploys" in recommendations
    assert re.search(r"prefill burst at \w{3} 10:0\d", recommendations)
    # The L4 replica runs near KV saturation at its peak and preempts.
    assert "qwen3-4b-l4: The KV cache is the limit" in recommendations
    # The drafter on llama-8b-b accepts 70 %: it pays, so nothing says to drop it.
    assert "drafter" not in recommendations
    drafter = summary.split("## llama-8b-b\n", 1)[1].split("\n## ", 1)[0]
    assert "| Speculative decoding | paying off |" in drafter
    assert "recommendations" in written[2]
    # The drops and storms themselves are listed with their times, recommendation or not.
    fleet = summary.split("## Fleet", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"- Hit rate fell to \d+% \(from \d+%\) at \w{3} [\d-]{10} 10:0\d UTC", fleet)
    assert re.search(r"- Prefill storm: [\d,]+ computed prompt tokens/s", fleet)


def test_the_html_is_self_contained(written: tuple[Path, Path, str]) -> None:
    page = written[0].read_text()
    assert not re.search(r"<script[^>]+src=|<link|@import|url\(\s*['\"]?http", page)
    assert page.count('class="plotly-graph-div"') == 3
    assert page.count("plotly.js v") <= 2  # Plotly's bundle inlined once (its banner)
