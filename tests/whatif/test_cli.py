"""`kneepoint calibrate` and `kneepoint whatif` on a stored day of a twin replica: the JSON
contract (docs/explanation/whatif.md) and a clear error, exit 2, for each kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from kneepoint.cli import app
from kneepoint.config import load_config
from kneepoint.knee.runs import Point, Run
from kneepoint.store.db import connect_store
from kneepoint.store.runs import load_runs, save_run
from tests.whatif.conftest import REPLICA

pytestmark = pytest.mark.timeout(900)
DAY = 86400.0
CONTRACT = (
    "preemptions",
    "generation_tokens_per_second",
    "ttft_p99_seconds",
    "kv_cache_occupancy_p95",
    "cost_per_million_tokens",
)


def invoke(config_file: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--config", str(config_file)])
    return result.exit_code, result.output


def test_calibrate_then_whatif_json(stored_day: tuple[Path, float]) -> None:
    config_file, now = stored_day
    at = str(now)
    code, out = invoke(
        config_file, "calibrate", "--replica", REPLICA, "--since", "1d", "--at", at, "--json"
    )
    assert code == 0, out
    profile = json.loads(out)
    assert profile["replica"] == REPLICA
    assert profile["run_label"] == f"{REPLICA}-sweep"
    assert profile["fit"]["trusted"] is True
    assert profile["fit"]["threshold"] == pytest.approx(0.2)
    assert all(abs(p["relative_error"]) < 0.2 for p in profile["fit"]["points"])
    assert profile["cost"]["weight_read_seconds"] > 0

    code, out = invoke(
        config_file,
        "whatif",
        "--replica",
        REPLICA,
        "--set",
        "kv_cache_dtype=fp8",
        "--since",
        "1d",
        "--slice",
        "5",
        "--at",
        at,
        "--json",
    )
    assert code == 0, out
    report = json.loads(out)
    assert report["replica"] == REPLICA
    assert report["change"] == {"kv_cache_dtype": "fp8"}
    for side in ("measured", "baseline", "predicted"):
        for key in CONTRACT:
            assert isinstance(report[side][key], (int, float)), (side, key)
    for side in ("baseline", "predicted"):
        for key in CONTRACT:
            low, high = report[side]["bounds"][key]
            assert low <= report[side][key] <= high, (side, key)
    assert report["predicted"]["preemptions"] < report["baseline"]["preemptions"]
    assert report["calibration"]["trusted"] is True
    # Every stored bucket replayed, lengths from the twin's stored length histograms; the
    # scheduler flags no scrape gives, and the calibrate command was not given, are named.
    assert report["replay"]["buckets"] == report["load"]["buckets"] >= 90
    assert report["replay"]["slice_seconds"] == 5
    assert report["replay"]["lengths_from_histograms"] == pytest.approx(1.0)
    assumed = report["calibration"]["assumed"]
    assert {"max_num_seqs", "max_model_len", "max_num_batched_tokens"} <= set(assumed)
    assert set(report["baseline_error"]) >= set(CONTRACT) - {"cost_per_million_tokens"}

    code, out = invoke(config_file, "calibrate", "--replica", REPLICA, "--since", "1d", "--at", at)
    assert code == 0, out
    assert "trusted" in out and "throughput" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("whatif", "--replica", REPLICA, "--set", "colour=blue"), "unknown change 'colour'"),
        (("whatif", "--replica", REPLICA, "--set", "max_num_seqs=lots"), "expected an integer"),
        (("whatif", "--replica", REPLICA), "give at least one change"),
        (("whatif", "--replica", "nope", "--set", "replicas=2"), "unknown replica 'nope'"),
        (("calibrate", "--replica", "nope"), "unknown replica 'nope'"),
        (("calibrate", "--replica", REPLICA, "--run", "no-such-run"), "no run labelled"),
    ],
)
def test_bad_input_exits_2_with_one_sentence(
    stored_day: tuple[Path, float], args: tuple[str, ...], message: str
) -> None:
    config_file, now = stored_day
    code, out = invoke(config_file, *args, "--at", str(now))
    assert code == 2, out
    assert message in out


def test_no_calibration_and_no_history_are_clear_errors(stored_day: tuple[Path, float]) -> None:
    config_file, now = stored_day
    # Five days before the stored day nothing was calibrated yet.
    early = str(now - 5 * DAY)
    code, out = invoke(
        config_file, "whatif", "--replica", REPLICA, "--set", "replicas=2", "--at", early
    )
    assert code == 2
    assert "has no calibration" in out
    # Calibrated three days before (from the sweep alone), with no history then to replay.
    before = str(now - 3 * DAY)
    code, out = invoke(
        config_file, "calibrate", "--replica", REPLICA, "--at", before, "--since", "1d"
    )
    assert code == 0, out
    code, out = invoke(
        config_file,
        "whatif",
        "--replica",
        REPLICA,
        "--set",
        "replicas=2",
        "--since",
        "1d",
        "--at",
        before,
    )
    assert code == 2
    assert "no history" in out


def test_an_untrusted_calibration_is_stored_shown_and_predicts_nothing(
    stored_day: tuple[Path, float],
) -> None:
    config_file, now = stored_day
    config = load_config(config_file)
    sessions = connect_store(config.database)
    good = next(r for r in ladder_runs(sessions) if r.label == f"{REPLICA}-sweep")
    # Throughput that falls as concurrency rises while latency stays put: no step cost
    # gives that.
    bad = Run(
        "scrambled",
        good.model,
        "sweep",
        tuple(
            Point.from_dict({**p.as_dict(), "output_tokens_per_second": 500.0 / p.concurrency})
            for p in good.points
        ),
        notes=good.notes,
    )
    with sessions.begin() as session:
        save_run(session, bad, now)
    # Four days before the stored day: no history then, the run alone.
    at = str(now - 4 * DAY)
    code, out = invoke(
        config_file,
        "calibrate",
        "--replica",
        REPLICA,
        "--run",
        "scrambled",
        "--at",
        at,
        "--since",
        "1d",
        "--json",
    )
    assert code == 0, out
    profile = json.loads(out)
    assert profile["fit"]["trusted"] is False
    assert "above 20%" in profile["fit"]["reason"]
    code, out = invoke(
        config_file,
        "calibrate",
        "--replica",
        REPLICA,
        "--run",
        "scrambled",
        "--at",
        at,
        "--since",
        "1d",
    )
    assert "NOT TRUSTED" in out
    code, out = invoke(
        config_file, "whatif", "--replica", REPLICA, "--set", "replicas=2", "--at", at
    )
    assert code == 2
    assert "is not trusted" in out and "predicts nothing" in out


def ladder_runs(sessions: sessionmaker[Session]) -> list[Run]:
    with sessions() as session:
        return load_runs(session)
