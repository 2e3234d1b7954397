"""SLO burn rates, table-driven, each case a sentence; then burn alerts over a real store."""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import pytest

from alerts import slo
from alerts.evaluate import evaluate_once, slo_problems
from alerts.lifecycle import FIRING
from collectors.engines.vllm import parse_vllm
from kneepoint.config import Slo, load_config
from kneepoint.samples import Histogram
from kneepoint.store.db import open_store
from kneepoint.store.models import AlertRow
from kneepoint.store.writer import ensure_targets, record_replica
from tests.conftest import VLLM_032, read

TTFT = Slo(name="ttft", metric="ttft", threshold=0.5, objective=0.99)
BOUNDS = (0.1, 0.5, 1.0, math.inf)


def test_the_factors_come_from_the_windows() -> None:
    factors = [round(w.factor(30 * 86400), 6) for w in slo.BURN_WINDOWS]
    assert factors == [14.4, 6.0, 3.0, 1.0]
    assert [w.severity for w in slo.BURN_WINDOWS] == ["page", "page", "ticket", "ticket"]


BURNS = {
    "ten percent slow against a 99 percent objective burns ten times": (
        Histogram(BOUNDS, (50, 90, 99, 100), 40.0),
        10.0,
    ),
    "no slow request burns nothing": (Histogram(BOUNDS, (60, 100, 100, 100), 9.0), 0.0),
    "no request at all has no burn rate": (Histogram(BOUNDS, (0, 0, 0, 0), 0.0), None),
    "no histogram has no burn rate": (None, None),
}


@pytest.mark.parametrize("case", BURNS, ids=list(BURNS))
def test_burn_rate(case: str) -> None:
    window, expected = BURNS[case]
    rate = slo.burn_rate(TTFT, window)
    assert rate == (None if expected is None else pytest.approx(expected))


FIRES = {
    "a fast burn in both the hour and its five minutes pages": (
        {3600: 20.0, 300: 20.0},
        ["1h"],
    ),
    "a burn that stopped five minutes ago does not page": ({3600: 20.0, 300: 0.5}, []),
    "a slower burn over six hours and its half hour pages on the 6h window": (
        {21600: 7.0, 1800: 7.0, 3600: 7.0, 300: 7.0},
        ["6h"],
    ),
    "a steady burn just above one tickets on the three-day window only": (
        {259200: 1.5, 21600: 1.5, 86400: 1.5, 7200: 1.5},
        ["3d"],
    ),
    "missing data in either window fires nothing": ({3600: 20.0, 300: None}, []),
}


@pytest.mark.parametrize("case", FIRES, ids=list(FIRES))
def test_multiwindow_burn_alerts(case: str) -> None:
    rates, expected = FIRES[case]
    assert [slo.window_label(w.long) for w in slo.burning(TTFT, rates)] == expected


def test_budget_and_compliance() -> None:
    spent = slo.budget(TTFT, Histogram(BOUNDS, (50, 99, 100, 100), 10.0))
    assert spent.compliance == pytest.approx(0.99) and spent.budget_left == pytest.approx(0.0)
    over = slo.budget(TTFT, Histogram(BOUNDS, (50, 95, 100, 100), 10.0))
    assert over.budget_left == pytest.approx(1 - 0.05 / 0.01)  # spent five budgets


def test_a_threshold_between_buckets_is_refused_naming_the_neighbours() -> None:
    between = Slo(name="odd", metric="ttft", threshold=2.0, objective=0.99)
    with pytest.raises(slo.ThresholdNotABound, match=r"not a bucket bound .* 1s and 2.5s"):
        slo.check_threshold(between, (0.5, 1.0, 2.5, math.inf))


def test_burn_alerts_over_a_store(tmp_path: Path) -> None:
    """An hour of traffic where 10 % of first tokens take over 250 ms, against a 99 %
    objective: burn 10 everywhere, above the 6h factor (6) and below the 1h one (14.4)."""
    config_file = tmp_path / "kneepoint.yaml"
    config_file.write_text(f"""
database: sqlite:///{tmp_path / "k.db"}
targets: [{{name: a, kind: vllm, url: "http://127.0.0.1:9/metrics"}}]
slos:
  - {{name: ttft, metric: ttft, threshold: 0.25s, objective: 0.99}}
  - {{name: odd, metric: ttft, threshold: 0.3s, objective: 0.99}}
""")
    config = load_config(config_file)
    sessions = open_store(config.database)
    base = parse_vllm(read(VLLM_032))
    bounds = base.histograms["ttft"].bounds
    fast = bounds.index(0.25)  # requests at or under 250 ms land in this and later buckets
    now = time.time()
    with sessions.begin() as session:
        ids = ensure_targets(session, [("a", "vllm", "http://127.0.0.1:9/metrics")])
        for step in range(13):  # every 5 minutes for an hour
            sample = copy.deepcopy(base)
            good, bad = 90.0 * step, 10.0 * step
            # Cumulative: the good ones from the 250 ms bucket on, the slow ones only in +Inf.
            finite = tuple(good if i >= fast else 0.0 for i in range(len(bounds) - 1))
            sample.histograms["ttft"] = Histogram(bounds, (*finite, good + bad), 0.1 * step)
            record_replica(session, ids["a"], now - 3600 + step * 300, sample)
    with sessions.begin() as session:
        evaluate_once(session, config, now)
    with sessions() as session:
        firing = {row.rule for row in session.query(AlertRow).filter(AlertRow.state == FIRING)}
        assert {"ttft-burn-6h", "ttft-burn-1d", "ttft-burn-3d"} <= firing
        assert "ttft-burn-1h" not in firing
        assert not any(name.startswith("odd-burn") for name in firing)
        problems = slo_problems(session, config, now)
    assert problems == [
        "SLO 'odd': threshold 0.3s is not a bucket bound of the ttft histogram "
        "(nearest: 0.25s and 0.5s)"
    ]


def test_the_slos_page_shows_budget_and_burn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamlit.testing.v1 import AppTest

    from app.registry import PAGES_DIR
    from tests.seed import seed

    config_file = seed(tmp_path, time.time())
    config_file.write_text(
        config_file.read_text()
        + "slos:\n"
        + "  - {name: ttft, metric: ttft, threshold: 0.25s, objective: 0.99}\n"
        + "  - {name: odd, metric: ttft, threshold: 0.3s, objective: 0.99}\n"
    )
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config_file))
    page = AppTest.from_file(str(PAGES_DIR / "slos.py"), default_timeout=60).run()
    assert not page.exception, [e.value for e in page.exception]
    headers = [h.value for h in page.subheader]
    assert headers == [
        "ttft: ttft ≤ 0.25 s for 99.00% over 30d",
        "odd: ttft ≤ 0.3 s for 99.00% over 30d",
        "Replay a proposed SLO",  # the form (tests/alerts/test_slo_replay.py)
    ]
    assert "not a bucket bound" in page.error[0].value
    (table,) = [d.value for d in page.dataframe]
    # The factor column under its human header (app/tables.py): the multiple of the budget.
    assert list(table["Fires above (× budget)"].round(6)) == [14.4, 6.0, 3.0, 1.0]
