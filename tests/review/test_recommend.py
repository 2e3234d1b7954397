"""Each recommendation: a week whose numbers call for it, and one whose numbers do not."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pandas as pd

from alerts.slo import Budget
from alerts.slo import Report as SloReport
from kneepoint.config import Slo
from kneepoint.derived.details import Event
from review import recommend as r

QUIET: dict[str, Any] = {
    "time_saturated": 0.0,
    "peak_kv_occupancy": 0.4,
    "p95_kv_occupancy": 0.35,
    "preemptions": 0.0,
    "recompute_share_of_prefill": 0.0,
    "running_at_cap_share": 0.02,
    "peak_running": 12.0,
    "peak_waiting": 0.0,
    "spec_verdict": "paying off",
    "spec_expected_speedup": 1.6,
    "utilization": 0.55,
    "idle_gpu_hours": 3.0,
    "break_even_utilization": 0.2,
    "headroom": 20.0,
    "knee_concurrency": 32,
    "prefix_cache_hit_rate": 0.8,
}


def week(**changes: Any) -> dict[str, Any]:
    return {**QUIET, **changes}


def period(
    replicas: dict[str, dict[str, Any]] | None = None,
    divergence: float | None = 0.05,
    drops: list[Event] | None = None,
    storms: list[Event] | None = None,
    budget_left: float = 0.9,
) -> Any:
    slo = Slo(name="ttft", metric="ttft", threshold=0.5, objective=0.99, window=30 * 86400.0)
    return SimpleNamespace(
        replicas=replicas or {"a": week()},
        fleet={"hit_rate_divergence": divergence},
        view=SimpleNamespace(
            events={"hit_rate_drops": drops or [], "prefill_storms": storms or []}
        ),
        slos=[SloReport(slo, Budget(0.995, budget_left), {}, [])],
    )


def at(text: str, value: float = 0.5, baseline: float = 0.9) -> Event:
    return Event(pd.Timestamp(text, tz="UTC"), value, baseline)


def test_kv_bound_when_saturated_or_preempting_for_real() -> None:
    assert r.kv_bound("a", week(time_saturated=0.12, peak_kv_occupancy=0.99)) is not None
    preempting = r.kv_bound("a", week(preemptions=75_000.0, recompute_share_of_prefill=0.12))
    assert preempting is not None and "fp8" in preempting.knob
    assert "75,000 preemptions, 12% of prefill recomputed" in preempting.evidence
    assert r.kv_bound("a", week()) is None
    # A handful of preemptions that redo almost nothing is not a KV-bound week.
    assert r.kv_bound("a", week(preemptions=3.0, recompute_share_of_prefill=0.001)) is None


def test_raise_max_num_seqs_when_the_cap_binds_with_memory_free() -> None:
    capped = week(running_at_cap_share=0.4, peak_waiting=9.0, p95_kv_occupancy=0.45)
    found = r.raise_max_num_seqs("a", capped)
    assert found is not None and "--max-num-seqs above 12" in found.knob
    assert r.raise_max_num_seqs("a", week()) is None
    # Waiting because memory is full is the KV cache's doing, not the cap's.
    assert r.raise_max_num_seqs("a", week(**{**capped, "p95_kv_occupancy": 0.92})) is None


def intervals(spikes_with_long_prompts: bool) -> pd.DataFrame:
    rows = []
    for hour in range(24):
        spike = hour in (5, 11, 17)
        long_prompt = spike if spikes_with_long_prompts else hour in (2, 8, 14, 20, 23, 1)
        rows.append(
            {
                "ts": hour * 3600.0,
                "mean_prompt_tokens": 12_000.0 if long_prompt else 2_000.0,
                "itl_p99_seconds": 0.180 if spike else 0.040,
            }
        )
    return pd.DataFrame(rows)


def test_admission_cap_when_long_prompts_come_with_itl_spikes() -> None:
    found = r.admission_cap("a", intervals(spikes_with_long_prompts=True))
    assert found is not None and "admission cap on prompt length" in found.knob
    assert "3 intervals with ITL p99 over 2× the median (40 ms)" in found.evidence
    assert r.admission_cap("a", intervals(spikes_with_long_prompts=False)) is None
    assert r.admission_cap("a", pd.DataFrame()) is None


def test_routing_when_hit_rates_diverge_or_drop() -> None:
    apart = period(
        {"a": week(prefix_cache_hit_rate=0.8), "b": week(prefix_cache_hit_rate=0.45)}, 0.35
    )
    found = r.route_by_prefix(apart)
    assert found is not None and found.replica == "fleet" and "35% points apart" in found.evidence
    dropped = r.route_by_prefix(period(drops=[at("2026-11-23 10:00")]))
    assert dropped is not None and any("Mon 10:00" in e for e in dropped.evidence)
    assert r.route_by_prefix(period()) is None


def test_stagger_deploys_when_prefill_storms_follow_hit_rate_drops() -> None:
    storm = at("2026-11-24 10:05", 17_000, 3_900)
    found = r.stagger_deploys(period(drops=[at("2026-11-24 10:00")], storms=[storm]))
    assert found is not None and "stagger" in found.knob
    # A storm on its own (traffic, not a deploy) is not evidence of a deploy.
    assert r.stagger_deploys(period(storms=[storm])) is None
    far = r.stagger_deploys(period(drops=[at("2026-11-24 14:00")], storms=[storm]))
    assert far is None


def test_drop_the_drafter_only_when_it_slows_the_engine() -> None:
    found = r.drop_drafter("a", week(spec_verdict="slowing down", spec_expected_speedup=0.77))
    assert found is not None and "expected speedup 0.77× (below 1)" in found.evidence
    assert r.drop_drafter("a", week()) is None
    assert r.drop_drafter("a", week(spec_verdict=None)) is None  # no drafter at all


def test_fill_troughs_when_load_vs_knee_stays_low() -> None:
    found = r.fill_troughs("a", week(utilization=0.07, idle_gpu_hours=40.0))
    assert found is not None
    assert "load vs knee 7% (generated tokens/s ÷ the knee's)" in found.evidence
    assert r.fill_troughs("a", week()) is None
    assert r.fill_troughs("a", week(utilization=None)) is None  # no knee: no evidence


def test_more_gpus_when_at_the_knee_and_the_budget_burns() -> None:
    at_knee = week(headroom=-4.0, peak_running=36.0)
    found = r.more_gpus("a", at_knee, period(budget_left=0.2))
    assert found is not None and "ttft: budget left 20%" in found.evidence
    assert r.more_gpus("a", at_knee, period(budget_left=0.9)) is None  # SLOs are fine
    assert r.more_gpus("a", week(), period(budget_left=0.2)) is None  # headroom left


def test_nothing_is_recommended_for_a_quiet_week() -> None:
    quiet = SimpleNamespace(this=period(), last=period())
    quiet.this.intervals = {"a": intervals(spikes_with_long_prompts=False)}
    assert r.recommend(quiet) == []  # type: ignore[arg-type]
