"""A round that catches the SLO running sums up over a long history writes a bounded number
of target-buckets, so it costs about what a steady round does (a first run at 200 replicas
wrote a day per round and took up to 328 s)."""

from __future__ import annotations

from pathlib import Path

from kneepoint.store import slo_sums
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets


def test_catching_up_writes_at_most_the_budget_of_target_buckets_per_round(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'k.db'}")
    with sessions.begin() as session:
        ensure_targets(session, [(f"r{i}", "vllm", f"http://r{i}/metrics") for i in range(200)])
    now = 1_800_000_000.0
    day = 86400.0
    written = []
    for _ in range(3):
        with sessions.begin() as session:
            written.append(slo_sums.advance(session, now, day, {}, budget=2400))
    assert written == [12, 12, 12]  # 2,400 target-buckets ÷ 200 targets, not a day (288)
    # A small fleet still catches up its whole reach (a day less the settling bucket).
    small = open_store(f"sqlite:///{tmp_path / 'small.db'}")
    with small.begin() as session:
        ensure_targets(session, [("only", "vllm", "http://only/metrics")])
        assert slo_sums.advance(session, now, day, {}, budget=2400) > 280
