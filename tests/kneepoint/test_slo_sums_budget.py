"""Catching the SLO running sums up over a long history: a round writes a bounded number of
target-buckets, so it costs about what a steady round does (a first run at 200 replicas
wrote a day per round and took up to 328 s), and buckets with no sample at all (a 30-day
SLO on a store a few days old) are passed over at once."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from kneepoint.store import slo_sums
from kneepoint.store.db import open_store
from kneepoint.store.models import ReplicaSampleRow
from kneepoint.store.writer import ensure_targets

NOW = 1_800_000_000.0
DAY = 86400.0


def fleet(folder: Path, targets: int, since: float) -> sessionmaker[Session]:
    """`targets` replicas with a sample a minute from `since` to NOW."""
    sessions = open_store(f"sqlite:///{folder / 'k.db'}")
    with sessions.begin() as session:
        ids = ensure_targets(session, [(f"r{i}", "vllm", f"http://r{i}/m") for i in range(targets)])
        times = [since + 60.0 * i for i in range(int((NOW - since) // 60))]
        rows = [
            {"target_id": t, "ts": ts, "generation_tokens": ts}
            for t in ids.values()
            for ts in times
        ]
        session.execute(insert(ReplicaSampleRow), rows)
    return sessions


def test_catching_up_writes_at_most_the_budget_of_target_buckets_per_round(tmp_path: Path) -> None:
    sessions = fleet(tmp_path, 200, NOW - DAY)
    written = []
    for _ in range(3):
        with sessions.begin() as session:
            written.append(slo_sums.advance(session, NOW, DAY, {}, budget=2400))
    assert written == [12, 12, 12]  # 2,400 target-buckets ÷ 200 targets, not a day (288)


def test_history_without_samples_is_passed_over_in_one_round(tmp_path: Path) -> None:
    sessions = fleet(tmp_path, 200, NOW - 2 * 3600.0)  # two hours of a 30-day reach
    with sessions.begin() as session:
        advanced = slo_sums.advance(session, NOW, 30 * DAY, {}, budget=2400)
        reached = slo_sums.progress(session)
    assert reached is not None
    # Up to the data's first bucket, then the budget's 12 buckets of data: an hour.
    assert reached.until == NOW - 2 * 3600.0 + 12 * slo_sums.BUCKET
    assert advanced == (reached.until - reached.since) // slo_sums.BUCKET > 8000
    with sessions() as session:
        assert session.query(slo_sums.SloSumRow).count() == 200 * 12
