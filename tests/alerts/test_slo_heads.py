"""A window's partial start bucket, summed for every replica at once (kneepoint/store/slo_sums.py
`heads`, its vectorized `_plain_heads`), gives exactly what walking each replica's samples
one by one gives (`heads_walked`, the code before): on the seeded store of test_slo_sums
(a counter reset every 70 samples, an hour without samples, a stale replica, two stalls, an
SGLang replica with its own histogram layouts and fewer histograms), for the windows of
burn-rate rounds ending every few minutes over its hours, on SQLite and on PostgreSQL."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from alerts import evaluate, slo
from kneepoint.config import Config
from kneepoint.derived import stall
from kneepoint.samples import HISTOGRAMS, Histogram
from kneepoint.store import codec, queries, slo_sums
from kneepoint.store.db import open_store
from tests.alerts.test_slo_sums import NOW, _config, postgres, seeded

__all__ = ["postgres", "seeded"]  # the fixtures, imported for this module's use
pytestmark = pytest.mark.timeout(300)
HOURS = 7  # the seeded store's samples start 8 hours before NOW


def _ends() -> list[float]:
    """Round times every 7 minutes and 13 s (a start at every offset in its bucket, none
    on a bucket bound but by chance) back to where the 6-hour window still has samples."""
    return [NOW - k * 433.0 for k in range(int(HOURS * 3600 / 433))]


def _both(config: Config) -> tuple[list[Any], list[Any], dict[str, int]]:
    """`evaluate._heads` for every round of `_ends()` as it is, and with `heads` replaced
    by the walk; and how many stretches each path gave."""
    counts = {"plain": 0, "walked": 0}
    original, walked = slo_sums.heads, slo_sums.heads_walked

    def counted(*args: Any, **kwargs: Any) -> Any:
        found = walked(*args, **kwargs)
        counts["walked"] += len(found)
        return found

    mine, theirs = [], []
    with open_store(config.database)() as session:
        ids = sorted(t.id for t in queries.targets(session).values())
        layouts = queries.histogram_layouts(session)
        rule = evaluate.stall_rule(config)
        for end in _ends():
            starts = evaluate._apart([end - s for s in slo.windows_needed()])
            slo_sums.heads_walked = counted  # type: ignore[assignment]
            try:
                mine.append(evaluate._heads(session, ids, starts, layouts, rule))
            finally:
                slo_sums.heads_walked = walked  # type: ignore[assignment]
            slo_sums.heads = walked  # type: ignore[assignment]
            try:
                theirs.append(evaluate._heads(session, ids, starts, layouts, rule))
            finally:
                slo_sums.heads = original  # type: ignore[assignment]
    counts["plain"] = sum(len(h[0]) for r in mine for h in r.values()) - counts["walked"]
    return mine, theirs, counts


def _check(config: Config) -> None:
    mine, theirs, counts = _both(config)
    stretches = 0
    layouts: set[str] = set()
    missing = 0
    for ours, reference in zip(mine, theirs, strict=True):
        assert ours.keys() == reference.keys()
        for start in ours:
            found, expected = ours[start][0], reference[start][0]
            assert found.keys() == expected.keys()
            for key in found:
                # Every field: increases, the values at the last sample, the stall state
                # entering and leaving, signatures and credits (0 == 0.0: a sum of none).
                assert found[key] == expected[key], (start, key)
                stretches += 1
                layouts.add(found[key][3][0].split("|")[1])
                missing += len(slo_sums.HISTOGRAMS) - len(found[key][0].h)
            assert ours[start][1] == reference[start][1]  # the sums rows before
    # Both paths were taken, on every kind of replica the store has.
    assert counts["plain"] > 10 * counts["walked"] > 0
    assert stretches > 1000
    assert len(layouts) >= 2  # vLLM's and SGLang's histogram layouts
    assert missing > 0  # a replica without some histogram


def test_every_start_bucket_as_the_walk_gives_it(tmp_path: Path, seeded: str) -> None:
    _check(_config(tmp_path, database=seeded))


@pytest.mark.real
def test_on_postgresql_every_start_bucket_as_the_walk_gives_it(postgres: Config) -> None:
    _check(postgres)


def test_histograms_decoded_together_as_one_by_one(tmp_path: Path, seeded: str) -> None:
    """decode_many equals _hist text by text: every stored histogram of the store, with
    missing ones and a text whose counts do not fill its layout."""
    from sqlalchemy import select

    from kneepoint.store.models import ReplicaSampleRow

    config = _config(tmp_path, database=seeded)
    with open_store(config.database)() as session:
        layouts = queries.histogram_layouts(session)
        rows = session.execute(select(ReplicaSampleRow)).scalars().all()
        texts: list[Any] = [getattr(r, c) for r in rows for c in slo_sums.HIST_COLUMNS]
    assert any(t is None for t in texts) and len({t.split("|")[0] for t in texts if t}) >= 2
    layout = next(t for t in texts if t).split("|")[0]
    texts += [f"{layout}|1.5|1,2", None, float("nan")]
    assert slo_sums.decode_many(texts, layouts) == [slo_sums._hist(t, layouts) for t in texts]


def _random_case(rng: random.Random) -> tuple[Any, ...]:
    """A frame of whole buckets as `_heads` reads them (several targets and buckets, in
    target and time order), with resets, unknown values, stuck stretches, asleep samples
    (sleep_level 1 or 2: never stuck), histograms that
    change layout or go missing; each bucket's window start, the stall state entering it
    (none, unknown, or a run that the first sample may continue) and its sums row's last
    values."""
    layouts = {1: (0.1, 0.5, float("inf")), 2: (0.2, 1.0, 5.0, 10.0, float("inf"))}
    rows: list[dict[str, Any]] = []
    buckets: list[float] = []
    starts: dict[float, float] = {}
    entering: dict[tuple[float, int], slo_sums.Run | None] = {}
    lasts: dict[tuple[float, int], tuple[float, slo_sums.Values]] = {}
    size = slo_sums.BUCKET
    for target in range(1, 5):
        values = {c: float(rng.randint(0, 50)) for c in slo_sums.COLUMNS}
        counts = {h: [0.0] * 6 for h in slo_sums.HIST_COLUMNS}
        layout = rng.choice([1, 2])
        for bucket in (size * 10, size * 11, size * 12):
            starts[bucket] = bucket + rng.choice([0.0, rng.uniform(0, size)])
            times = sorted(rng.sample(range(int(bucket), int(bucket + size)), rng.randint(1, 6)))
            mine: list[dict[str, Any]] = []
            for ts in times:
                frozen = rng.random() < 0.4
                for c in values:
                    if rng.random() < 0.05:
                        values[c] = float(rng.randint(0, 3))  # a reset
                    elif not frozen or c not in stall.PROGRESS:
                        values[c] += rng.choice([0.0, 1.0, 7.0])
                if rng.random() < 0.1:
                    layout = 3 - layout
                row: dict[str, Any] = {"target_id": target, "ts": float(ts)}
                for c, v in values.items():
                    row[c] = float("nan") if rng.random() < 0.08 else v
                row["requests_running"] = float(rng.choice([0, 2, 2, 3]))
                row["requests_waiting"] = rng.choice([float("nan"), 0.0, 1.0])
                # Asleep now and then (never busy, so never stuck), unknown, or awake.
                row["sleep_level"] = rng.choice([float("nan"), 0.0, 0.0, 0.0, 1.0, 2.0])
                for h in slo_sums.HIST_COLUMNS:
                    width = len(layouts[layout])
                    counts[h] = [c + rng.choice([0.0, 0.0, 1.0, 2.0]) for c in counts[h]]
                    cumulative = tuple(sorted(counts[h][:width]))
                    text = codec.encode_histogram(
                        layout, Histogram(layouts[layout], cumulative, 0.5)
                    )
                    row[h] = None if rng.random() < 0.1 else text
                mine.append(row)
            rows += mine
            buckets += [float(bucket)] * len(mine)
            key = (float(bucket), target)
            first = mine[0]
            point = tuple(
                None if isinstance(first[c], float) and math.isnan(first[c]) else first[c]
                for c in slo_sums.STALL
            )
            choice = rng.random()
            if choice < 0.6:  # a run the first sample may continue (same counters: stuck)
                entering[key] = slo_sums.Run(
                    bucket - rng.uniform(1, 200),
                    point if rng.random() < 0.7 else tuple(rng.random() for _ in point),
                    rng.choice([None, bucket - 500.0]),
                    rng.random() < 0.5,
                )
            elif choice < 0.8:
                entering[key] = None
            if rng.random() < 0.7:
                last = mine[-1]
                decoded = {
                    name: slo_sums._hist(last[c], layouts)
                    for name, c in zip(HISTOGRAMS, slo_sums.HIST_COLUMNS, strict=True)
                }
                stamp = last["ts"] if rng.random() < 0.9 else last["ts"] - 1
                lasts[key] = (stamp, {"c": {}, "h": decoded})
    frame = pd.DataFrame(rows)
    rule = slo_sums.StallRule(after=rng.choice([0.0, 60.0, 150.0]), floor=rng.choice([0.0, 90.0]))
    return frame, layouts, buckets, starts, entering, rule, lasts


def test_random_buckets_as_the_walk_gives_them() -> None:
    """On random buckets (resets, unknown values, stuck pairs inside a bucket and entering
    it, layout changes, missing histograms, last values kept or not), `heads` equals the
    walk, with both paths taken."""
    rng = random.Random(25)
    plain = walked = 0
    for _ in range(100):
        case = _random_case(rng)
        found, expected = slo_sums.heads(*case), slo_sums.heads_walked(*case)
        assert found.keys() == expected.keys()
        for key in found:
            assert found[key] == expected[key], key
        frame = case[0].reset_index(drop=True)
        keys = pd.Series(case[2], index=frame.index, dtype=float)
        easy, rest = slo_sums._plain_heads(frame, keys, case[1], case[3], case[4], case[6])
        plain, walked = plain + len(easy), walked + int(rest.sum())
    assert plain > 100 and walked > 100


def test_random_tails_as_the_walk_gives_them() -> None:
    """`stretches` (a round's partial end bucket, each target from its newest sums row)
    equals the walk on random samples: a carry with values, histograms of its own or
    another layout and a stall run the first sample may continue, or none."""
    rng = random.Random(34)
    plain = walked = 0
    for _ in range(100):
        frame, layouts, _, _, entering, rule, lasts = _random_case(rng)
        frame = frame[frame.ts < slo_sums.BUCKET * 11].reset_index(drop=True)  # one bucket
        carries: dict[int, slo_sums.Carry] = {}
        for (_, target), run in entering.items():
            if rng.random() < 0.2:
                continue
            _, kept = lasts.get((slo_sums.BUCKET * 10, target), (0.0, {"h": {}}))
            counts = {c: rng.choice([None, float(rng.randint(0, 60))]) for c in slo_sums.COLUMNS}
            values = {"c": counts, "h": dict(kept["h"])}
            carries[target] = slo_sums.Carry(
                slo_sums.BUCKET * 10 - 7.0, "", values, slo_sums.Part(), 0, run
            )
        found = slo_sums.stretches(frame, layouts, carries, rule)
        expected = slo_sums.stretches_walked(frame, layouts, carries, rule)
        assert list(found) == list(expected)
        for target in found:
            assert found[target] == expected[target], target
        keys = pd.Series(0.0, index=frame.index)
        runs = {(0.0, t): getattr(carries.get(t), "run", None) for t in found}
        easy, rest = slo_sums._plain_heads(
            frame, keys, layouts, {0.0: -math.inf}, runs, {}, carries
        )
        plain, walked = plain + len(easy), walked + int(rest.sum())
    assert plain > 50 and walked > 50
