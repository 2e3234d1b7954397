"""One data version per script run: every section of a page computes as of one tick.

The store's data version (kneepoint/prepared.py) and its tick move with each round, and on
a quiet store with the wall clock, so a page run that read it for each section (the
Overview's status line, tiles and charts, the chart markers, the footer) could key its
later sections on a newer version than its first, one that nobody had warmed: each of
them computed afresh, at fleet size for seconds, and the sections of one page disagreed on
"now". So a script run reads the version once and keeps it in the session's state:

- A full run: app/main.py reads it at its start (`begin`), before any section asks.
- A fragment that reruns alone (`st.fragment(run_every=…)`, the Overview's sections and the
  footer): its first read is fresh, since a refreshing section exists to show new data,
  and the rest of that fragment run reads the same (the fragments Streamlit reruns together
  share it); the next fragment run reads afresh.
- A page script run alone (tests run app/screens/*.py directly) pins nothing, and outside a
  script run (the warmer, benches, scripts) nothing is pinned: every read is fresh there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kneepoint.prepared import Version

KEY = "kneepoint.run_version"  # in st.session_state: the version this session's run reads
Read = Callable[[str], Version]


@dataclass(frozen=True)
class Pinned:
    """The version a script run read, for the config file `path`."""

    path: str
    # Which run read it: None for a full run (begun by app/main.py), else the fragment run's
    # list of fragment ids, an object Streamlit makes anew for each fragment run (held here,
    # so no later list can take its identity).
    run: object | None
    version: Version


def begin(path: str, read: Read) -> Version:
    """Read the version for this full script run: what every section of it computes as of."""
    found = read(path)
    state, _ = _this_run()
    if state is not None:
        state[KEY] = Pinned(path, None, found)
    return found


def current(path: str, read: Read) -> Version | None:
    """The version of this script run (read by the first call of a fragment run); None
    where no run keeps one: outside a script run, or in a full run `begin` did not start."""
    state, run = _this_run()
    if state is None:
        return None
    pinned = state[KEY] if KEY in state else None  # noqa: SIM401  SafeSessionState: no get
    if isinstance(pinned, Pinned) and pinned.path == path and pinned.run is run:
        return pinned.version
    if run is None:  # a full run that app/main.py did not begin: a page script run alone
        return None
    found = read(path)  # a fragment run's first read, kept for the rest of it
    state[KEY] = Pinned(path, run, found)
    return found


def _this_run() -> tuple[Any, object | None]:
    """The session's state (None outside a script run) and which fragment run this is
    (None: a full run)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx(suppress_warning=True)
    if ctx is None:
        return None, None
    return ctx.session_state, ctx.fragment_ids_this_run or None
