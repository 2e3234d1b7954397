"""Write a report's files: `kneepoint-report-<date>.html` and `.md` in a folder."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.orm import Session

from kneepoint.config import Config
from review.render import html_report, markdown
from review.report import build_report
from review.weekly import WeeklyReport


def write_report(
    session: Session, config: Config, now: float, since: float, folder: Path
) -> tuple[WeeklyReport, Path, Path]:
    report = build_report(session, config, now, since)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"kneepoint-report-{datetime.fromtimestamp(now, UTC):%Y-%m-%d}"
    page, summary = stem.with_suffix(".html"), stem.with_suffix(".md")
    page.write_text(html_report(report), encoding="utf-8")
    summary.write_text(markdown(report), encoding="utf-8")
    return report, page, summary
