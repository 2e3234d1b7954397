"""The weekly review's recommendations carry their predicted effect (review/effects.py), on a
copy of the demo's backfilled week, where the L4 replica preempts and fp8 KV is recommended:
without a calibration the recommendation says why there is no prediction; with a trusted
one it carries the replayed week's numbers, measured → predicted; an untrusted one predicts
nothing; a recommendation the twin has no change for says so."""

from __future__ import annotations

import html
import re
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from kneepoint.config import Config, load_config
from kneepoint.store.db import connect_store
from kneepoint.whatif import FitQuality, calibrate_replica, save_profile
from kneepoint.whatif.history import load_history
from review.deliver import summary
from review.effects import NOT_MODELLED
from review.recommend import Recommendation
from review.render import html_report, markdown, value
from review.report import build_report
from review.weekly import WeeklyReport

pytestmark = pytest.mark.timeout(900)
WEEK = 7 * 86400.0
FP8 = {"kv_cache_dtype": "fp8"}

Week = tuple[Config, sessionmaker[Session], float]


@pytest.fixture
def week(demo_week: tuple[Path, float], tmp_path: Path) -> Iterator[Week]:
    """A copy of the demo's week (its store with SQLite's -wal and -shm), so calibrations
    stored here stay out of the other review tests."""
    config_file, now = demo_week
    for part in config_file.parent.glob("kneepoint.db*"):
        shutil.copy(part, tmp_path / part.name)
    copy = tmp_path / "kneepoint.yaml"
    copy.write_text(config_file.read_text().replace(str(config_file.parent), str(tmp_path)))
    config = load_config(copy)
    yield config, connect_store(config.database), now


def report_of(week: Week) -> WeeklyReport:
    config, sessions, now = week
    with sessions() as session:
        return build_report(session, config, now, WEEK)


def fp8_of(report: WeeklyReport) -> Recommendation:
    found = [r for r in report.recommendations if r.change == FP8]
    assert len(found) == 1, [(r.replica, r.title) for r in report.recommendations]
    return found[0]


def calibrated(week: Week, replica: str, trusted: bool = True) -> None:
    """Calibrate `replica` from its own sweep and the week (kneepoint calibrate's path),
    fitted before the report's time; `trusted=False` stores the same fit marked untrusted."""
    config, sessions, now = week
    with sessions.begin() as session:
        profile = calibrate_replica(
            session, config, replica, f"{replica}-sweep", now - WEEK, now, now - 60
        )
        assert profile.fit.trusted, profile.fit.reason
        if not trusted:
            poor = FitQuality(profile.fit.points, False, "RMS relative error 42% is above 20%")
            profile = replace(profile, fit=poor)
        save_profile(session, profile)


def test_without_a_calibration_the_recommendation_says_why(week: Week) -> None:
    report = report_of(week)
    fp8 = fp8_of(report)
    assert fp8.effect.startswith("no prediction for --kv-cache-dtype fp8: ")
    assert f"{fp8.replica} has no calibration" in fp8.effect
    assert f"kneepoint calibrate --replica {fp8.replica}" in fp8.effect
    unmodelled = [r for r in report.recommendations if r.change is None]
    assert unmodelled, "the demo's week also calls for routing and trough filling"
    assert {r.effect for r in unmodelled} == {NOT_MODELLED}
    assert f"  - *What-if:* {fp8.effect}\n" in markdown(report)
    assert f"<p class='effect'>What-if: {html.escape(fp8.effect)}</p>" in html_report(report)
    assert "predicted" not in summary(report, Path("report.html"))


def test_a_trusted_calibration_brings_the_predicted_effect(week: Week) -> None:
    replica = fp8_of(report_of(week)).replica
    calibrated(week, replica)
    report = report_of(week)
    fp8 = fp8_of(report)
    assert fp8.effect.startswith("predicted: preemptions "), fp8.effect
    assert fp8.effect.endswith("(with --kv-cache-dtype fp8)")
    # measured → predicted: the measured side is the stored week's own count.
    _, sessions, now = week
    with sessions() as session:
        measured = load_history(session, replica, now - WEEK, now).measured()
    found = re.search(r"preemptions ([\d,]+) → ([\d,]+)", fp8.effect)
    assert found is not None, fp8.effect
    before, after = (float(n.replace(",", "")) for n in found.groups())
    assert found.group(1) == value(measured["preemptions"], "")
    # Twice the KV tokens: fewer evictions per token served. (The sessions are a closed
    # loop: on this overloaded replica fp8 nearly doubles what they get served, so the
    # week's count alone can rise.)
    rate = re.search(r"throughput ([\d,.]+) tok/s → ([\d,.]+) tok/s", fp8.effect)
    assert rate is not None, fp8.effect
    served_before, served_after = (float(n.replace(",", "")) for n in rate.groups())
    assert before > 0 and after / served_after < before / served_before, fp8.effect
    for label in ("throughput", "TTFT p99", "p95 KV occupancy", "$/1M tokens"):
        assert f", {label} " in fp8.effect, label
    assert not re.search(r"\bNone\b|\bnan\b|\binf\b", fp8.effect), fp8.effect
    assert f"  - *What-if:* {fp8.effect}\n" in markdown(report)
    assert f"{fp8.knob}); {fp8.effect}" in summary(report, Path("report.html"))
    # Replicas without a calibration still say why.
    others = [r for r in report.recommendations if r.change and r.replica != replica]
    assert all("has no calibration" in r.effect for r in others)


def test_an_untrusted_calibration_predicts_nothing(week: Week) -> None:
    replica = fp8_of(report_of(week)).replica
    calibrated(week, replica, trusted=False)
    fp8 = fp8_of(report_of(week))
    assert fp8.effect.startswith("no prediction for --kv-cache-dtype fp8: ")
    assert "not trusted" in fp8.effect and "predicts nothing" in fp8.effect


def test_a_fault_in_the_replay_leaves_the_review_standing(caplog: pytest.LogCaptureFixture) -> None:
    """Only the prediction is lost, said so on the recommendation and logged with its cause."""
    from review.effects import effect
    from review.recommend import kv_bound

    rec = kv_bound("a", {"time_saturated": 0.2, "preemptions": 10.0})
    assert rec is not None and rec.change == FP8

    def broken(replica: str, change: object) -> dict[str, object]:
        raise ZeroDivisionError("float division by zero")

    text = effect(rec, broken)
    assert text == "no prediction for --kv-cache-dtype fp8: the replay failed (ZeroDivisionError)"
    assert "what-if for a" in caplog.text and "float division by zero" in caplog.text
