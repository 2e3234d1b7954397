"""The app's read path for the on-call cockpit's judgements: the signals the likely cause is
classified from (kneepoint/causes.py) and the headroom forecasts (kneepoint/forecast.py),
cached like app/data.py's queries: on the store's data version, shared by every session, and
warmed for each new version (app/warm.py)."""

from __future__ import annotations

import math
from dataclasses import replace

from app import data
from kneepoint import causes, forecast

STEP = 30.0  # an onset's changes are read as of the next 30 s: onsets that close share them


def signals(now: float) -> causes.Signals:
    """Every replica's signals over causes.WINDOW and the changes in the hour before, as of
    `now` (the page's, data.now()): gathered once per data version."""
    path = data.config_file()
    return _signals(path, now, data.known(path).key)


@data.versioned("key", times=("now",))
def _signals(path: str, now: float, version: data.Key) -> causes.Signals:
    config, sessions = data._open(path)
    with sessions() as session:
        return causes.gather(session, config, now)


def cause(
    now: float, replica: str | None = None, began: causes.Onset | None = None
) -> causes.Cause:
    """The likely cause now, for one replica or (None) the fleet, of a trouble that began at
    `began` (causes.onset; None: now): only the changes in the hour before it count."""
    found = signals(now)
    if began is not None and began.at < found.at:
        path = data.config_file()
        # Rounded up, so the hour read still holds every change up to the onset.
        at = math.ceil(began.at / STEP) * STEP
        found = replace(found, events=_changes(path, at, data.known(path).key))
    return causes.classify(found, replica, began)


# Keyed on the data version (a change written late, or an annotation, shows at once); the
# onset is a fixed time, not one moved with the tick.
@data.versioned("key", pin=False)
def _changes(path: str, began: float, version: data.Key) -> tuple[causes.Event, ...]:
    config, sessions = data._open(path)
    with sessions() as session:
        return causes.changes_before(session, config, began)


def forecasts(now: float) -> list[forecast.Forecast]:
    """Each replica's headroom forecast from the history before today, as of the hour of
    `now`, and the stored runs (the knees it compares with)."""
    path = data.config_file()
    return _forecasts(path, now // 3600 * 3600, data.known(path).changes)


# Keyed on the hour, not on each round: it reads whole days before today, which a round
# does not change; the stored runs it assesses are the version's `changes`.
@data.versioned("changes", times=("now",), step=3600.0, spinner="Fitting the daily peaks…")
def _forecasts(path: str, now: float, version: data.Key) -> list[forecast.Forecast]:
    config, sessions = data._open(path)
    with sessions() as session:
        return forecast.forecasts(session, config, now)
