"""The app's chrome around every page: the browser tab's title, the phone-width styles, and
the footer (kneepoint's version, the config file, how old the newest data is)."""

from __future__ import annotations

import streamlit as st
from sqlalchemy import func, select

import kneepoint
from app import data
from kneepoint.config import config_path
from kneepoint.status import stale_after
from kneepoint.store.models import TargetRow

# Streamlit stacks columns below 640 px; these rules are for the same widths. Captions are
# cut to two smaller lines (a tap or hover shows them whole), wide elements scroll inside
# their own box rather than the page, and a number tile wraps instead of cutting its value.
STYLE = """
<style>
[data-testid="stMetricValue"], [data-testid="stMetricValue"] *,
[data-testid="stMetricLabel"], [data-testid="stMetricLabel"] * {
  white-space: normal !important;
  overflow: visible !important;
  text-overflow: clip !important;
  overflow-wrap: break-word;
}
[data-testid="stMarkdownContainer"] { overflow-wrap: anywhere; }
[data-testid="stMarkdownContainer"] table, [data-testid="stTable"] {
  display: block;
  max-width: 100%;
  overflow-x: auto;
}
[data-testid="stDataFrame"], [data-testid="stPlotlyChart"] { max-width: 100%; }
@media (max-width: 640px) {
  [data-testid="stMainBlockContainer"] { padding-left: 0.75rem; padding-right: 0.75rem; }
  [data-testid="stCaptionContainer"] {
    font-size: 0.75rem;
    display: -webkit-box;
    -webkit-line-clamp: 2;
    -webkit-box-orient: vertical;
    overflow: hidden;
  }
  [data-testid="stCaptionContainer"]:hover, [data-testid="stCaptionContainer"]:active {
    display: block;
    overflow: visible;
  }
  h1 { font-size: 1.6rem !important; }
}
</style>
"""


def style() -> None:
    """The styles above, once per run (a style-only st.html takes no room on the page)."""
    st.html(STYLE)


def tab_title(title: str, icon: str) -> None:
    """The browser tab names the page: "Alerts · kneepoint"."""
    st.set_page_config(page_title=f"{title} · kneepoint", page_icon=icon or None)


def age(seconds: float | None) -> str:
    """ "12 s", "4 min", "3 h", "2 d"; "unknown" for none."""
    if seconds is None:
        return "unknown"
    seconds = max(0.0, seconds)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def newest_data() -> float | None:
    """When a target last answered a scrape (the newest stored sample); None before any."""
    return _newest_data(str(config_path().resolve()))


@st.cache_data(ttl=5, show_spinner=False)
def _newest_data(path: str) -> float | None:
    _, sessions = data._open(path)
    with sessions() as session:
        newest = session.scalar(select(func.max(TargetRow.last_success_at)))
    return None if newest is None else float(newest)


def footer_text(now: float, newest: float | None, stale_after: float) -> str:
    """One line: the version, the config file, how old the data is (orange when older than
    a stale target's limit)."""
    freshness = "no data yet" if newest is None else f"data {age(now - newest)} old"
    if newest is None or now - newest > stale_after:
        freshness = f":orange[{freshness}]"
    return f"kneepoint {kneepoint.__version__} · config `{config_path()}` · {freshness}"


@st.fragment(run_every=15)
def footer() -> None:
    """The footer, refreshed every 15 s so its data age keeps counting between page runs."""
    config, _ = data.store()
    st.caption(
        footer_text(data.now(), newest_data(), stale_after(config)),
        help="The newest stored data is the last successful scrape of any target.",
    )
