"""The app's read path: one cached store, and cached queries through kneepoint's kernel.

Every cached computation is keyed on the config file, its arguments and the store's data
version (kneepoint/prepared.py), never on the wall clock or the session: st.cache_data is
shared by every session, so a click, the Overview's refresh or a second browser with
unchanged data computes nothing again, and a new round or a mutation changes the key.
Pages pass `now()`, the version's tick, as their "now". Each such cache is declared with
`versioned`, so that a warmer thread computes, for each new version, what pages asked for
under the previous ones (app/warm.py) before the next page run asks again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pandas as pd
import streamlit as st
from sqlalchemy.orm import Session, sessionmaker

from alerts import evaluate as alert_rounds
from alerts import silences, slo_prepared
from alerts.outbox import channel_health, view_of
from alerts.rules import effective_rules
from alerts.silences import Silence
from alerts.slo import BURN_WINDOWS, Report, burn_rules, window_label
from alerts.slo_replay import replayed_json
from app import run_version, warm
from collectors.discovery import current
from kneepoint import audit, fleet_status, prepared
from kneepoint.auth import Limits
from kneepoint.config import ENGINE_KINDS, Config, ConfigError, Slo, config_path, load_config
from kneepoint.knee.detect import Assessment, assess
from kneepoint.knee.passive import ProductionCurve, replica_curve
from kneepoint.records import Status
from kneepoint.samples import sleep_state
from kneepoint.series import COLUMNS as SERIES_COLUMNS
from kneepoint.series import replica_series
from kneepoint.status import build_status, is_stale
from kneepoint.store import queries
from kneepoint.store.db import SchemaError, connect_store
from kneepoint.store.errors import describe
from kneepoint.store.runs import load_runs
from kneepoint.views import View, build_view
from review.render import html_report, markdown
from review.report import build_report
from review.weekly import WeeklyReport

Key = tuple[Any, ...]
KEPT = 32  # entries each cached function keeps: a few ranges and replicas over two rounds
_LOCK = threading.Lock()
_VERSIONS: dict[str, prepared.Version] = {}  # the newest version read, per config file
R = TypeVar("R")


def versioned(
    part: warm.Part | None,
    times: Sequence[str] = (),
    step: float = 0.0,
    kept: int = KEPT,
    spinner: bool | str = False,
    pin: bool = True,
) -> Callable[[Callable[..., R]], warm.Versioned[R]]:
    """st.cache_data over `def _f(path, ..., version)`, its `version` the data version's
    `part` (samples, changes or the whole key; None: no such parameter), the parameters in
    `times` times relative to the tick (floored to `step`): the warmer makes the calls pages
    made again for each new version. E.g. `@data.versioned("samples", times=("start", "end"))`.
    `pin=False` for a function of a moment or a replica (not a view): the default page's and
    range's calls are otherwise kept for an hour of rounds."""
    return warm.versioned(part, times, step, kept, spinner, lambda path: known(path), pin)


def store() -> tuple[Config, sessionmaker[Session]]:
    """The configuration and its store, opened once per config file; with `discovery:`,
    the targets Prometheus scrapes added (found again each scrape interval at most). In a
    served app, the first call starts the config's cache warmer (app/warm.py)."""
    path = str(config_path().resolve())
    if warm.served():
        warm.ensure(path, read_version)
    return _open(path)


def _open(path: str) -> tuple[Config, sessionmaker[Session]]:
    """The config, with the targets discovery finds now, and the store."""
    config, sessions = _opened(path)
    return current(config), sessions


@st.cache_resource
def _opened(path: str) -> tuple[Config, sessionmaker[Session]]:
    """The store as it is: the app never migrates; behind, every page says what to run."""
    config = load_config(path)
    try:
        return config, connect_store(config.database)
    except SchemaError as error:
        st.error(f"{error}: run `kneepoint migrate --config {path}`, then reload this page.")
        st.stop()
    except Exception as error:  # the URL, the file or the server is unusable: say which
        st.error(f"cannot open the database: {describe(error)}")
        st.stop()


def limits() -> Limits:
    config, _ = store()
    return config.limits


def replica_names() -> list[str]:
    config, _ = store()
    return [t.name for t in config.targets if t.kind in ENGINE_KINDS]


def status(window: float, now: float) -> Status:
    path = config_file()
    return _status(path, window, now, known(path).samples)


@versioned("samples", times=("now",))
def _status(path: str, window: float, now: float, version: Key) -> Status:
    config, sessions = _open(path)
    with sessions() as session:
        return build_status(session, config, now, window)


def series(start: float, end: float) -> pd.DataFrame:
    path = config_file()
    return _series(path, start, end, known(path).samples)


@versioned("samples", times=("start", "end"))
def _series(path: str, start: float, end: float, version: Key) -> pd.DataFrame:
    _, sessions = _open(path)
    with sessions() as session:
        names = {row.id: name for name, row in queries.targets(session).items()}
        frame = queries.replica_frame(session, start, end, columns=SERIES_COLUMNS)
        return replica_series(frame, names)


def view(window: float, now: float) -> View:
    path = config_file()
    return _view(path, window, now, known(path).samples)


@versioned("samples", times=("now",))
def _view(path: str, window: float, now: float, version: Key) -> View:
    config, sessions = _open(path)
    with sessions() as session:
        return build_view(session, config, now, window)


def health(start: float, end: float) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    path = config_file()
    # The jobs' run counts are read again with each round or mutation, not with each job run.
    return _health(path, start, end, known(path).key)


@versioned("key", times=("start", "end"))
def _health(
    path: str, start: float, end: float, version: Key
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    config, sessions = _open(path)
    with sessions() as session:
        levels = queries.latest_sleep_levels(session)
        targets = pd.DataFrame(
            [
                {
                    "target": row.name,
                    "kind": row.kind,
                    "engine": row.engine,
                    "generation": row.generation,
                    # A stale target (not scraped lately) is down, as in `kneepoint status`.
                    "up": False if is_stale(row.last_scrape_at, config, end) else row.up,
                    "stale": is_stale(row.last_scrape_at, config, end),
                    "url": row.url,
                    "last scrape": _when(row.last_scrape_at),
                    "last error": row.last_error,
                    "failures in a row": row.consecutive_failures,
                    # vLLM's sleep mode in the latest sample, in words (None: not said).
                    "sleep": sleep_state(levels.get(row.id)),
                }
                for row in queries.targets(session).values()
            ]
        )
        jobs = pd.DataFrame(
            [
                {
                    "job": row.job_id,
                    "runs": row.runs,
                    "failures": row.failures,
                    "last run": _when(row.last_run_at),
                    "last error": row.last_error,
                }
                for row in queries.job_health(session)
            ]
        )
        errors = queries.scrape_errors(session, start, end)
        errors.insert(0, "time", pd.to_datetime(errors.pop("ts"), unit="s", utc=True))
        return targets, jobs, errors


def now() -> float:
    """The time pages compute as of: the tick of this script run's data version
    (`version()`, kneepoint/prepared.py); it moves only with new data, or with the wall clock
    floored to the scrape interval when no data comes (a dead collector's replicas go stale)."""
    return version().tick


def version() -> prepared.Version:
    """The store's data version for this script run: read once, at the start of a full run
    (app/main.py) or at the first call of a fragment run (app/run_version.py), so every
    section of a page keys its cached reads on one version and computes as of one tick.
    Outside a script run (or in a page script run alone) it is read now; either way it is
    remembered for this config (`known` outside a script run)."""
    path = config_file()
    found = run_version.current(path, read_version)
    if found is None:
        found = read_version(path)
    with _LOCK:
        _VERSIONS[path] = found
    return found


def read_version(path: str) -> prepared.Version:
    """The store's data version now, remembered nowhere (the warmer reads it so: pages
    key on the version their own run read)."""
    config, sessions = _opened(path)
    with sessions() as session:
        return prepared.version(session, config, time.time())


def config_file() -> str:
    return str(config_path().resolve())


def known(path: str) -> prepared.Version:
    """The version this script run computes as of (`version()`); outside a script run, the
    one this process read last, else read now: a read keyed on it computes from data at
    least that new."""
    found = run_version.current(path, read_version)
    if found is not None:
        return found
    with _LOCK:
        known = _VERSIONS.get(path)
    return known if known is not None else version()


def _when(ts: float | None) -> pd.Timestamp | None:
    return None if ts is None else pd.Timestamp(ts, unit="s", tz="UTC")


def runs() -> list[Assessment]:
    """Every stored load-test run with its knee, held to the configured SLOs."""
    path = config_file()
    return _runs(path, known(path).changes)


@versioned("changes")
def _runs(path: str, version: Key) -> list[Assessment]:
    config, sessions = _open(path)
    with sessions() as session:
        return [assess(run, config.slos) for run in load_runs(session)]


def production_curve(replica: str, start: float, end: float) -> ProductionCurve:
    path = config_file()
    return _production_curve(path, replica, start, end, known(path).samples)


@versioned("samples", times=("start", "end"), pin=False)
def _production_curve(
    path: str, replica: str, start: float, end: float, version: Key
) -> ProductionCurve:
    _, sessions = _open(path)
    with sessions() as session:
        return replica_curve(session, replica, start, end)


def clear_runs() -> None:
    """Forget the cached runs after an import or a delete (app/actions.py): the next page
    run also reads the version, which the change moved, but a page that reads runs before
    `now()` keys on the version read before."""
    _runs.clear()


def alerts(start: float, end: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    path = config_file()
    return _alerts(path, start, end, known(path).changes)


@versioned("changes", times=("start", "end"))
def _alerts(path: str, start: float, end: float, version: Key) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pending and firing alerts, and the state changes in the range, with readable times."""
    _, sessions = _open(path)
    with sessions() as session:
        current = queries.alert_states(session)
        history = queries.alert_history(session, start, end)
    for frame, columns in (
        (current, ("pending_since", "fired_at", "resolved_at", "updated_at")),
        (history, ("ts",)),
    ):
        for column in columns:
            frame[column] = pd.to_datetime(frame[column], unit="s", utc=True)
        frame["replica"] = frame["replica"].replace("", "fleet")
        # No value is "no data" (a firing alert held while its data is missing), not a blank,
        # or the reason the replica's engine does not give the number (alert_history.note).
        notes = frame["note"] if "note" in frame else pd.Series([None] * len(frame))
        frame["value"] = [
            note if isinstance(note, str) else ("no data" if pd.isna(v) else f"{v:.4g}")
            for v, note in zip(frame["value"], notes, strict=True)
        ]
    return current, history


def deliveries(start: float, end: float) -> tuple[pd.DataFrame, dict[str, str]]:
    path = config_file()
    return _deliveries(path, start, end, known(path).changes)


@versioned("changes", times=("start", "end"))
def _deliveries(
    path: str, start: float, end: float, version: Key
) -> tuple[pd.DataFrame, dict[str, str]]:
    """The delivery log of the range, and each configured channel's health."""
    config, sessions = _open(path)
    with sessions() as session:
        log = queries.notifications(session, start, end)
        health = channel_health(session)
    for column in ("created_at", "sent_at", "next_attempt_at"):
        log[column] = pd.to_datetime(log[column], unit="s", utc=True)
    return log, {c.name: health.get(c.name, "no message yet") for c in config.channels}


def silence_list() -> list[Silence]:
    _, sessions = store()
    with sessions() as session:
        return silences.load(session)


def slo_reports(now: float) -> list[Report]:
    """Every SLO's report as of `slo_minute(now)`: the leader's, else computed here."""
    path = config_file()
    return _slo_reports(path, slo_minute(now))


def slo_minute(now: float) -> float:
    """The moment the SLO reports shown at `now` are as of: the newest the HA leader stored
    (alerts/slo_prepared.py) when it is at most slo_prepared.STALE old, shown with that
    "As of" rather than computed again (35 s at 1,000 replicas); else, with no leader
    preparing them for this config, `now` floored to SLO_STEP, computed here."""
    path = config_file()
    config, sessions = _open(path)
    with sessions() as session:
        stored = slo_prepared.newest(session, config, now)
    return stored if stored is not None else warm.floor(now, SLO_STEP)


# Computed here only where no leader stores them: keyed on the minute, not on each round, as
# alert evaluation recomputes burn rates (alerts/evaluate.py burn_rates_cached): windows of 5
# minutes to 30 days that end at the minute, which the rounds after it do not change (they
# write later samples), and the costliest computation the warmer makes (23 of 38 s a round
# at 200 replicas): once a minute, not every 15 s round. The warmer makes it when the tick
# enters a new minute.
SLO_STEP = 60.0


def _slo_reports(path: str, at: float) -> list[Report]:
    """The reports as of `at` (`slo_minute`): the stored ones, read once per process and
    moment, else computed."""
    try:
        return _stored_slo_reports(path, at)
    except LookupError:  # none stored as of `at` (raised, so no cache keeps the miss)
        return _computed_slo_reports(path, at)


@st.cache_data(max_entries=KEPT, show_spinner=False)
def _stored_slo_reports(path: str, at: float) -> list[Report]:
    config, sessions = _open(path)
    with sessions() as session:
        found = slo_prepared.stored(session, config, at)
    if found is None:
        raise LookupError(at)
    return found


# pin=False: asked for only while no leader stores the reports (e.g. before its first
# round), so the warmer stops computing them a few versions after the leader's appear.
@versioned(None, times=("now",), step=SLO_STEP, pin=False)
def _computed_slo_reports(path: str, now: float) -> list[Report]:
    config, sessions = _open(path)
    with sessions() as session:
        return alert_rounds.slo_reports(session, config, now)


def slo_replay(proposal: Slo, end: float, span: float) -> list[dict[str, Any]]:
    """A proposed SLO replayed over [end − span, end] beside the configured ones
    (alerts/evaluate.py slo_replay), as `kneepoint slo replay --json` gives them."""
    config, sessions = _open(config_file())
    with sessions() as session:
        replays = alert_rounds.slo_replay(session, config, proposal, end, span)
    return [replayed_json(r) for r in replays]


def clear_deliveries() -> None:
    _deliveries.clear()


def weekly_report(now: float) -> tuple[WeeklyReport, str, str]:
    """The weekly review as of `now`: the report, its HTML and its Markdown."""
    return _weekly_report(config_file(), now)


# Keyed on the tick floored to 5 minutes (the page floors it), not on each round: the week
# it covers ends then, and it costs seconds to tens of seconds at fleet size. The warmer
# builds the next one when the tick enters a new 5 minutes.
@versioned(None, times=("now",), step=300.0, kept=4, spinner="Building the weekly review…")
def _weekly_report(path: str, now: float) -> tuple[WeeklyReport, str, str]:
    config, sessions = _open(path)
    with sessions() as session:
        report = build_report(session, config, now, 7 * 86400.0)
    return report, html_report(report), markdown(report)


def audit_entries(since: float) -> list[audit.Entry]:
    """The audit trail since `since`, newest first (not cached: it must show the last action)."""
    _, sessions = store()
    with sessions() as session:
        return audit.entries(session, since)


def alert_states() -> list[fleet_status.AlertState]:
    """Pending and firing alerts (what `kneepoint alerts list --json` lists), each with its
    rule's severity and metric and the view its message links to."""
    path = config_file()
    return _alert_states(path, known(path).changes)


@versioned("changes")
def _alert_states(path: str, version: Key) -> list[fleet_status.AlertState]:
    config, sessions = _open(path)
    try:
        rules = effective_rules(config)
    except ConfigError:  # a bad config rule: the Alerts page says which; severities unknown
        rules = []
    by_name = {rule.name: rule for rule in rules + burn_rules(config.slos)}
    with sessions() as session:
        frame = queries.alert_states(session)
    out = []
    for row in frame.to_dict("records"):
        rule = by_name.get(str(row["rule"]))
        metric = rule.metric if rule is not None else ""
        page, slo = view_of(metric)
        replica = str(row["replica"] or "")
        view = {"page": page, "range": fleet_status.RANGE}
        view |= {"replica": replica} if replica else {}
        view |= {"slo": slo} if slo else {}
        firing = row["state"] == fleet_status.FIRING
        out.append(
            fleet_status.AlertState(
                rule=str(row["rule"]),
                replica=replica,
                state=str(row["state"]),
                severity=rule.severity if rule is not None else "ticket",
                since=_number(row["fired_at"] if firing else row["pending_since"]),
                value=_number(row["value"]),
                threshold=_number(row["threshold"]),
                op=rule.op if rule is not None else "",
                metric=metric,
                fingerprint=str(row["fingerprint"]),
                view=view,
            )
        )
    return out


def slo_states(now: float) -> list[fleet_status.SloState]:
    """Each SLO's budget left, its burn rate over the first (fastest) burn window's long
    window, and the windows burning: computed once a minute (`slo_reports`), shared with
    the SLOs page."""
    first = BURN_WINDOWS[0].long
    return [
        fleet_status.SloState(
            name=r.slo.name,
            budget_left=r.budget.budget_left,
            burn_rate=r.rates.get(first),
            burn_window=window_label(first),
            burning=tuple(window_label(w.long) for w in r.burning),
            problem=r.problem,
        )
        for r in slo_reports(now)
    ]


def _number(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)
