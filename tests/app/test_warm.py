"""The warmer's bookkeeping (app/warm.py) without a store: which calls it makes again for a
new data version, with which arguments, which it drops, and that nothing it does raises.
The page runs it warms are in tests/app/test_page_calls.py."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
import streamlit as st

from app import warm
from kneepoint.prepared import Version

PATH = "/etc/kneepoint.yaml"


def version(tick: float, samples: float = 1.0) -> Version:
    return Version(samples=(samples,), changes=(0.0,), tick=tick)


class Made:
    """A cached function's stand-in: the arguments of each call."""

    def __init__(self) -> None:
        self.args: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        self.args.append(args)
        return args


def spec(
    call: Any, part: warm.Part | None = "samples", times: tuple[int, ...] = (2,), step: float = 0.0
) -> warm.Spec:
    """def f(path, window, now, version), or as told."""
    return warm.Spec("f", call, part, 3 if part else None, times, step)


def test_a_call_is_made_again_at_the_new_tick_with_the_new_version() -> None:
    registry = warm.Registry()
    f = spec(Made(), times=(2, 3), part=None)  # f(path, window, start, end)
    old, new = version(1000.0), version(1015.0, samples=2.0)
    registry.record(f, PATH, (PATH, 3600.0, 1000.0 - 3600.0, 1000.0), old.tick, kept=False)
    assert registry.advance(PATH, new) == [(f, (PATH, 3600.0, 1015.0 - 3600.0, 1015.0))]
    g = spec(Made())  # g(path, window, now, version): the version's samples
    registry.record(g, PATH, (PATH, 300.0, 1015.0, new.samples), new.tick, kept=False)
    newer = version(1030.0, samples=3.0)
    assert (g, (PATH, 300.0, 1030.0, (3.0,))) in registry.advance(PATH, newer)


def test_a_time_floored_to_a_step_moves_to_the_new_ticks_step() -> None:
    registry = warm.Registry()
    weekly = spec(Made(), part=None, times=(1,), step=300.0)  # weekly(path, now // 300 * 300)
    registry.record(weekly, PATH, (PATH, 900.0), 1195.0, kept=False)
    assert registry.advance(PATH, version(1205.0)) == [(weekly, (PATH, 1200.0))]


def test_a_call_not_asked_for_within_the_rounds_is_dropped_the_default_views_kept_longer() -> None:
    registry = warm.Registry(rounds=2, pinned_rounds=3)
    f, default = spec(Made()), spec(Made(), times=())
    moment = warm.Spec("onset", Made(), "samples", 2, (), 0.0, pin=False)
    registry.record(f, PATH, (PATH, 60.0, 1000.0, None), 1000.0, kept=False)
    registry.record(default, PATH, (PATH, 3600.0, 1000.0, None), 1000.0, kept=True)
    registry.record(moment, PATH, (PATH, 900.0, None), 1000.0, kept=True)  # not a view
    assert len(registry.advance(PATH, version(1015.0))) == 3
    assert len(registry.advance(PATH, version(1030.0))) == 3
    assert [s for s, _ in registry.advance(PATH, version(1045.0))] == [default]
    assert [s for s, _ in registry.advance(PATH, version(1060.0))] == []


def test_at_most_the_limit_newest_ask_first() -> None:
    registry = warm.Registry(limit=3)
    f = spec(Made())
    for window in (1.0, 2.0, 3.0, 4.0):
        registry.record(f, PATH, (PATH, window, 1000.0, None), 1000.0, kept=False)
    assert [args[1] for _, args in registry.advance(PATH, version(1015.0))] == [4.0, 3.0, 2.0]


class Store:
    """The data version as a test sets it; reading it can be made to fail."""

    def __init__(self, at: Version) -> None:
        self.at, self.failures = at, 0

    def read(self, path: str) -> Version:
        if self.failures:
            self.failures -= 1
            raise OSError("database is down")
        return self.at


def test_a_failing_call_is_logged_and_the_others_are_still_made(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry, made = warm.Registry(), Made()

    def broken(*args: Any) -> None:
        raise ValueError("no such column")

    registry.record(spec(made), PATH, (PATH, 1.0, 1000.0, None), 1000.0, kept=False)
    registry.record(spec(broken), PATH, (PATH, 2.0, 1000.0, None), 1000.0, kept=False)
    store = Store(version(1015.0))
    warmer = warm.Warmer(PATH, store.read, registry)
    with caplog.at_level(logging.ERROR, logger="app.warm"):
        assert warmer.once()
    assert made.args == [(PATH, 1.0, 1015.0, (1.0,))]
    assert (warmer.computed, warmer.failed, warmer.warmed) == (2, 1, store.at)
    assert "no such column" in caplog.text
    assert not warmer.once()  # the same version: nothing made again
    assert len(made.args) == 1


def test_a_version_that_moves_during_the_replay_stops_it_for_the_newer() -> None:
    registry, store = warm.Registry(), Store(version(1015.0))
    first, second = Made(), Made()

    def moving(*args: Any) -> None:
        first(*args)
        store.at = version(1030.0, samples=2.0)  # a round written meanwhile

    registry.record(spec(second), PATH, (PATH, 2.0, 1000.0, None), 1000.0, kept=False)
    registry.record(spec(moving), PATH, (PATH, 1.0, 1000.0, None), 1000.0, kept=False)
    warmer = warm.Warmer(PATH, store.read, registry)
    assert not warmer.once() and second.args == [] and warmer.warmed is None
    assert warmer.once()
    assert second.args == [(PATH, 2.0, 1030.0, (2.0,))] and warmer.warmed == store.at


def test_settle_replays_until_the_version_read_now_is_warmed() -> None:
    registry, store = warm.Registry(), Store(version(1015.0))
    later = Made()

    def moving(*args: Any) -> None:
        store.at = version(1030.0, samples=2.0)

    registry.record(spec(later), PATH, (PATH, 2.0, 1000.0, None), 1000.0, kept=False)
    registry.record(spec(moving), PATH, (PATH, 1.0, 1000.0, None), 1000.0, kept=False)
    warmer = warm.Warmer(PATH, store.read, registry)
    assert warmer.settle()
    assert warmer.warmed == store.at and later.args == [(PATH, 2.0, 1030.0, (2.0,))]


def test_the_thread_outlives_a_store_that_cannot_be_read() -> None:
    registry, made = warm.Registry(), Made()
    registry.record(spec(made), PATH, (PATH, 1.0, 1000.0, None), 1000.0, kept=False)
    store = Store(version(1015.0))
    store.failures = 2
    warmer = warm.Warmer(PATH, store.read, registry, poll=0.01).start()
    try:
        deadline = time.monotonic() + 30
        while warmer.warmed is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        warmer.stop()
    assert warmer.warmed == store.at and made.args == [(PATH, 1.0, 1015.0, (1.0,))]


def test_a_page_asking_while_the_warmer_computes_waits_for_its_result() -> None:
    """st.cache_data computes one key once: the second caller waits, then reads."""
    started, release = threading.Event(), threading.Event()
    computed: list[float] = []

    @st.cache_data(show_spinner=False)
    def slow(path: str, now: float) -> float:
        computed.append(now)
        started.set()
        release.wait(30)
        return now * 2

    st.cache_data.clear()
    results: list[float] = []
    warmer = threading.Thread(target=lambda: results.append(slow(PATH, 21.0)))
    warmer.start()
    assert started.wait(30)
    page = threading.Thread(target=lambda: results.append(slow(PATH, 21.0)))
    page.start()
    page.join(0.5)  # time for the page to reach the cache (it must not compute meanwhile)
    release.set()
    warmer.join(30)
    page.join(30)
    assert computed == [21.0] and results == [42.0, 42.0]


def test_one_warmer_per_config_file_started_on_first_need(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(warm, "_WARMERS", {})
    store = Store(version(1015.0))
    first = warm.ensure(PATH, store.read)
    try:
        assert warm.ensure(PATH, store.read) is first
        assert [t.name for t in threading.enumerate()].count(warm.THREAD) >= 1
    finally:
        first.stop()


def test_an_apptest_runtime_is_not_a_served_app() -> None:
    from streamlit.testing.v1 import AppTest

    app = AppTest.from_function(_served_page)
    app.run()
    assert not app.exception and app.markdown[0].value == "served: False"


def _served_page() -> None:
    import streamlit as st

    from app import warm

    st.markdown(f"served: {warm.served()}")


def test_a_call_made_inside_a_cached_computation_is_replayed_with_it_not_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The changes before an onset that moves with the tick, read inside every alert's
    likely causes: recorded on its own, the warmer would replay it at the old onset."""
    registry = warm.Registry()
    monkeypatch.setattr(warm, "REGISTRY", registry)
    made: list[tuple[str, float]] = []

    def known(path: str) -> Version:
        return version(1000.0)

    @warm.versioned(None, ("began",), 0.0, 4, False, known, pin=False)
    def before(path: str, began: float) -> float:
        made.append(("before", began))
        return began

    @warm.versioned(None, ("now",), 0.0, 4, False, known)
    def causes(path: str, now: float) -> float:
        made.append(("causes", now))
        return before(path, now - 3600.0)  # an onset an hour before now

    st.cache_data.clear()
    assert causes(PATH, 1000.0) == 1000.0 - 3600.0
    assert made == [("causes", 1000.0), ("before", 1000.0 - 3600.0)]
    assert registry.calls(PATH) == 1
    (replayed,) = registry.advance(PATH, version(1015.0))
    assert replayed == (causes.spec, (PATH, 1015.0))
    st.cache_data.clear()
