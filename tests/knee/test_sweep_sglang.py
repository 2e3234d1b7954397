"""A knee sweep over real HTTP against the fleet twin's SGLang replica: SGLang's streams (a
null `usage` on every token chunk, the usage chunk with no choices, any model name served)
are read right, its /metrics is captured as SGLang's, and the knee falls where the twin's
physics puts it (the scheduler's cap of running requests)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kneepoint.knee.detect import assess
from kneepoint.knee.sweep import SweepSettings, sweep
from kneepoint.twin.fleet import Fleet, single_replica

pytestmark = pytest.mark.timeout(300)
MODEL = "Qwen/Qwen3-4B"
SPEED = 8.0  # engine seconds per wall second
CAP = 8  # the replica's max running requests


@pytest.fixture(scope="module")
def twin() -> Iterator[str]:
    spec = single_replica("rtx4000ada", "qwen3-4b", 0, 0, engine="sglang", max_num_seqs=CAP)
    fleet = Fleet(spec.model_copy(update={"speed": SPEED})).start()
    yield fleet.url("qwen3-4b")
    fleet.stop()


def test_the_knee_falls_at_the_sglang_twins_running_cap(twin: str) -> None:
    settings = SweepSettings(
        url=twin,
        model=MODEL,
        ladder=(1, 2, 4, 8, 16),
        output_tokens=32,
        metrics_url=f"{twin}/metrics",
    )
    run = sweep(settings, "sglang")
    figures = {p.concurrency: round(p.output_tokens_per_second) for p in run.points}
    assert assess(run).knee_concurrency == CAP, figures
    by_step = {p.concurrency: p for p in run.points}
    for point in run.points:
        assert point.errors == 0, point.first_error
        # Tokens are the usage chunk's count; the chunk itself (no choices) is no token.
        assert point.output_tokens_per_second * point.duration_seconds == pytest.approx(  # type: ignore[operator]
            point.completed * settings.output_tokens
        )
        assert point.input_tokens_mean and point.itl_mean_seconds
    # The server's own numbers, read from SGLang's /metrics (sampled each second): past the
    # cap, requests queue and never run more than the cap at once.
    assert 0 < (by_step[16].server["requests_running_peak"] or 0) <= CAP
    assert (by_step[16].server["requests_waiting_peak"] or 0) > 0
    assert (by_step[1].server["requests_waiting_peak"] or 0) == 0
    assert by_step[16].server["kv_cache_occupancy_peak"]
    # Random prompts: SGLang counted every prompt token as a prefix lookup, nearly none hit.
    lookups = by_step[4].server["prefix_cache_queries"]
    assert lookups is not None and lookups >= by_step[4].completed * by_step[4].input_tokens_mean  # type: ignore[operator]


def test_a_sweep_naming_another_model_is_served_as_sglang_serves_it(twin: str) -> None:
    # vLLM refuses an unknown model name (400 on every request); SGLang serves any name.
    run = sweep(
        SweepSettings(url=twin, model="not-the-served-name", ladder=(2,), requests_per_step=4),
        "any-name",
    )
    (point,) = run.points
    assert (point.completed, point.errors) == (4, 0)
