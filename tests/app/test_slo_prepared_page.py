"""Pages read the SLO reports the leader's evaluation stored (alerts/slo_prepared.py): with
them stored, the SLOs page and the Overview compute no SLO window (no `measure` call) and show
the stored reports, which equal the direct computation, with their "As of"; with none stored
for this config, or only reports older than slo_prepared.STALE, the app computes them itself
as before. On the store of tests/app/test_page_calls.py's `troubled` fixture (a spent
budget, a stalled and a down replica; its alerts evaluated at two moments 90 s apart)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select

from alerts import evaluate, slo_prepared
from app.format import clock as shown_clock
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.models import PreparedRow
from tests.app.test_page_calls import Clock, calls, clock, page_run, troubled

__all__ = ["calls", "clock", "troubled"]  # the fixtures, used here too


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of evaluate.measure: every SLO window computed, whoever computes it."""
    counted: Counter[str] = Counter()
    real = evaluate.measure

    def counting(*args: Any, **kwargs: Any) -> Any:
        counted["measure"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate, "measure", counting)
    return counted


def _stored(config_file: Path) -> list[float]:
    with open_store(load_config(config_file).database)() as session:
        return list(session.scalars(select(PreparedRow.as_of).order_by(PreparedRow.as_of)))


def _as_of(app: Any) -> str:
    return next(c.value for c in app.caption if str(c.value).startswith("As of"))


def test_pages_read_the_stored_reports_and_compute_no_window(
    troubled: Path, calls: Counter[str], measured: Counter[str], clock: Clock
) -> None:
    import app.data

    stored = _stored(troubled)
    assert len(stored) == 2  # the two evaluations' minutes
    calls.clear()
    slos = page_run("slos")
    overview = page_run("overview")
    assert measured["measure"] == 0 and calls["slo_reports"] == 0, (measured, calls)
    now = app.data.now()
    assert app.data.slo_minute(now) == stored[-1]
    assert _as_of(slos).startswith(f"As of {shown_clock(stored[-1], now)}:")
    assert "budget exhausted" in " ".join(m.value for m in overview.markdown)
    # What they show is what the direct computation gives as of that moment.
    config = load_config(troubled)
    with open_store(config.database)() as session:
        direct = evaluate.slo_reports(session, config, stored[-1])
    assert app.data.slo_reports(now) == direct
    assert direct[0].burning  # the page's reports say something


@pytest.mark.parametrize("why", ["none stored", "only stale ones"])
def test_without_fresh_stored_reports_the_app_computes_them(
    troubled: Path, calls: Counter[str], measured: Counter[str], clock: Clock, why: str
) -> None:
    import app.data

    newest = _stored(troubled)[-1]
    if why == "none stored":
        with open_store(load_config(troubled).database).begin() as session:
            session.execute(delete(PreparedRow))
    else:  # no collector since: the tick follows the wall clock past STALE
        clock.at = newest + slo_prepared.STALE + 120.0
    calls.clear()
    slos = page_run("slos")
    assert calls["slo_reports"] == 1 and measured["measure"] > 0
    now = app.data.now()
    minute = now // 60 * 60
    assert app.data.slo_minute(now) == minute
    assert _as_of(slos).startswith(f"As of {shown_clock(minute, now)}:")
