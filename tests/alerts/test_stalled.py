"""Stalled engines from stored samples (kneepoint.derived.stall): built sample sequences,
each a trigger or a non-trigger of the `engine-stalled` rule."""

from __future__ import annotations

from collections.abc import Sequence

from kneepoint.derived.stall import STALL_AFTER, Point, stalled_intervals, stalled_since
from kneepoint.store.models import ReplicaSampleRow

STEP = 15.0  # seconds between built samples (the default scrape interval)


def series(
    queues: Sequence[tuple[float, float]],
    tokens: Sequence[tuple[float, float]],
    start: float = 1000.0,
) -> list[Point]:
    """Samples STEP apart: (running, waiting) and cumulative (prompt, generation) tokens."""
    assert len(queues) == len(tokens)
    return [
        Point(start + i * STEP, running, waiting, prompt, generated)
        for i, ((running, waiting), (prompt, generated)) in enumerate(
            zip(queues, tokens, strict=True)
        )
    ]


def frozen(count: int, at: tuple[float, float] = (500.0, 800.0)) -> list[tuple[float, float]]:
    return [at] * count


def rising(count: int, start: tuple[float, float] = (500.0, 800.0)) -> list[tuple[float, float]]:
    return [(start[0] + 100 * i, start[1] + 40 * i) for i in range(count)]


# Enough samples that the frozen stretch outlasts STALL_AFTER.
LONG = int(STALL_AFTER // STEP) + 3


def test_running_requests_with_frozen_counters_are_one_stall_from_first_to_last_sample() -> None:
    samples = series([(4, 0)] * LONG, frozen(LONG))
    assert stalled_intervals(samples) == [(samples[0].ts, samples[-1].ts)]
    assert stalled_since(samples) == samples[0].ts


def test_waiting_requests_alone_with_frozen_counters_stall() -> None:
    samples = series([(0, 3)] * LONG, frozen(LONG))
    assert stalled_intervals(samples) == [(samples[0].ts, samples[-1].ts)]


def test_an_idle_replica_is_never_stalled() -> None:
    samples = series([(0, 0)] * LONG, frozen(LONG))
    assert stalled_intervals(samples, min_duration=0) == []
    assert stalled_since(samples) is None


def test_moving_counters_are_no_stall() -> None:
    samples = series([(4, 2)] * LONG, rising(LONG))
    assert stalled_intervals(samples, min_duration=0) == []
    # Only generation moving (decode, no new prompt) is still progress.
    decoding = series([(4, 0)] * LONG, [(500.0, 800.0 + 7 * i) for i in range(LONG)])
    assert stalled_intervals(decoding, min_duration=0) == []


def test_a_counter_reset_is_a_restart_not_a_stall() -> None:
    # Frozen, then the engine restarts (counters back near 0) and works again: the reset
    # pair breaks the stretch, so neither side reaches STALL_AFTER alone...
    half = LONG // 2
    samples = series([(2, 0)] * (2 * half), frozen(half) + [(10.0, 5.0)] * half)
    assert stalled_intervals(samples) == []
    # ... and the two short stretches are separate intervals, the reset pair in neither.
    parts = stalled_intervals(samples, min_duration=0)
    assert len(parts) == 2
    assert parts[0][1] == samples[half - 1].ts and parts[1][0] == samples[half].ts


def test_a_stall_shorter_than_the_stall_time_is_left_out_unless_asked_for() -> None:
    short = int(STALL_AFTER // STEP) - 1  # frozen for less than STALL_AFTER
    samples = series([(1, 0)] * (short + 2), rising(2) + frozen(short, at=rising(2)[-1]))
    assert stalled_intervals(samples) == []
    assert stalled_intervals(samples, min_duration=0) == [(samples[1].ts, samples[-1].ts)]
    assert stalled_since(samples, min_duration=0) == samples[1].ts
    assert stalled_since(samples, min_duration=STALL_AFTER) is None


def test_a_gap_in_the_samples_is_not_read_as_stuck() -> None:
    samples = series([(3, 0)] * LONG, frozen(LONG))
    # The target was not scraped for ten minutes in the middle (down or stale).
    gapped = samples[: LONG // 2] + [
        Point(
            p.ts + 600, p.requests_running, p.requests_waiting, p.prompt_tokens, p.generation_tokens
        )
        for p in samples[LONG // 2 :]
    ]
    assert stalled_intervals(gapped, min_duration=0, max_gap=3 * STEP) == [
        (gapped[0].ts, gapped[LONG // 2 - 1].ts),
        (gapped[LONG // 2].ts, gapped[-1].ts),
    ]
    # Without a gap limit the ten minutes count, as stuck as the rest.
    assert stalled_intervals(gapped, max_gap=None) == [(gapped[0].ts, gapped[-1].ts)]


def test_work_draining_ends_the_stall_and_a_new_one_is_a_second_interval() -> None:
    queues = [(2, 1)] * LONG + [(0, 0)] * 3 + [(1, 0)] * LONG
    samples = series(queues, frozen(2 * LONG + 3))
    first, second = stalled_intervals(samples)
    assert first == (samples[0].ts, samples[LONG - 1].ts)
    assert second == (samples[LONG + 3].ts, samples[-1].ts)
    assert stalled_since(samples) == samples[LONG + 3].ts


def test_a_moving_step_counter_is_progress_while_tokens_stand_still() -> None:
    # No token counted, but the engine steps (an engine that counts every step, a chunk of a
    # prefill included; vLLM V1 counts only the steps that emit output): that is progress.
    stepping = [
        Point(1000 + i * STEP, 1, 0, 500.0, 800.0, engine_steps=float(i)) for i in range(LONG)
    ]
    assert stalled_intervals(stepping, min_duration=0) == []
    standing = [Point(p.ts, 1, 0, 500.0, 800.0, engine_steps=7.0) for p in stepping]
    assert stalled_intervals(standing) == [(standing[0].ts, standing[-1].ts)]


def test_unknown_counters_or_queues_say_nothing() -> None:
    no_counters = [Point(1000 + i * STEP, 3, 0, None, None) for i in range(LONG)]
    assert stalled_intervals(no_counters, min_duration=0) == []
    no_queues = [Point(1000 + i * STEP, None, None, 5.0, 5.0) for i in range(LONG)]
    assert stalled_intervals(no_queues, min_duration=0) == []


def test_stored_rows_are_read_as_they_are_in_any_order() -> None:
    rows = [
        ReplicaSampleRow(
            target_id=1,
            ts=1000 + i * STEP,
            requests_running=2.0,
            requests_waiting=0.0,
            prompt_tokens=300.0,
            generation_tokens=900.0,
        )
        for i in range(LONG)
    ]
    assert stalled_intervals(rows[::-1]) == [(rows[0].ts, rows[-1].ts)]
