"""derived.window's counter increases: numpy passes over every target at once give exactly
what pandas' per-target groups gave (resets, gaps, targets of one row), with one pandas
group step instead of four."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kneepoint.derived import window
from kneepoint.samples import REPLICA_COUNTERS

COUNTERS = list(REPLICA_COUNTERS)


def grouped(frame: pd.DataFrame) -> tuple[np.ndarray, dict, dict]:
    """The increases as pandas' groups computed them (the reference)."""
    values = frame[COUNTERS].astype(float)
    groups = frame.target_id
    filled = values.groupby(groups).ffill()
    steps = filled.groupby(groups).diff()
    increases = steps.where(steps.isna() | (steps >= 0), filled).fillna(0.0)
    totals = increases.groupby(groups).sum().to_dict("index")
    enough = (values.notna().groupby(groups).sum() >= 2).to_dict("index")
    return steps.to_numpy(), totals, enough


def fleet(seed: int) -> pd.DataFrame:
    """Targets of 1 to 40 rows, ordered by target and time: fractional counters, gaps (NaN)
    and resets (a counter that goes down)."""
    rng = np.random.default_rng(seed)
    parts = []
    for target in range(int(rng.integers(1, 12))):
        rows = int(rng.integers(1, 40))
        values = np.cumsum(rng.random((rows, len(COUNTERS))) * 3.3, axis=0)
        resets = rng.random(values.shape) < 0.05
        values = np.where(resets, rng.random(values.shape), values)
        values[rng.random(values.shape) < 0.2] = np.nan
        part = pd.DataFrame(values, columns=COUNTERS)
        part.insert(0, "target_id", target * 7 + 3)
        part.insert(1, "ts", np.arange(rows) * 5.0)
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


@pytest.mark.parametrize("seed", range(30))
def test_the_increases_equal_those_of_pandas_groups(seed: int) -> None:
    frame = fleet(seed)
    steps, totals, enough = window._increases(frame, COUNTERS)
    want_steps, want_totals, want_enough = grouped(frame)
    assert np.array_equal(steps, want_steps, equal_nan=True)
    assert totals == want_totals  # exact: the same compensated group sum
    assert enough == {t: {c: bool(k) for c, k in row.items()} for t, row in want_enough.items()}


def test_targets_whose_rows_are_apart_get_the_same_increases() -> None:
    frame = fleet(3)
    shuffled = frame.sample(frac=1.0, random_state=1).sort_values("ts", kind="stable")
    steps, totals, _ = window._increases(shuffled, COUNTERS)
    want_steps, want_totals, _ = grouped(shuffled)
    assert np.array_equal(steps, want_steps, equal_nan=True)
    assert totals == want_totals


def test_an_evaluation_round_takes_one_pandas_group_step_for_the_counters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    original = pd.DataFrame.groupby

    def counted(self: pd.DataFrame, *args: object, **kwargs: object) -> object:
        calls.append(args)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pd.DataFrame, "groupby", counted)
    window._increases(fleet(5), COUNTERS)
    assert len(calls) == 1  # the totals' sum; ffill, diff and the known counts were 3 more
