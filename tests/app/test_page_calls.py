"""What a page run computes: counted calls of the kernel's expensive functions, with the page
run as the router runs it (app/main.py), on a seeded store and a held clock.

A page computes nothing it does not show (no timeline for chart markers on a page without a
time-series chart); a second run with unchanged data, a click or another session, computes
nothing (the caches key on the store's data version, kneepoint/prepared.py, not the wall
clock); a new round or a mutation makes the next run compute, and shows at once."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
from alerts.rules import effective_rules
from alerts.slo import burn_rules
from app import warm
from app.registry import PAGES
from collectors.engines.vllm import parse_vllm
from kneepoint.annotations import annotate
from kneepoint.auth import Identity
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.models import AlertRow, ReplicaSampleRow
from kneepoint.store.writer import ensure_targets, record_replica
from tests.conftest import VLLM_032, read
from tests.seed import seed

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "app" / "main.py")
# The expensive kernel functions, by the module attribute the app calls them through.
KERNEL = {
    "build_status": ("app.data", "build_status"),
    "build_view": ("app.data", "build_view"),
    "replica_series": ("app.data", "replica_series"),
    "slo_reports": ("alerts.evaluate", "slo_reports"),
    "build_report": ("app.data", "build_report"),
    "timeline.events": ("kneepoint.timeline", "events"),
    "causes.gather": ("kneepoint.causes", "gather"),
    "forecasts": ("kneepoint.forecast", "forecasts"),
}
SCRAPE = 5.0  # tests/seed.py's scrape_interval


class Clock:
    """The app's wall clock (app/data.py's `time`), held still unless a test moves it."""

    def __init__(self, at: float) -> None:
        self.at = at

    def time(self) -> float:
        return self.at


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Each kernel function wrapped to count its calls (the work still done)."""
    import importlib

    counted: Counter[str] = Counter()
    for name, (module_name, attribute) in KERNEL.items():
        module = importlib.import_module(module_name)
        real = getattr(module, attribute)

        def counting(
            *args: Any, _real: Callable[..., Any] = real, _name: str = name, **kwargs: Any
        ) -> Any:
            counted[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, attribute, counting)
    return counted


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A clock 1 s into a scrape interval, so moving it 2 s stays within that interval."""
    import app.data

    held = Clock(math.floor(time.time() / SCRAPE) * SCRAPE + 1.0)
    monkeypatch.setattr(app.data, "time", SimpleNamespace(time=held.time))
    return held


@pytest.fixture
def seeded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock, calls: Counter[str]
) -> Iterator[Path]:
    # The newest row is 5 s old at the clock: the collector is quiet, "now" is the clock
    # floored to the scrape interval.
    config = seed(tmp_path, clock.at, minutes=20)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    st.cache_data.clear()  # nothing computed for another test's store counts here
    yield config
    st.cache_data.clear()


def page_run(page: str) -> AppTest:
    app = AppTest.from_file(MAIN, default_timeout=60)
    app.query_params["page"] = page
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def title(app: AppTest) -> str:
    return str(app.title[0].value)


def a_round(config_file: Path, at: float) -> None:
    """A collection round stored at `at`: a sample of replica-a."""
    config = load_config(config_file)
    sessions = open_store(config.database)
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        sample = copy.deepcopy(parse_vllm(read(VLLM_032)))
        record_replica(session, ids["replica-a"], at, sample)


@pytest.mark.parametrize(
    ("page", "shown_title"),
    [("health", "Collector health"), ("audit", "Audit"), ("knee", "Knee points")],
)
def test_a_page_without_a_time_series_chart_reads_no_timeline_and_no_view(
    seeded: Path, calls: Counter[str], page: str, shown_title: str
) -> None:
    app = page_run(page)
    assert title(app) == shown_title
    assert calls["timeline.events"] == 0, "chart markers read on a page that draws no chart"
    for unseen in ("build_view", "build_status", "slo_reports", "causes.gather", "build_report"):
        assert calls[unseen] == 0, f"{page} computed {unseen} without showing it"


def test_a_second_run_or_another_page_with_the_same_data_computes_nothing(
    seeded: Path, calls: Counter[str], clock: Clock
) -> None:
    first = page_run("capacity")
    assert title(first) == "Capacity"
    assert calls["build_view"] >= 1 and calls["timeline.events"] == 1  # charts mark changes
    calls.clear()
    clock.at += 2.0  # a click two seconds later: the same scrape interval, no new data
    again = page_run("capacity")
    assert title(again) == "Capacity"
    assert sum(calls.values()) == 0, dict(calls)
    # Another session opens a page that shows the same view and range: read, not computed.
    gpus = page_run("gpus")
    assert title(gpus) == "GPUs"
    assert calls["build_view"] == 0 and calls["timeline.events"] == 0, dict(calls)


def test_the_overview_refresh_with_unchanged_data_computes_nothing(
    seeded: Path, calls: Counter[str], clock: Clock
) -> None:
    page_run("overview")
    assert calls["build_status"] >= 1
    calls.clear()
    clock.at += 2.0
    page_run("overview")
    assert sum(calls.values()) == 0, dict(calls)


def test_a_new_round_makes_the_next_run_compute(
    seeded: Path, calls: Counter[str], clock: Clock
) -> None:
    page_run("capacity")
    calls.clear()
    a_round(seeded, clock.at - 0.5)  # the clock has not moved: only the data did
    page_run("capacity")
    assert calls["build_view"] >= 1 and calls["timeline.events"] == 1, dict(calls)


def test_a_mutation_shows_at_once(seeded: Path, calls: Counter[str], clock: Clock) -> None:
    before = page_run("timeline")
    assert calls["timeline.events"] == 1
    assert not any("prompt v42" in str(cell) for cell in _cells(before))
    config = load_config(seeded)
    operator = Identity("ci", "operator", "cli")
    annotate(open_store(config.database).begin, operator, "prompt v42", None, None, clock.at)
    after = page_run("timeline")
    assert calls["timeline.events"] == 2
    assert any("prompt v42" in str(cell) for cell in _cells(after))


def _cells(app: AppTest) -> list[object]:
    return [value for frame in app.dataframe for value in frame.value.to_numpy().ravel()]


def test_the_pages_named_here_are_the_routers() -> None:
    assert {"health", "audit", "knee", "capacity", "gpus", "overview", "timeline"} <= {
        spec.url_path for spec in PAGES
    }


# -- the warmer (app/warm.py): a new round computed before the next page run asks ---------


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> warm.Registry:
    """The calls of this test's page runs only."""
    fresh = warm.Registry()
    monkeypatch.setattr(warm, "REGISTRY", fresh)
    return fresh


def warmer_of(config: Path, registry: warm.Registry) -> warm.Warmer:
    """The served app's warmer, run here by the test (AppTest's runtime starts none)."""
    import app.data

    return warm.Warmer(str(config.resolve()), app.data.read_version, registry)


# Pages whose run after a new round computes an expensive function (test above). The SLOs
# and Alerts pages read nothing a round changes on this store (no SLO, no alert): they are
# tested on one with both below.
WARMED_PAGES = ["overview", "capacity", "gpus", "timeline"]


@pytest.mark.parametrize("page", WARMED_PAGES)
def test_after_a_new_round_and_the_warmer_a_page_run_computes_nothing(
    seeded: Path, calls: Counter[str], clock: Clock, registry: warm.Registry, page: str
) -> None:
    warmer = warmer_of(seeded, registry)
    page_run(page)
    warmer.once()  # the version it starts from: what the page asked is recorded
    a_round(seeded, clock.at - 0.5)
    calls.clear()
    assert warmer.once() and warmer.failed == 0
    warmed = sum(calls.values())
    calls.clear()
    again = page_run(page)
    assert sum(calls.values()) == 0, f"{page} computed {dict(calls)} after the warmer"
    assert warmed >= 1, "the round changed nothing the page reads"
    assert title(again) == title(page_run(page))


def test_a_failing_warm_call_leaves_the_page_computing_it(
    seeded: Path,
    calls: Counter[str],
    clock: Clock,
    registry: warm.Registry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import app.data

    real = app.data.build_view

    def broken_while_warming(*args: Any) -> Any:
        if warm.warming():
            raise RuntimeError("the warmer's view broke")
        return real(*args)

    monkeypatch.setattr(app.data, "build_view", broken_while_warming)
    warmer = warmer_of(seeded, registry)
    page_run("capacity")
    warmer.once()
    a_round(seeded, clock.at - 0.5)
    with caplog.at_level(logging.ERROR, logger="app.warm"):
        assert warmer.once()
    assert warmer.failed >= 1 and "the warmer's view broke" in caplog.text
    calls.clear()
    after = page_run("capacity")  # page_run asserts that it raised nothing
    assert title(after) == "Capacity"
    assert calls["build_view"] >= 1  # the page computed what the warmer could not


def test_what_the_warmer_cached_equals_the_direct_computation(
    seeded: Path, calls: Counter[str], clock: Clock, registry: warm.Registry
) -> None:
    warmer = warmer_of(seeded, registry)
    for page in ("overview", "capacity", "slos", "timeline"):
        page_run(page)
    warmer.once()
    a_round(seeded, clock.at - 0.5)
    assert warmer.once()
    path = str(seeded.resolve())
    made = registry.advance(path, app_version(path))  # the same calls, for the same version
    assert len(made) >= 5
    for spec, args in made:
        calls.clear()
        cached = spec.call(*args)
        assert sum(calls.values()) == 0, f"{spec.name} was not warmed"
        assert same(cached, spec.call.__wrapped__(*args)), spec.name  # type: ignore[attr-defined]


def app_version(path: str) -> Any:
    import app.data

    return app.data.read_version(path)


def same(a: Any, b: Any) -> bool:
    """Equal values, DataFrames and NaN included, through dataclasses and containers."""
    if isinstance(a, pd.DataFrame | pd.Series):
        return isinstance(b, type(a)) and a.equals(b)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(
            same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


# -- likely causes (app/insight.py): read after a round and the warmer, never per alert -----

ONSETS = 36  # pending alerts with onsets 30 s steps apart: more than a cache's KEPT entries


@pytest.fixture
def troubled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock, calls: Counter[str]
) -> Iterator[Path]:
    """A spent SLO budget (its burn-rate alerts fire), a stalled and a down replica
    (tests/app/test_overview_landing.py `troubled_store`), and ONSETS pending alerts that
    each went pending in another 30 s step of the last 20 minutes."""
    from tests.app.test_overview_landing import troubled_store

    config = troubled_store(tmp_path)
    sessions = open_store(load_config(config).database)
    with sessions.begin() as session:
        for number in range(ONSETS):
            began = clock.at - 60.0 - 30.0 * number
            session.add(
                AlertRow(
                    fingerprint=f"pending-{number}",
                    rule="kv-cache-saturated",
                    replica=f"replica-{number}",
                    state="pending",
                    value=0.95,
                    threshold=0.9,
                    pending_since=began,
                    fired_at=None,
                    resolved_at=None,
                    updated_at=began,
                    notified_at=None,
                )
            )
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    st.cache_data.clear()
    yield config
    st.cache_data.clear()


def a_copied_round(config_file: Path, at: float) -> None:
    """A collection round stored at `at`: every replica's newest sample again (the same
    counters: nothing served since), as a collector that found no change writes it."""
    from sqlalchemy import text

    sessions = open_store(load_config(config_file).database)
    with sessions.begin() as session:
        columns = [c.name for c in ReplicaSampleRow.__table__.columns]
        copied = ", ".join(":at" if c == "ts" else c for c in columns)
        session.execute(
            text(
                f"INSERT INTO replica_samples ({', '.join(columns)}) SELECT {copied} "
                "FROM replica_samples AS s WHERE ts = (SELECT max(ts) FROM replica_samples "
                "WHERE target_id = s.target_id)"
            ),
            {"at": at},
        )
        session.execute(
            text("UPDATE targets SET last_scrape_at = :at WHERE last_scrape_at IS NOT NULL"),
            {"at": at},
        )


def causes_shown(app: AppTest) -> list[str]:
    """The likely causes a page names: the Alerts page's lines, the SLOs page's warnings."""
    lines = [
        m.value
        for m in app.markdown
        if re.match(r"\*\*[^*]+\*\* on .* \((firing|pending)\)", m.value)
    ]
    return lines + [w.value for w in app.warning if w.value.startswith("Likely cause: ")]


@pytest.mark.parametrize("page", ["alerts", "slos"])
def test_after_new_rounds_and_the_warmer_likely_causes_are_read_not_computed(
    troubled: Path, calls: Counter[str], clock: Clock, registry: warm.Registry, page: str
) -> None:
    """An SLO burn's onset (now − its window) moves with every round, and the Alerts page
    lists more onsets than a cache keeps: after the warmer, the page still computes nothing
    (on 9642920 it read the timeline again for every moved or evicted onset)."""
    warmer = warmer_of(troubled, registry)
    before = causes_shown(page_run(page))
    burns = [line for line in before if "-burn-" in line or line.startswith("Likely cause")]
    assert burns, "no SLO burn on the page: the test would prove nothing"
    if page == "alerts":
        assert len(before) >= ONSETS + 3  # the seeded ones, burns, stalled, down, a ticket
    warmer.once()
    clock.at += 45.0  # three rounds on: every burn's onset moved to another 30 s step
    a_copied_round(troubled, clock.at - 0.5)
    calls.clear()
    assert warmer.once() and warmer.failed == 0
    assert calls["causes.gather"] == 1, dict(calls)  # the signals, once, by the warmer
    calls.clear()
    after = causes_shown(page_run(page))
    assert sum(calls.values()) == 0, f"{page} computed {dict(calls)} after the warmer"
    assert len(after) == len(before)


def test_every_alert_s_cause_in_one_call_equals_each_alert_s_own(
    troubled: Path, clock: Clock
) -> None:
    """insight.alert_causes (one cached call) gives each alert the cause insight.cause
    gives it alone, as the Alerts page computed it per alert before."""
    import app.data
    from app import insight
    from kneepoint import causes

    now = app.data.now()
    every = insight.alert_causes(now)
    current, _ = app.data.alerts(now - 3600.0, now)
    config = load_config(troubled)
    metrics = {r.name: r.metric for r in effective_rules(config) + burn_rules(config.slos)}
    assert len(every) == len(current) >= ONSETS + 3
    for alert in current.itertuples():
        replica = None if alert.replica == "fleet" else str(alert.replica)
        pending = None if pd.isna(alert.pending_since) else alert.pending_since.timestamp()
        began = causes.onset(metrics.get(str(alert.rule), ""), now, pending)
        assert every[str(alert.fingerprint)] == insight.cause(now, replica, began), alert.rule


def test_slo_reports_are_computed_once_a_minute_not_every_round(
    troubled: Path, calls: Counter[str], clock: Clock, registry: warm.Registry
) -> None:
    """As alert evaluation recomputes burn rates once a minute, the warmer recomputes the
    SLO reports when the tick enters a new minute, not for each round within it (on 9642920
    every round, the costliest call it makes); the Overview still reads them all. With no
    leader storing them (alerts/slo_prepared.py: its rows deleted here; pages that find them
    compute nothing, tests/app/test_slo_prepared_page.py)."""
    from sqlalchemy import delete

    import app.data
    from kneepoint.store.models import PreparedRow

    with open_store(load_config(troubled).database).begin() as session:
        session.execute(delete(PreparedRow))
    warmer = warmer_of(troubled, registry)
    assert "budget exhausted" in " ".join(m.value for m in page_run("overview").markdown)
    warmer.once()
    minute = math.floor(app.data.read_version(str(troubled.resolve())).tick / 60) * 60 + 60
    for at, made in ((minute + 1, 1), (minute + 31, 0)):  # a new minute, then a round in it
        a_copied_round(troubled, at)
        clock.at = at + 0.5
        calls.clear()
        assert warmer.once() and warmer.failed == 0
        assert calls["slo_reports"] == made, (at - minute, dict(calls))
        assert calls["build_status"] >= 1  # the round's status is made again all the same
    calls.clear()
    shown = " ".join(m.value for m in page_run("overview").markdown)
    assert sum(calls.values()) == 0, dict(calls)
    assert "budget exhausted" in shown
