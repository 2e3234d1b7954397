from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kneepoint.counters import increase, reset_points

counter_values = st.lists(st.floats(min_value=0, max_value=1e12, allow_nan=False), min_size=2)


def test_increase_is_last_minus_first_without_resets() -> None:
    assert increase([10, 15, 15, 40]) == 30


def test_a_counter_that_goes_down_was_reset_and_counts_from_zero() -> None:
    # 100 -> 150 (+50), restart, 20 (+20), 35 (+15)
    assert increase([100, 150, 20, 35]) == 85


def test_it_never_goes_negative_or_spikes_on_reset() -> None:
    assert increase([1_000_000, 3]) == 3


def test_it_needs_two_samples() -> None:
    assert increase([5]) is None
    assert increase([]) is None
    assert increase([None, 4, None]) is None


def test_reset_points_mark_the_sample_before_each_reset() -> None:
    assert reset_points([1, 5, 2, 3, 0, 1]) == [1, 3]
    assert reset_points([1, None, 0]) == [0]


@given(counter_values)
def test_increase_is_never_negative(values: list[float]) -> None:
    result = increase(values)
    assert result is not None and result >= 0


@given(counter_values)
def test_increase_of_a_monotonic_counter_is_its_span(values: list[float]) -> None:
    ordered = sorted(values)
    assert increase(ordered) == pytest.approx(ordered[-1] - ordered[0])
