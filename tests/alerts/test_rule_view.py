"""Evaluation reads the rules' numbers only: the same values as from the pages' whole view,
without building what no rule reads (series, resampling, peaks, knees, costs, events)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import kneepoint.views
from alerts.evaluate import WINDOW, evaluate_once
from alerts.values import values
from kneepoint.config import load_config
from kneepoint.status import hit_rates
from kneepoint.store.db import open_store
from kneepoint.views import build_view
from tests.seed import seed

PAGE_ONLY = ("replica_series", "resample", "gpu_series", "_peaks", "load_runs")


def test_the_rules_view_gives_the_rules_the_values_the_whole_view_gives(tmp_path: Path) -> None:
    now = float(int(time.time()))
    config = load_config(seed(tmp_path, now))
    sessions = open_store(config.database)
    with sessions() as session:
        baseline = hit_rates(session, config, now, 3600.0)
        whole = build_view(session, config, now, WINDOW)
        rules = build_view(session, config, now, WINDOW, pages=False)
    assert rules.status == whole.status
    assert rules.series.empty and not rules.events
    watched = values(rules, baseline)
    assert watched == values(whole, baseline)
    # Not vacuous: the seeded replicas give the view-only numbers rules read.
    assert any(v["recompute_share_of_prefill"] is not None for v in watched.values())


def test_an_evaluation_round_builds_nothing_only_pages_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = float(int(time.time()))
    config = load_config(seed(tmp_path, now))
    sessions = open_store(config.database)
    calls: dict[str, int] = {}
    for name in PAGE_ONLY:
        real = getattr(kneepoint.views, name)

        def counted(*args: object, _real=real, _name=name, **kwargs: object) -> object:  # type: ignore[no-untyped-def]
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(kneepoint.views, name, counted)
    with sessions.begin() as session:
        evaluate_once(session, config, now)
    assert calls == {}
    with sessions() as session:  # the counters see a page's view (else the test proves nothing)
        build_view(session, config, now, WINDOW)
    assert set(calls) == set(PAGE_ONLY)
