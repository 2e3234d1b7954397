"""The app's read path for the on-call cockpit's judgements: the signals the likely cause is
classified from (kneepoint/causes.py) and the headroom forecasts (kneepoint/forecast.py),
cached like app/data.py's queries."""

from __future__ import annotations

import streamlit as st

from app import data
from kneepoint import causes, forecast
from kneepoint.config import config_path


def signals(now: float) -> causes.Signals:
    """Every replica's signals over causes.WINDOW and the changes in the hour before."""
    return _signals(str(config_path().resolve()), now // 30 * 30)


@st.cache_data(ttl=30, show_spinner=False)
def _signals(path: str, now: float) -> causes.Signals:
    config, sessions = data.store()
    with sessions() as session:
        return causes.gather(session, config, now)


def cause(now: float, replica: str | None = None) -> causes.Cause:
    """The likely cause now, for one replica or (None) the fleet."""
    return causes.classify(signals(now), replica)


def forecasts(now: float) -> list[forecast.Forecast]:
    """Each replica's headroom forecast from the history before today (recomputed hourly:
    it reads whole days)."""
    return _forecasts(str(config_path().resolve()), now // 3600 * 3600)


@st.cache_data(ttl=600, show_spinner="Fitting the daily peaks…")
def _forecasts(path: str, now: float) -> list[forecast.Forecast]:
    config, sessions = data.store()
    with sessions() as session:
        return forecast.forecasts(session, config, now)
