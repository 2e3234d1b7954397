"""The SLO reports the leader's evaluation stores for pages (alerts/slo_prepared.py): the
stored reports are the direct computation's, read back through JSON; evaluation's burn
values are what burn_rates gave before; a second leader in the same minute reads the first's
row instead of computing again; a follower writes nothing; a row added meanwhile never breaks
the round. On the store tests/alerts/test_slo_sums.py seeds (gaps, restarts, a stale, a
stalled and a wedged replica, a vLLM and an SGLang replica, a maintenance window), on SQLite
and PostgreSQL."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from alerts import evaluate, slo, slo_prepared
from alerts.evaluate import burn_rates, evaluate_once, slo_reports
from alerts.values import FLEET
from collectors.cluster import NOT_LEADER
from collectors.jobs import standard_jobs
from kneepoint.config import Config, Slo
from kneepoint.store import prepared_rows
from kneepoint.store.db import open_store
from kneepoint.store.models import AlertRow, PreparedRow
from tests.alerts.test_slo_sums import NOW, _config, _same, postgres, seeded

__all__ = ["postgres", "seeded"]  # module fixtures of this module too (a store of its own)

pytestmark = pytest.mark.timeout(180)
MINUTE = NOW // 60 * 60  # NOW is 1.7 s into its minute


def _maintained(folder: Path, database: str) -> Config:
    """The seeded SLOs with a maintenance window over one replica for an hour of the
    windows (its `fast` has a problem: 0.25 s is no bound of the SGLang replica's histogram,
    so not of the fleet's), and a latency SLO on a bound of both."""
    start = datetime.fromtimestamp(NOW - 5 * 3600, UTC).isoformat()
    end = datetime.fromtimestamp(NOW - 4 * 3600, UTC).isoformat()
    config = _config(
        folder,
        f"maintenance:\n  - {{name: m, start: '{start}', end: '{end}', replicas: [restarts]}}",
        database=database,
    )
    second = Slo(name="second", metric="ttft", threshold=1.0, objective=0.9)
    return config.model_copy(update={"slos": [*config.slos, second]})


def _copy(seeded: str, folder: Path) -> str:
    """A copy of the module's seeded SQLite store, for a test that writes (SQLite's backup:
    the store runs in WAL mode, so its file alone may not hold every row)."""
    with (
        closing(sqlite3.connect(seeded.removeprefix("sqlite:///"))) as source,
        closing(sqlite3.connect(folder / "copy.db")) as copy,
    ):
        source.backup(copy)
    return f"sqlite:///{folder / 'copy.db'}"


@pytest.fixture(autouse=True)
def no_cached_burns() -> None:
    """Each test a fresh process as far as evaluation's minute cache goes."""
    evaluate._burn_cache.clear()


def _watched(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The fleet values each evaluation round's rules watch, recorded."""
    seen: list[dict[str, Any]] = []
    real = evaluate.evaluate

    def recording(rules: Any, watched: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(dict(watched[FLEET]))
        return real(rules, watched, *args, **kwargs)

    monkeypatch.setattr(evaluate, "evaluate", recording)
    return seen


def _counted(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of the computation evaluation prepares the reports with."""
    counted: Counter[str] = Counter()
    real = evaluate.slo_reports

    def counting(*args: Any, **kwargs: Any) -> list[slo.Report]:
        counted["slo_reports"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate, "slo_reports", counting)
    return counted


def _rows(config: Config) -> list[PreparedRow]:
    with open_store(config.database)() as session:
        return list(session.scalars(select(PreparedRow).order_by(PreparedRow.as_of)))


def _leader_stores_the_direct_reports(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _watched(monkeypatch)
    sessions = open_store(config.database)
    with sessions.begin() as session:
        evaluate_once(session, config, NOW)
    with sessions() as session:
        stored = slo_prepared.stored(session, config, NOW)
        computed = slo_reports(session, config, NOW)
        rates = burn_rates(session, config, NOW)  # what evaluation computed before
        direct = slo_reports(session, config, NOW, direct=True)
    assert stored is not None
    assert stored == computed  # exactly, through JSON
    assert [r.problem is not None for r in stored] == [True, False, False]
    assert all(r.rates for r in stored[1:]) and stored[2].budget.compliance is not None
    # The latency SLO equals the samples' own computation too (the availability one's
    # stalled seconds are judged on runs whole by the sums: test_slo_sums bounds them).
    _same(stored[2].rates, direct[2].rates)
    _same(stored[2].budget.compliance, direct[2].budget.compliance)
    # Evaluation's burn values are burn_rates' at the same moment, as before.
    (watched,) = seen
    wanted = slo.burn_values(config.slos, rates)
    assert {k: v for k, v in watched.items() if k.startswith("slo_burn:")} == wanted
    assert any(v is not None for v in wanted.values())
    (row,) = _rows(config)
    assert (row.kind, row.as_of, row.key) == ("slo_reports", NOW, slo_prepared.fingerprint(config))


def test_the_leader_stores_the_reports_the_direct_computation_gives(
    tmp_path: Path, seeded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _maintained(tmp_path, _copy(seeded, tmp_path))
    _leader_stores_the_direct_reports(config, monkeypatch)


@pytest.mark.real
def test_on_postgresql_the_leader_stores_the_direct_reports(
    postgres: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _maintained(tmp_path, postgres.database.reveal())
    _leader_stores_the_direct_reports(config, monkeypatch)


def test_reports_round_trip_through_json(tmp_path: Path, seeded: str) -> None:
    config = _maintained(tmp_path, seeded)
    with open_store(seeded)() as session:
        reports = slo_reports(session, config, NOW)
    burning = slo.Report(
        config.slos[0],
        slo.Budget(0.5, -49.0),
        {300.0: 51.5, 3600.0: None, 1800.0: 0.1 + 0.2},
        [slo.BURN_WINDOWS[0], slo.BURN_WINDOWS[3]],
    )
    every = [*reports, burning]
    text = slo_prepared.encode(every)
    assert isinstance(json.loads(text), list)  # plain JSON, nothing pickled
    back = slo_prepared.decode(text)
    assert back == every
    assert list(back[-1].rates) == [300.0, 3600.0, 1800.0]  # the windows' order kept
    assert back[-1].rates[1800.0] == 0.1 + 0.2  # floats exactly


def test_a_second_leader_in_the_same_minute_reads_the_first_s_reports(
    tmp_path: Path, seeded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two leaders in turn (serialize_evaluation): the second, in another process (no
    cache of its own), finds the minute's reports and computes nothing; the next minute's
    first round computes and stores them once."""
    config = _maintained(tmp_path, _copy(seeded, tmp_path))
    sessions = open_store(config.database)
    seen, counted = _watched(monkeypatch), _counted(monkeypatch)
    with sessions.begin() as session:
        evaluate_once(session, config, NOW)
    evaluate._burn_cache.clear()  # another leader's process
    with sessions.begin() as session:
        evaluate_once(session, config, NOW + 40)
    assert counted["slo_reports"] == 1
    burns = [{k: v for k, v in w.items() if k.startswith("slo_burn:")} for w in seen]
    assert burns[0] == burns[1]
    assert [r.as_of for r in _rows(config)] == [NOW]
    with sessions.begin() as session:
        evaluate_once(session, config, MINUTE + 60 + 3)
    assert counted["slo_reports"] == 2
    assert [r.as_of for r in _rows(config)] == [NOW, MINUTE + 63]


def test_only_the_newest_few_are_kept_and_a_row_added_meanwhile_breaks_nothing(
    tmp_path: Path, seeded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _maintained(tmp_path, _copy(seeded, tmp_path))
    sessions = open_store(config.database)
    with sessions.begin() as session:
        for n in range(prepared_rows.KEEP + 3):
            assert prepared_rows.write(session, "k", "key", 60.0 * n, f"[{n}]", 0.0)
        assert not prepared_rows.write(session, "k", "key", 60.0 * n, "[]", 0.0)  # written once
    with sessions() as session:
        kept = session.scalars(select(PreparedRow.payload).order_by(PreparedRow.as_of)).all()
    assert kept == [f"[{n}]" for n in range(3, prepared_rows.KEEP + 3)]
    # Another writer's row appears between the check and the insert: the insert alone
    # fails (a savepoint), and the round's other writes are committed.
    monkeypatch.setattr(prepared_rows, "read", lambda *args: None)
    with sessions.begin() as session:
        session.add(
            AlertRow(
                fingerprint="x", rule="r", replica="", state="firing", threshold=1.0, updated_at=0.0
            )
        )
        assert not prepared_rows.write(session, "k", "key", 60.0 * n, "[]", 0.0)
    with sessions() as session:
        assert session.get(AlertRow, "x") is not None
        assert session.scalar(select(func.count()).select_from(PreparedRow)) == prepared_rows.KEEP


class _Member:
    """A collector of a cluster, leading or not (collectors/cluster.py's Cluster)."""

    every = 5.0

    def __init__(self, leads: bool) -> None:
        self.leads = leads

    def is_leader(self) -> bool:
        return self.leads

    def beat(self) -> None:
        pass


def test_a_follower_writes_no_reports_and_the_leader_s_alerts_job_does(
    tmp_path: Path, seeded: str
) -> None:
    config = _maintained(tmp_path, _copy(seeded, tmp_path))
    sessions = open_store(config.database)
    clock: Callable[[], float] = lambda: NOW  # noqa: E731

    def alerts_job(leads: bool) -> object:
        jobs = standard_jobs(config, sessions, clock, _Member(leads))  # type: ignore[arg-type]
        return next(j for j in jobs if j.id == "alerts").func()

    assert alerts_job(False) is NOT_LEADER
    assert _rows(config) == []
    alerts_job(True)
    assert [r.as_of for r in _rows(config)] == [NOW]
