"""Sweeps over real HTTP against the fleet twin: the knee must fall where the twin's physics
puts it (the scheduler's cap of running sequences), and failures must be counted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kneepoint.cli import app
from kneepoint.knee.detect import assess
from kneepoint.knee.sweep import SweepSettings, sweep
from kneepoint.twin.fleet import Fleet, single_replica
from tests.conftest import free_port, migrated

pytestmark = pytest.mark.timeout(300)
MODEL = "Qwen/Qwen3-4B"
SPEED = 8.0  # engine seconds per wall second: the physics is the same, the test is shorter


@pytest.fixture
def twin(request: pytest.FixtureRequest) -> Iterator[str]:
    spec = single_replica("rtx4000ada", "qwen3-4b", 0, 0, max_num_seqs=request.param)
    fleet = Fleet(spec.model_copy(update={"speed": SPEED})).start()
    yield fleet.url("qwen3-4b")
    fleet.stop()


@pytest.mark.parametrize("twin", [8, 16], indirect=True, ids=["max_num_seqs=8", "max_num_seqs=16"])
def test_the_knee_falls_at_the_twins_running_cap(twin: str, request: pytest.FixtureRequest) -> None:
    cap = request.node.callspec.params["twin"]
    settings = SweepSettings(
        url=twin,
        model=MODEL,
        ladder=(1, 2, 4, 8, 16, 32),
        output_tokens=64,
        metrics_url=f"{twin}/metrics",
    )
    run = sweep(settings, "twin")
    result = assess(run)
    figures = {p.concurrency: round(p.output_tokens_per_second) for p in run.points}
    assert result.knee_concurrency == cap, figures
    assert all(p.errors == 0 for p in run.points)
    by_step = {p.concurrency: p for p in run.points}
    # Past the cap, requests wait for a slot: the server said so, and TTFT grew with it.
    assert (by_step[32].server["requests_waiting_peak"] or 0) > 0
    assert by_step[32].server["requests_running_peak"] == cap
    assert (by_step[1].server["requests_waiting_peak"] or 0) == 0
    assert by_step[32].ttft_p50_seconds > 2 * by_step[cap].ttft_p50_seconds  # type: ignore[operator]
    # Alone, the twin decodes at the workshop's single-stream rate (×SPEED): 37.5 tok/s ±25 %.
    alone = by_step[1].output_tokens_per_second / SPEED
    assert 37.5 * 0.75 <= alone <= 37.5 * 1.25, figures
    assert by_step[1].client_cpu_cores is not None and by_step[1].client_cpu_cores < 1


def test_failures_are_counted_and_a_dead_server_stores_nothing(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    run = sweep(SweepSettings(url=dead, model=MODEL, ladder=(1, 2), requests_per_step=3), "x")
    assert [(p.completed, p.errors) for p in run.points] == [(0, 3), (0, 3)]
    assert run.points[0].ttft_mean_seconds is None

    config = tmp_path / "kneepoint.yaml"
    config.write_text(f"database: sqlite:///{tmp_path / 'k.db'}\n")
    migrated(config)
    result = CliRunner().invoke(
        app,
        ["sweep", "--url", dead, "--model", MODEL, "--concurrency", "1", "--config", str(config)],
    )
    assert result.exit_code == 1
    assert "failed (ClientConnectorError: Cannot connect to host" in result.output
    assert "nothing stored" in result.output and "warning" not in result.output
    listed = CliRunner().invoke(app, ["knee", "--json", "--config", str(config)])
    assert json.loads(listed.output) == {"runs": []}


@pytest.mark.parametrize("twin", [256], indirect=True)
def test_sweep_command_stores_a_run_that_knee_and_compare_read(twin: str, tmp_path: Path) -> None:
    config = tmp_path / "kneepoint.yaml"
    config.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        "slos: [{name: ttft-fast, metric: ttft, threshold: 5s, objective: 0.99}]\n"
    )
    migrated(config)
    base = ["--url", twin, "--model", MODEL, "--concurrency", "1,2", "--requests", "2"]
    common = ["--output-tokens", "16", "--config", str(config)]
    first = CliRunner().invoke(app, ["sweep", *base, *common, "--label", "a", "--json"])
    assert first.exit_code == 0, first.output
    swept = json.loads(first.output[first.output.index("{") :])
    assert swept["label"] == "a" and [p["completed"] for p in swept["points"]] == [2, 2]
    wrong = CliRunner().invoke(app, ["sweep", *base, *common, "--label", "b", "--model", "nope"])
    assert wrong.exit_code == 1  # the server refuses an unknown model: 400 on every request
    second = CliRunner().invoke(app, ["sweep", *base, *common, "--label", "b", "--capture-metrics"])
    assert second.exit_code == 0, second.output
    compared = CliRunner().invoke(app, ["compare", "a", "b", "--json", "--config", str(config)])
    assert compared.exit_code == 0, compared.output
    steps = json.loads(compared.output)["steps"]
    assert [s["concurrency"] for s in steps] == [1, 2]
    missing = CliRunner().invoke(app, ["compare", "a", "zzz", "--config", str(config)])
    assert missing.exit_code == 2 and "no run labelled 'zzz'" in missing.output


@pytest.mark.parametrize("twin", [256], indirect=True)
def test_tokens_come_from_the_usage_chunk_and_only_token_chunks_are_timed(twin: str) -> None:
    run = sweep(
        SweepSettings(url=twin, model=MODEL, ladder=(2,), requests_per_step=4, output_tokens=9),
        "usage",
    )
    (point,) = run.points
    assert point.completed == 4 and point.errors == 0
    assert point.output_tokens_per_second * point.duration_seconds == pytest.approx(4 * 9)  # type: ignore[operator]
    # One chunk per engine step and no spec decode: 9 tokens → 8 gaps per request.
    assert point.itl_mean_seconds is not None
