"""One evaluation round over the store: the numbers (from the kernel's View, as the pages and
the CLI show them), every rule, and the alerts' new states and history written back."""

from __future__ import annotations

from dataclasses import asdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from alerts import slo
from alerts.engine import FIRING, Alert, Transition, evaluate
from alerts.outbox import enqueue
from alerts.rules import effective_rules
from alerts.values import FLEET, monitor_values, not_exposed, values
from kneepoint.config import Config
from kneepoint.secrets import Secret
from kneepoint.status import build_status, fleet_window
from kneepoint.store.models import AlertHistoryRow, AlertRow
from kneepoint.views import build_view

WINDOW = 300.0  # rates, ratios and quantiles over the last five minutes
BASELINE = 3600.0  # what a drop is measured against


def load_alerts(session: Session) -> dict[str, Alert]:
    return {
        row.fingerprint: Alert(
            row.fingerprint,
            row.rule,
            row.replica,
            row.state,
            row.value,
            row.threshold,
            row.pending_since,
            row.fired_at,
            row.resolved_at,
        )
        for row in session.scalars(select(AlertRow))
    }


# Burn windows are five minutes and longer: their rates are recomputed once a minute, not at
# every evaluation (reading up to three days of rows each time). Only the latest is kept.
_burn_cache: dict[tuple[Secret, tuple[str, ...], float], dict[str, dict[float, float | None]]] = {}


def burn_rates_cached(
    session: Session, config: Config, now: float
) -> dict[str, dict[float, float | None]]:
    key = (config.database, tuple(s.name for s in config.slos), now // 60)
    if key not in _burn_cache:
        _burn_cache.clear()
        _burn_cache[key] = burn_rates(session, config, now)
    return _burn_cache[key]


def burn_rates(
    session: Session, config: Config, now: float
) -> dict[str, dict[float, float | None]]:
    """Each SLO's burn rate over every window the burn alerts use, for the fleet."""
    fleet = {
        seconds: fleet_window(session, config, now, seconds) for seconds in slo.windows_needed()
    }
    rates: dict[str, dict[float, float | None]] = {}
    for s in config.slos:
        try:
            rates[s.name] = {
                seconds: slo.burn_rate(s, window.histograms.get(s.metric))
                for seconds, window in fleet.items()
            }
        except slo.ThresholdNotABound:  # said by `alerts eval` and the SLOs page; no burn
            rates[s.name] = {}
    return rates


def slo_problems(session: Session, config: Config, now: float) -> list[str]:
    """SLOs whose threshold is not a bucket bound of the histogram they read."""
    fleet = fleet_window(session, config, now, slo.HOUR)
    problems = []
    for s in config.slos:
        histogram = fleet.histograms.get(s.metric)
        if histogram is None:
            continue
        try:
            slo.check_threshold(s, histogram.bounds)
        except slo.ThresholdNotABound as error:
            problems.append(str(error))
    return problems


def evaluate_once(session: Session, config: Config, now: float) -> list[Transition]:
    """Evaluate every rule now; store states and transitions; return the transitions."""
    rules = effective_rules(config)
    view = build_view(session, config, now, WINDOW)
    baseline = build_status(session, config, now, BASELINE)
    current = load_alerts(session)
    watched = values(view, baseline)
    watched[FLEET] = {**watched[FLEET], **monitor_values(session, config, now)}
    if config.slos:
        rules = rules + slo.burn_rules(config.slos)
        watched[FLEET] = {
            **watched[FLEET],
            **slo.burn_values(config.slos, burn_rates_cached(session, config, now)),
        }
    states, transitions = evaluate(rules, watched, current, now, not_exposed(view.status))
    notified = dict(session.execute(select(AlertRow.fingerprint, AlertRow.notified_at)).all())
    news = {c.alert.fingerprint for c in transitions if c.after == FIRING}
    reminders = [
        Transition(alert, FIRING, FIRING)
        for key, alert in states.items()
        if alert.state == FIRING
        and key not in news
        and config.repeat_interval > 0
        and (notified.get(key) or alert.fired_at or now) <= now - config.repeat_interval
    ]
    news |= {r.alert.fingerprint for r in reminders}
    for key in set(current) - set(states):  # pending that recovered before firing
        session.delete(session.get(AlertRow, key))
    for key, alert in states.items():
        sent = now if key in news else notified.get(key)
        session.merge(AlertRow(**asdict(alert), updated_at=now, notified_at=sent))
    enqueue(session, config, rules, transitions + reminders, now, states)
    for change in transitions:
        session.add(
            AlertHistoryRow(
                fingerprint=change.alert.fingerprint,
                rule=change.alert.rule,
                replica=change.alert.replica,
                ts=now,
                before=change.before,
                after=change.after,
                value=change.alert.value,  # the value seen now (None: no data)
                note=change.note,
            )
        )
    return transitions


def slo_reports(session: Session, config: Config, now: float) -> list[slo.Report]:
    """Every SLO's compliance and budget over its window, and its burn rates, for the fleet."""
    fleet = {
        seconds: fleet_window(session, config, now, seconds) for seconds in slo.windows_needed()
    }
    reports = []
    for s in config.slos:
        whole = fleet_window(session, config, now, s.window).histograms.get(s.metric)
        windows = {seconds: w.histograms.get(s.metric) for seconds, w in fleet.items()}
        reports.append(slo.report(s, windows, whole))
    return reports
