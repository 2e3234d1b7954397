"""One data version per script run: every section of a page computes as of the same tick.

The tick (kneepoint/prepared.py) follows the wall clock on a quiet store and the newest
round on a live one, so it can move while a page runs. A page run that read it again for
each section (the Overview has three, plus the chart markers and the footer) keyed the later
sections on a version nobody had warmed and computed them again: at 1,000 replicas the
Overview's warm run took 9 to 14 s, against 0.4 s right after the warmer's round.

Pages run as the router runs them (app/main.py, through AppTest), on the store and clock of
tests/app/test_page_calls.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from streamlit.runtime.scriptrunner_utils.script_requests import RerunData
from streamlit.testing.v1 import AppTest

from app import run_version
from kneepoint import prepared
from kneepoint.prepared import Version
from tests.app import test_page_calls as page_calls
from tests.app.test_page_calls import MAIN, SCRAPE, Clock, a_round, page_run, title

# test_page_calls's fixtures, by the names tests ask for: its store, held clock and counts.
seeded, clock, calls = page_calls.seeded, page_calls.clock, page_calls.calls


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The store's data version reads (kneepoint/prepared.py `version`), counted."""
    counted: Counter[str] = Counter()
    real = prepared.version

    def counting(*args: Any) -> Version:
        counted["version"] += 1
        return real(*args)

    monkeypatch.setattr(prepared, "version", counting)
    return counted


class Moving:
    """`clock` one scrape interval later at every read of it: on the quiet seeded store each
    version read gives a new tick, as a long page run at fleet size sees."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def time(self) -> float:
        self.clock.at += SCRAPE
        return self.clock.at


@pytest.fixture
def moving(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    """The app's wall clock moving at every read (`Moving`)."""
    import app.data

    monkeypatch.setattr(app.data, "time", Moving(clock))
    yield clock


@pytest.mark.parametrize(
    ("page", "shown"), [("overview", "Overview"), ("capacity", "Capacity"), ("gpus", "GPUs")]
)
def test_a_page_run_reads_the_data_version_once(
    seeded: Path, moving: Clock, reads: Counter[str], page: str, shown: str
) -> None:
    app = page_run(page)
    assert title(app) == shown
    assert reads["version"] == 1, f"{page} read the version {reads['version']} times in one run"


def test_every_overview_section_computes_as_of_one_tick_while_the_tick_moves(
    seeded: Path, moving: Clock, calls: Counter[str]
) -> None:
    """The status line, the tiles and the charts read one status (`data.status(300, now)`):
    computed once, not once per section at each section's own tick."""
    page_run("overview")
    assert calls["build_status"] == 1, dict(calls)


def test_a_round_written_during_a_page_run_shows_in_the_next_run(
    seeded: Path, clock: Clock, calls: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round stored while the Overview computes its first section: the rest of that run
    keeps its version (one status computed), the next run computes the round's."""
    import app.data

    real = app.data.build_status
    written: list[float] = []

    def status_then_a_round(*args: Any) -> Any:
        found = real(*args)
        if not written:
            written.append(clock.at - 0.5)
            a_round(seeded, written[0])
        return found

    monkeypatch.setattr(app.data, "build_status", status_then_a_round)
    page_run("overview")
    assert written and calls["build_status"] == 1, dict(calls)
    calls.clear()
    page_run("overview")
    assert calls["build_status"] == 1, "the next run did not compute the new round"


# -- a fragment that reruns alone (st.fragment(run_every=...)): its own fresh version, once --


def overview_run() -> AppTest:
    """A full run of the Overview, kept: its fragments (status line, tiles, charts, footer)
    can then rerun alone in the same session."""
    app = AppTest.from_file(MAIN, default_timeout=60)
    app.query_params["page"] = "overview"
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def fragment_rerun(app: AppTest, monkeypatch: pytest.MonkeyPatch, count: int = 0) -> None:
    """Rerun the page's fragments alone (the first `count`; 0: all, as auto-reruns due at
    once are rerun together), as the browser asks for a `run_every` fragment: AppTest has no
    call for it, so its request carries the fragment ids (AppTest keeps the fragments of the
    session's runs, as a served session does)."""
    import streamlit.testing.v1.local_script_runner as runner

    ids = list(app._fragment_storage._fragments)  # registered by the full run, in its order
    assert len(ids) >= 3, ids
    queued = ids[:count] if count else ids

    def fragments_only(**kwargs: Any) -> RerunData:
        return RerunData(
            **kwargs,
            fragment_id_queue=list(queued),
            is_auto_rerun=True,
            is_fragment_scoped_rerun=True,
        )

    with monkeypatch.context() as patched:
        patched.setattr(runner, "RerunData", fragments_only)
        app.run()
    assert not app.exception, [e.value for e in app.exception]


def test_a_fragment_rerun_reads_a_fresh_version_once_for_all_its_sections(
    seeded: Path,
    clock: Clock,
    calls: Counter[str],
    reads: Counter[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a round, the Overview's sections rerun alone: they show the round (its status
    computed, once) and read the version once between them, though the tick moves."""
    page = overview_run()
    reads.clear()
    calls.clear()
    a_round(seeded, clock.at - 0.5)
    import app.data

    monkeypatch.setattr(app.data, "time", Moving(clock))
    fragment_rerun(page, monkeypatch)
    assert reads["version"] == 1, f"{reads['version']} version reads in one fragment run"
    assert calls["build_status"] == 1, dict(calls)  # the new round's, not the full run's
    assert calls["timeline.events"] == 0  # no chart marker is read again by a fragment


def test_each_fragment_run_reads_its_own_version(
    seeded: Path, clock: Clock, reads: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    page = overview_run()
    reads.clear()
    fragment_rerun(page, monkeypatch, count=1)
    fragment_rerun(page, monkeypatch, count=1)
    assert reads["version"] == 2


# -- which run reads what (app/run_version.py), with Streamlit's run context faked ----------


class Store:
    """A store whose version moves at every read: each read is a new tick."""

    def __init__(self) -> None:
        self.reads = 0

    def read(self, path: str) -> Version:
        self.reads += 1
        return Version(samples=(float(self.reads),), changes=(), tick=1000.0 + self.reads)


@pytest.fixture
def context(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """Streamlit's script run context as app/run_version.py reads it: the session's state
    and the fragments this run reruns (None: a full run)."""
    import streamlit.runtime.scriptrunner

    ctx = SimpleNamespace(session_state={}, fragment_ids_this_run=None)
    monkeypatch.setattr(streamlit.runtime.scriptrunner, "get_script_run_ctx", lambda **_: ctx)
    return ctx


def test_a_full_run_reads_once_at_its_start(context: SimpleNamespace) -> None:
    store = Store()
    begun = run_version.begin("a.yaml", store.read)
    assert [run_version.current("a.yaml", store.read) for _ in range(3)] == [begun] * 3
    assert store.reads == 1
    context.session_state = {}  # a page script run alone (no app/main.py): nothing kept
    assert run_version.current("a.yaml", store.read) is None


def test_a_fragment_rerun_alone_reads_a_fresh_version_once(context: SimpleNamespace) -> None:
    """A refreshing section shows new data: its own run reads the version at its first
    need, the fragments rerun with it share that one, the next fragment run reads again."""
    store = Store()
    full = run_version.begin("a.yaml", store.read)
    context.fragment_ids_this_run = ["landing", "tiles"]  # rerun together
    refreshed = run_version.current("a.yaml", store.read)
    assert refreshed is not None and refreshed.tick > full.tick
    assert run_version.current("a.yaml", store.read) == refreshed and store.reads == 2
    context.fragment_ids_this_run = ["landing", "tiles"]  # the next fragment run, equal ids
    again = run_version.current("a.yaml", store.read)
    assert again is not None and again.tick > refreshed.tick and store.reads == 3
    context.fragment_ids_this_run = None  # a full run begins anew
    assert run_version.begin("a.yaml", store.read).tick > again.tick


def test_another_config_file_is_not_read_from_the_run_s_version(
    context: SimpleNamespace,
) -> None:
    store = Store()
    run_version.begin("a.yaml", store.read)
    assert run_version.current("b.yaml", store.read) is None  # read afresh by app/data.py


def test_outside_a_script_run_nothing_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    import streamlit.runtime.scriptrunner

    monkeypatch.setattr(streamlit.runtime.scriptrunner, "get_script_run_ctx", lambda **_: None)
    store = Store()
    run_version.begin("a.yaml", store.read)  # e.g. a bench or the warmer: read, kept nowhere
    assert run_version.current("a.yaml", store.read) is None and store.reads == 1
