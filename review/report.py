"""The weekly review assembled: this week's and last week's numbers (review/weekly.py), the
recommendations they call for (review/recommend.py), each with its predicted effect
(review/effects.py), the headroom forecasts and the week's changes. It sits above the
modules it assembles, so none of them needs to import another back."""

from __future__ import annotations

from sqlalchemy.orm import Session

from kneepoint.config import Config
from kneepoint.forecast import forecasts
from kneepoint.timeline import events as timeline_events
from review.effects import store_predictor, with_effects
from review.recommend import recommend
from review.weekly import WeeklyReport, period


def build_report(session: Session, config: Config, now: float, since: float) -> WeeklyReport:
    this = period(session, config, now, since)
    last = period(session, config, now - since, since)
    report = WeeklyReport(now, since, this, last)
    # Each with its predicted effect: the replica's calibrated twin replays this week.
    report.recommendations = with_effects(
        recommend(report), store_predictor(session, config, now, since)
    )
    report.forecasts = forecasts(session, config, now)
    report.changes = timeline_events(session, config, now - since, now)
    return report
