"""The app's read path for the on-call cockpit's judgements: the signals the likely cause is
classified from (kneepoint/causes.py) and the headroom forecasts (kneepoint/forecast.py),
cached like app/data.py's queries: on the store's data version, shared by every session."""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from app import data
from kneepoint import causes, forecast
from kneepoint.config import config_path


def signals(now: float) -> causes.Signals:
    """Every replica's signals over causes.WINDOW and the changes in the hour before, as of
    `now` (the page's, data.now()): gathered once per data version."""
    path = data.config_file()
    return _signals(path, now, data.known(path).key)


@st.cache_data(max_entries=data.KEPT, show_spinner=False)
def _signals(path: str, now: float, version: data.Key) -> causes.Signals:
    config, sessions = data.store()
    with sessions() as session:
        return causes.gather(session, config, now)


def cause(
    now: float, replica: str | None = None, began: causes.Onset | None = None
) -> causes.Cause:
    """The likely cause now, for one replica or (None) the fleet, of a trouble that began at
    `began` (causes.onset; None: now): only the changes in the hour before it count."""
    found = signals(now)
    if began is not None and began.at < found.at:
        # Rounded up, so the cached hour still holds every change up to the onset.
        found = replace(
            found, events=_changes(str(config_path().resolve()), -(-began.at // 30) * 30)
        )
    return causes.classify(found, replica, began)


@st.cache_data(ttl=300, show_spinner=False)
def _changes(path: str, began: float) -> tuple[causes.Event, ...]:
    config, sessions = data.store()
    with sessions() as session:
        return causes.changes_before(session, config, began)


def forecasts(now: float) -> list[forecast.Forecast]:
    """Each replica's headroom forecast from the history before today (recomputed hourly:
    it reads whole days)."""
    return _forecasts(str(config_path().resolve()), now // 3600 * 3600)


@st.cache_data(ttl=600, show_spinner="Fitting the daily peaks…")
def _forecasts(path: str, now: float) -> list[forecast.Forecast]:
    config, sessions = data.store()
    with sessions() as session:
        return forecast.forecasts(session, config, now)
