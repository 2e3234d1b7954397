"""The weekly report as a self-contained HTML file (Plotly inlined once, system fonts, no
network) and as a Markdown summary."""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import Any

import plotly.graph_objects as go

from alerts.slo import Report as SloReport
from dashboards.charts import MARKERS, Marker, marked
from review.weekly import ROWS, WeeklyReport

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 1100px; color: #1f2328; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.92rem; }
th, td { border-bottom: 1px solid #d0d7de; padding: 0.3rem 0.7rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.better { color: #1a7f37; } .worse { color: #cf222e; }
.rec { border-left: 4px solid #0969da; padding: 0.2rem 1rem; margin: 0.8rem 0; }
.muted { color: #656d76; font-size: 0.85rem; }
.effect { font-style: italic; }
"""

# The summary's fleet rows, in its order; each reads as its weekly row does (ROWS, a
# projection of kneepoint/catalogue.py), so a label or unit is written only there.
FLEET_KEYS = (
    "generation_tokens_per_second",
    "prefix_cache_hit_rate",
    "cost_per_million_tokens",
    "preemptions",
)
LABEL_UNIT = {key: (label, unit) for key, label, unit, _ in ROWS}


def value(number: Any, unit: str) -> str:
    """A number with its unit, as the pages show it; "–" where there is no data."""
    if number is None or (isinstance(number, float) and number != number):
        return "–"
    if isinstance(number, str):
        return number
    if unit == "%":
        return f"{number:.1%}"
    if unit == "$":
        return f"${number:,.3f}"
    if unit == "s":
        return f"{number * 1000:,.0f} ms" if number < 1 else f"{number:,.2f} s"
    text = (
        f"{number:,.0f}" if abs(number) >= 100 or float(number).is_integer() else f"{number:,.2f}"
    )
    return f"{text} {unit}".strip()


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def markdown(report: WeeklyReport) -> str:
    this, last = report.this, report.last
    lines = [
        "# Weekly capacity review",
        "",
        f"{_day(this.start)} → {_day(this.end)}, against the {report.since / 86400:g} days before.",
        "",
        "## Recommendations",
        "",
    ]
    if not report.recommendations:
        lines.append("None: nothing in this week's numbers calls for a change.")
    for rec in report.recommendations:
        lines.append(f"- **{rec.replica}: {rec.title}.** Turn: {rec.knob}.")
        lines += [f"  - {item}" for item in rec.evidence]
        if rec.effect:
            lines.append(f"  - *What-if:* {rec.effect}")
    lines += ["", "## Fleet", ""]
    lines += ["| | this week | last week |", "|---|---|---|"]
    for key in FLEET_KEYS:
        label, unit = LABEL_UNIT[key]
        lines.append(
            f"| {label} | {value(this.fleet.get(key), unit)} | {value(last.fleet.get(key), unit)} |"
        )
    before = {slo.slo.name: slo for slo in last.slos}
    for slo in this.slos:
        earlier = before.get(slo.slo.name)
        lines.append(
            f"| SLO {slo.slo.name}: compliance / budget left | "
            f"{_budget(slo)} | " + (_budget(earlier) if earlier else "–") + " |"
        )
    lines += ["", *events(report)]
    lines += ["", "## Headroom forecast", "", *outlook(report)]
    for name, numbers in this.replicas.items():
        before = last.replicas.get(name, {})
        lines += ["", f"## {name}", "", "| | this week | last week |", "|---|---|---|"]
        for key, label, unit, _ in ROWS:
            lines.append(
                f"| {label} | {value(numbers.get(key), unit)} | {value(before.get(key), unit)} |"
            )
    return "\n".join(lines) + "\n"


def _budget(slo: SloReport) -> str:
    return f"{value(slo.budget.compliance, '%')} / {value(slo.budget.budget_left, '%')}"


def events(report: WeeklyReport) -> list[str]:
    """The week's fleet-wide hit-rate drops and prefill storms, with their start times."""
    found = report.this.view.events
    lines = [
        f"- Hit rate fell to {e.value:.0%} (from {e.baseline:.0%}) "
        f"at {e.start:%a %Y-%m-%d %H:%M} UTC"
        for e in found.get("hit_rate_drops", [])
    ]
    lines += [
        f"- Prefill storm: {e.value:,.0f} computed prompt tokens/s (from {e.baseline:,.0f}) "
        f"at {e.start:%a %Y-%m-%d %H:%M} UTC"
        for e in found.get("prefill_storms", [])
    ]
    return lines or ["- No hit-rate drops or prefill storms this week."]


def outlook(report: WeeklyReport) -> list[str]:
    """Per replica: when its daily peak concurrency (running + waiting) reaches its knee at
    the current growth, with the range, or why there is no date (kneepoint/forecast.py)."""
    lines = [f"- {f.replica}: {f.note}" for f in report.forecasts]
    return lines or ["- No replica has stored history."]


def html_report(report: WeeklyReport) -> str:
    this, last = report.this, report.last
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<title>kneepoint: weekly capacity review</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>Weekly capacity review</h1>",
        f"<p class='muted'>{_day(this.start)} → {_day(this.end)}, against the "
        f"{report.since / 86400:g} days before. "
        f"Generated {_day(report.generated_at)} by kneepoint.</p>",
        "<h2>Recommendations</h2>",
    ]
    if not report.recommendations:
        parts.append("<p>None: nothing in this week's numbers calls for a change.</p>")
    for rec in report.recommendations:
        evidence = "".join(f"<li>{html.escape(item)}</li>" for item in rec.evidence)
        effect = f"<p class='effect'>What-if: {html.escape(rec.effect)}</p>" if rec.effect else ""
        parts.append(
            f"<div class='rec'><p><b>{html.escape(rec.replica)}: {html.escape(rec.title)}.</b> "
            f"Turn: {html.escape(rec.knob)}.</p><ul>{evidence}</ul>{effect}</div>"
        )
    parts.append("<h2>Per replica</h2>")
    for name, numbers in this.replicas.items():
        before = last.replicas.get(name, {})
        rows = "".join(
            f"<tr><td title='{html.escape(meaning)}'>{html.escape(label)}</td>"
            f"<td>{value(numbers.get(key), unit)}</td><td>{value(before.get(key), unit)}</td></tr>"
            for key, label, unit, meaning in ROWS
        )
        parts.append(
            f"<h3>{html.escape(name)}</h3><table><tr><th></th><th>this week</th>"
            f"<th>last week</th></tr>{rows}</table>"
        )
    parts.append("<h2>SLOs</h2><table><tr><th>SLO</th><th>compliance</th><th>budget left</th></tr>")
    for slo in this.slos:
        parts.append(
            f"<tr><td>{html.escape(slo.slo.name)}</td><td>{value(slo.budget.compliance, '%')}</td>"
            f"<td>{value(slo.budget.budget_left, '%')}</td></tr>"
        )
    parts.append("</table><h2>Hit-rate drops and prefill storms</h2><ul>")
    parts += [f"<li>{html.escape(line[2:])}</li>" for line in events(report)]
    parts.append("</ul><h2>Headroom forecast</h2><ul>")
    parts += [f"<li>{html.escape(line[2:])}</li>" for line in outlook(report)]
    parts.append("</ul><h2>The week</h2>")
    for index, figure in enumerate(figures(report)):
        # Plotly's script once, inline: the file works offline, from disk or an attachment.
        parts.append(figure.to_html(full_html=False, include_plotlyjs=index == 0))
    parts.append("</body></html>")
    return "".join(parts)


def figures(report: WeeklyReport) -> list[go.Figure]:
    """The week's time series, each marking the week's changes (restarts, configuration
    changes, GPU events, alerts, annotations...: kneepoint/timeline.py) as the app's charts
    do, a dotted line each with the detail on hover."""
    series = report.this.view.coarse
    changes = tuple(Marker.of(event) for event in report.changes)
    charts = []
    for column, title, axis in (
        ("kv_cache_occupancy", "KV-cache occupancy", "occupancy (%)"),
        ("requests_running", "Sequences running", "running (sequences)"),
        ("hit_rate", "Prefix-cache hit rate", "hit rate (%)"),
    ):
        figure = go.Figure()
        if not series.empty and column in series:
            for replica, rows in series.groupby("replica"):
                figure.add_trace(go.Scatter(x=rows.time, y=rows[column], name=str(replica)))
        figure.update_layout(
            title=title,
            xaxis_title="time (UTC)",
            yaxis_title=axis,
            hovermode="x unified",
            height=320,
            font_family="system-ui",
        )
        if axis.endswith("(%)"):  # shares, drawn as %
            figure.update_yaxes(tickformat=".0%")
        token = MARKERS.set(changes)  # the week's, whatever page or command renders it
        try:
            marked(figure)
        finally:
            MARKERS.reset(token)
        charts.append(figure)
    return charts
