"""The changes before a likely cause's onset (app/insight.py `_changes`) are cached under the
whole data version while their span reaches the rounds being written, and, once it ends
insight.SETTLE before the tick, under what can still change a past span (mutations, targets,
rollups): a new round re-reads the changes of the onset that just began, not those of a burn
that began an hour back; an annotation posted for that past hour is read at once."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import streamlit as st
from sqlalchemy import text

from kneepoint import causes, prepared, timeline
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.models import AnnotationRow
from tests.app.test_page_calls import a_copied_round as a_round
from tests.seed import seed


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    config = seed(tmp_path, math.floor(time.time()) - 30, minutes=150)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    st.cache_data.clear()
    yield config.resolve()
    st.cache_data.clear()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    """The spans the timeline was read over."""
    found: list[tuple[float, float]] = []
    events = timeline.events

    def counted(session: Any, config: Any, since: float, until: float, *args: Any) -> Any:
        found.append((since, until))
        return events(session, config, since, until, *args)

    monkeypatch.setattr(timeline, "events", counted)
    return found


def version(config_file: Path) -> prepared.Version:
    """The store's data version, as of its newest write (a live collector's tick)."""
    config = load_config(config_file)
    sessions = open_store(config.database)
    with sessions() as session:
        newest = session.execute(text("SELECT max(last_scrape_at) FROM targets")).scalar_one()
        return prepared.version(session, config, float(newest) + 1.0)


def test_a_settled_span_s_changes_are_read_once_across_rounds(
    store: Path, reads: list[tuple[float, float]]
) -> None:
    from app import insight

    path = str(store)
    first = version(store)
    burn = causes.Onset(first.tick - 3600.0, "the burn began")  # settled: an hour back

    def troubles(tick: float) -> dict[str, causes.Trouble]:
        return {
            "burn": causes.Trouble(None, burn),
            # Pending since 30 s before each tick: its span reaches the rounds.
            "pending": causes.Trouble("replica-a", causes.Onset(tick - 30, "pending")),
        }

    insight._causes(path, first.tick, first.key, troubles(first.tick))
    settled = causes.lookback(burn.at)
    assert settled in reads and len(reads) == 3, reads  # the hour, the burn's, the pending's
    reads.clear()

    a_round(store, first.tick + 15.0)
    second = version(store)
    # The premise: a round moves the newest scrape and the tick, nothing else.
    assert second.tick > first.tick and second.samples[0] != first.samples[0]
    assert second.samples[1:] == first.samples[1:] and second.changes == first.changes
    got = insight._causes(path, second.tick, second.key, troubles(second.tick))
    assert settled not in reads, reads  # the burn's hour of changes, read once
    assert len(reads) == 2, reads  # the new hour, the new pending onset's
    # What the cache kept is what reading it again gives.
    st.cache_data.clear()
    assert insight._causes(path, second.tick, second.key, troubles(second.tick)) == got
    reads.clear()

    # An annotation posted for the burn's past hour: a mutation, read at once.
    sessions = open_store(load_config(store).database)
    with sessions.begin() as session:
        session.add(AnnotationRow(ts=burn.at - 600.0, replica=None, text="deploy", author="ci"))
    third = version(store)
    assert third.changes != second.changes
    found = insight._causes(path, third.tick, third.key, troubles(third.tick))
    assert settled in reads, reads
    assert "deploy" in found["burn"].details.get(causes.SOFTWARE, ""), found
