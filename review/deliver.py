"""The scheduled weekly review (`report.schedule`): write the report, and post a short
summary with the link to the configured channels through the alerts' outbox, so delivery
gets the same retries, rate limits and delivery log as an alert."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.orm import Session

from alerts.channels.base import REPORT, Notice
from alerts.outbox import put
from kneepoint.config import Config
from review.render import value
from review.weekly import WeeklyReport
from review.write import write_report

WEEK = 7 * 86400.0


def summary(report: WeeklyReport, page: Path) -> str:
    """A few lines a chat message can carry: the fleet's week and the recommendations."""
    fleet = report.this.fleet
    day = datetime.fromtimestamp(report.this.start, UTC).strftime("%Y-%m-%d")
    lines = [
        f"Week from {day}: {value(fleet.get('generation_tokens_per_second'), 'tok/s')}, "
        f"prefix hit rate {value(fleet.get('prefix_cache_hit_rate'), '%')}, "
        f"{value(fleet.get('cost_per_million_tokens'), '$')} per 1M tokens.",
        f"{len(report.recommendations)} recommendations"
        + (": " if report.recommendations else "."),
    ]
    lines += [
        f"- {r.replica}: {r.title} ({r.knob})"
        + (f"; {r.effect}" if r.effect.startswith("predicted") else "")
        for r in report.recommendations
    ]
    lines.append(f"Report: {page}")
    return "\n".join(lines)


def send_report(session: Session, config: Config, now: float) -> tuple[Path, int]:
    """Write this week's report and queue its summary for every report channel; returns
    the HTML file and how many messages were queued."""
    report, page, _ = write_report(session, config, now, WEEK, Path(config.report.output_dir))
    text = summary(report, page.resolve())
    for channel in config.report.channels:
        notice = Notice(
            fingerprint=f"report-{int(now)}",
            rule="Weekly capacity review",
            replica="",
            status=REPORT,
            severity="info",
            value=None,
            threshold=0.0,
            op="",
            since=now,
            at=now,
            runbook=text,
            dashboard_url=config.dashboard_url,
            page="weekly-review",
        )
        put(session, channel, notice, now)
    return page, len(config.report.channels)
