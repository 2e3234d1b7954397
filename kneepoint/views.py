"""What each page shows, computed in the kernel from the store (pages only lay it out).

Its one concern is the `View`: the status exactly as kneepoint/status.py builds it, plus
what the pages (and the weekly review) add per replica over the same window: peaks and
time saturated, sequence slots, queue time, finish reasons, cost against the knee, energy,
the charts' series and the fleet's events (hit-rate drops, prefill storms). Not here: the
status's own numbers (kneepoint/status.py, so the command line, the pages and the alerts
read the same ones), the fleet's one-word verdict (kneepoint/fleet_status.py), figures
(dashboards/) and layout (app/)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from sqlalchemy.orm import Session

from kneepoint.config import Config
from kneepoint.derived import cost, details, ratios, tiers
from kneepoint.derived.latency import quantiles
from kneepoint.derived.window import Window, frame_windows
from kneepoint.knee.detect import assess, knee_for_replica, knee_throughput
from kneepoint.records import GpuStatus, KneeCost, PageNumbers, ReplicaStatus, Status
from kneepoint.samples import SATURATION
from kneepoint.series import gpu_series, replica_series, resample
from kneepoint.status import at_fleet_size, build_status
from kneepoint.store import queries, window_rows
from kneepoint.store.runs import load_runs

EVENT_INTERVAL, EVENT_SECONDS = "5min", 300


@dataclass
class View:
    status: Status
    rows: dict[str, PageNumbers] = field(default_factory=dict)  # per replica
    series: pd.DataFrame = field(default_factory=pd.DataFrame)
    coarse: pd.DataFrame = field(default_factory=pd.DataFrame)
    gpus: pd.DataFrame = field(default_factory=pd.DataFrame)
    events: dict[str, list[details.Event]] = field(default_factory=dict)
    # Built at fleet size: no per-replica or per-GPU series (`series`, `gpus`) to draw from;
    # pages chart the fleet from the database (app/fleet_data.py).
    charts_from_database: bool = False


def build_view(
    session: Session,
    config: Config,
    now: float,
    window: float,
    pages: bool = True,
    series: bool | None = None,
) -> View:
    """Status over the window plus every page's extra numbers and series. With `pages`
    false, what alert rules read only (alerts/values.py): the status and each replica's
    window numbers (`_numbers`, peaks left out), no series, peaks, knees, costs or events,
    which cost evaluation half its time and no rule reads.

    `series`: whether to build `series` and `coarse` (the charts' points), which takes
    every replica's rows of the range. None: only up to distribution.FLEET_THRESHOLD
    replicas; above it pages draw from the database (app/fleet_data.py), and the window's
    numbers come from its few rows per replica (kneepoint/store/window_rows.py), the same
    numbers (tests/kneepoint/test_window_sql.py)."""
    start = now - window
    if series is None:
        series = not at_fleet_size(config)
    edges = None if series else window_rows.read(session, start, now)
    if edges is None:
        frame = queries.replica_frame(session, start, now, columns=queries.LIGHT_COLUMNS)
    else:
        frame = edges.frame
    layouts = queries.histogram_layouts(session)
    windows = frame_windows(frame, layouts, lambda keys: queries.replica_rows_at(session, keys))
    # At fleet size the GPUs' numbers come from the database too (build_status reads them,
    # kneepoint/store/gpu_windows.py), and no GPU's lines are built: the GPUs page draws a
    # fleet's charts from the database (`charts_from_database`).
    gpu_rows = queries.gpu_frame(session, start, now) if series else None
    status = build_status(
        session,
        config,
        now,
        window,
        samples=frame,
        spans=windows,
        gpu_rows=gpu_rows,
        edges=edges,
    )
    targets = queries.targets(session)
    by_replica: dict[str | None, list[GpuStatus]] = {}
    for gpu in status["gpus"]:
        by_replica.setdefault(gpu["replica"], []).append(gpu)
    if not pages:
        rows: dict[str, PageNumbers] = {}
        for replica in status["replicas"]:
            row = targets.get(replica["name"])
            span = windows.get(row.id, Window()) if row is not None else Window()
            gpus = by_replica.get(replica["name"], [])
            rows[replica["name"]] = _numbers(replica, NO_PEAKS, span, gpus)
        return View(status, rows=rows)
    view = View(status, gpus=pd.DataFrame() if gpu_rows is None else gpu_series(gpu_rows))
    view.charts_from_database = gpu_rows is None
    if edges is None:
        names = {row.id: name for name, row in targets.items()}
        view.series = replica_series(frame, names)
        view.coarse = resample(view.series, _bucket(window))
    peaks = _peaks(frame) if edges is None else edges.peaks
    assessments = [assess(run, config.slos) for run in load_runs(session)]
    for replica in status["replicas"]:
        row = targets.get(replica["name"])
        span = windows.get(row.id, Window()) if row is not None else Window()
        gpus = by_replica.get(replica["name"], [])
        numbers = _numbers(replica, peaks.get(row.id, NO_PEAKS) if row else NO_PEAKS, span, gpus)
        knee = knee_for_replica(replica["name"], replica["model_names"] or [], assessments)
        prompt, generated = span.deltas.get("prompt_tokens"), span.deltas.get("generation_tokens")
        money = cost.economics(
            cost.hourly_cost(
                config.pricing, replica["name"], [g["model"] for g in gpus], len(status["replicas"])
            ),
            knee.run.label if knee else None,
            knee_throughput(knee),
            replica["generation_tokens_per_second"],
            ratios.ratio(prompt, generated),
            replica["cost_per_million_generated_tokens"],
            config.pricing.api_reference,
        )
        view.rows[replica["name"]] = {**numbers, **_economics(money)}
    # Events are found on 5-minute intervals whatever the chart's: a 20-minute storm
    # vanishes in the hourly points of a week's chart.
    # Over a week that is every replica's 5-minute rows (2 million at 1,000 replicas): the
    # database sums them per fleet interval and returns one row each (2,016).
    # Without the series, shorter ranges sum them the same way, from the rows they read.
    coarsest = queries.coarsest_for(window)
    if coarsest > EVENT_SECONDS or edges is not None:
        sums, replicas = queries.fleet_intervals(
            session,
            start,
            now,
            EVENT_SECONDS,
            EVENT_INCREASES,
            coarsest=min(coarsest, EVENT_SECONDS),
        )
        fleet = _fleet_ratios(sums, replicas)
    else:
        fleet = _fleet_intervals(resample(view.series, EVENT_INTERVAL))
    view.events = {
        "hit_rate_drops": details.hit_rate_drops(fleet) if len(fleet) else [],
        "prefill_storms": details.prefill_storms(fleet) if len(fleet) else [],
    }
    return view


NO_PEAKS: window_rows.Peaks = dict.fromkeys(
    ("time_saturated", "peak_kv_occupancy", "peak_waiting", "peak_running")
)


def _economics(money: cost.Economics) -> KneeCost:
    """The page row's cost against the knee: Economics' fields in their order, as
    dataclasses.asdict gave them (tests/kneepoint/test_status_record.py checks they match)."""
    nominal = money.nominal_cost_per_million_generated_tokens
    return {
        "knee_run": money.knee_run,
        "knee_output_tokens_per_second": money.knee_output_tokens_per_second,
        "nominal_cost_per_million_generated_tokens": nominal,
        "utilization": money.utilization,
        "true_over_nominal": money.true_over_nominal,
        "api_cost_per_million_generated_tokens": money.api_cost_per_million_generated_tokens,
        "break_even_utilization": money.break_even_utilization,
    }


def _peaks(frame: pd.DataFrame) -> dict[int, window_rows.Peaks]:
    """Per target of `frame` (rows ordered by target and time): its time saturated
    (details.time_saturated) and its peak KV occupancy, waiting and running requests, for
    every target at once (one pandas step per replica cost 2 ms each: 2 s for 1,000)."""
    if frame.empty:
        return {}
    groups = frame.target_id
    above = frame.kv_cache_usage.astype(float) > SATURATION
    if "ends_saturated" in frame:
        above = frame.ends_saturated.astype(float).fillna(above.astype(float)) > 0
    first = groups.ne(groups.shift())
    spans = frame.ts.astype(float).diff().where(~first)
    seconds = spans * above.astype(float).shift(1).where(~first)
    if "saturated_seconds" in frame:
        seconds = frame.saturated_seconds.astype(float).where(~first).fillna(seconds)
    totals = pd.DataFrame({"seconds": seconds, "spans": spans, "target_id": groups})
    totals = totals.groupby("target_id", sort=False).agg(
        seconds=("seconds", "sum"), spans=("spans", "sum"), rows=("spans", "size")
    )
    values = pd.DataFrame(
        {
            "target_id": groups,
            "kv": frame.kv_cache_usage_peak.fillna(frame.kv_cache_usage).astype(float),
            "waiting": frame.requests_waiting_peak.fillna(frame.requests_waiting).astype(float),
            "running": frame.requests_running_peak.fillna(frame.requests_running).astype(float),
            "known_running": frame.requests_running.notna(),
        }
    ).groupby("target_id", sort=False)
    maxima = values.max()
    kv, waiting, running = (maxima[c].to_dict() for c in ("kv", "waiting", "running"))
    known = values.known_running.any().to_dict()
    peaks: dict[int, window_rows.Peaks] = {}
    # Plain lists and dicts: a row Series and Series lookups per target cost 0.5 s at 1,000.
    for target_id, seconds, spans_, rows in zip(
        totals.index.tolist(),
        totals.seconds.tolist(),
        totals.spans.tolist(),
        totals.rows.tolist(),
        strict=True,
    ):
        peaks[int(target_id)] = {
            "time_saturated": float(seconds / spans_) if rows >= 2 and spans_ > 0 else None,
            "peak_kv_occupancy": float(kv[target_id]),
            "peak_waiting": float(waiting[target_id]),
            "peak_running": float(running[target_id]) if known[target_id] else None,
        }
    return peaks


def _numbers(
    replica: ReplicaStatus,
    peaks: window_rows.Peaks,
    window: Window,
    gpus: list[GpuStatus],
) -> PageNumbers:
    """The window's numbers of a page row (build_view adds the cost at the knee)."""
    served = None
    if window.deltas.get("prompt_tokens") is not None:
        served = (window.deltas.get("prompt_tokens") or 0.0) + (
            window.deltas.get("generation_tokens") or 0.0
        )
    joules = [g["energy_joules"] for g in gpus if g["energy_joules"] is not None]
    kwh, joules_per_million = details.energy(sum(joules) if joules else None, served)
    busy = [
        g["gr_engine_active"] if g["gr_engine_active"] is not None else g["utilization"]
        for g in gpus
    ]
    known_busy = [b for b in busy if b is not None]
    finished = details.requests_finished(window)
    mean_context, slots, slots_left = details.sequence_slots(
        replica["kv_cache_capacity_tokens"],
        replica["kv_cache_occupancy"],
        replica["requests_running"],
    )
    seconds = window.seconds
    recompute = replica["preemption_recompute_tokens"]
    spec = ratios.spec_decode(
        window.deltas.get("spec_decode_drafts"),
        window.deltas.get("spec_decode_draft_tokens"),
        window.deltas.get("spec_decode_accepted_tokens"),
        window.per_position,
    )
    prompt = window.deltas.get("prompt_tokens")
    return {
        "mean_context_tokens": mean_context,
        "sequence_slots": slots,
        "sequence_slots_left": slots_left,
        "time_saturated": peaks["time_saturated"],
        "peak_kv_occupancy": peaks["peak_kv_occupancy"],
        "peak_waiting": peaks["peak_waiting"],
        "peak_running": peaks["peak_running"],
        "queue_seconds": quantiles(window.histograms.get("queue")),
        "requests_per_second": ratios.ratio(finished, seconds),
        "finish_reasons": details.finish_reasons(window),
        "preemptions_per_request": ratios.ratio(window.deltas.get("preemptions"), finished),
        "recompute_tokens_per_second": ratios.ratio(recompute, seconds),
        "recompute_share_of_prefill": ratios.ratio(
            recompute,
            None
            if recompute is None or prompt is None
            else prompt * (1 - (replica["prefix_cache_hit_rate"] or 0.0)) + recompute,
        ),
        "prefix_cross_check": ratios.ratio(
            window.deltas.get("prompt_tokens_local_cache_hit"), prompt
        ),
        "prefill_computed_tokens_per_request": tiers.prefill_computed_per_request(window.deltas),
        "mean_prompt_tokens": tiers.mean_prompt_tokens(window.deltas),
        "kv_offload_load_bytes_per_second": ratios.ratio(
            window.deltas.get("kv_offload_load_bytes"), seconds
        ),
        "kv_offload_store_bytes_per_second": ratios.ratio(
            window.deltas.get("kv_offload_store_bytes"), seconds
        ),
        "mm_cache_hit_rate": tiers.mm_cache_hit_rate(window.deltas),
        "spec_expected_speedup": spec.expected_speedup,
        "spec_verdict": spec.verdict,
        "energy_kwh": kwh,
        "joules_per_million_tokens": joules_per_million,
        "idle_gpu_hours": details.idle_gpu_hours(
            sum(known_busy) / len(known_busy) if known_busy else None, seconds, len(gpus)
        ),
    }


def _fleet_intervals(intervals: pd.DataFrame) -> pd.DataFrame:
    """The fleet per interval: increases summed over replicas, ratios recomputed."""
    if intervals.empty:
        return intervals
    fleet = intervals.groupby("time").sum(numeric_only=True).reset_index()
    return _with_fleet_ratios(fleet, intervals.replica.nunique())


# The increases hit-rate drops and prefill storms are found from.
EVENT_INCREASES = ("prefix_cache_hits", "prefix_cache_queries", "prompt_tokens_local_compute")


def _fleet_ratios(sums: pd.DataFrame, replicas: int) -> pd.DataFrame:
    """`_fleet_intervals`' hit rate and computed prompt tokens per second from the fleet's
    increases per interval as queries.fleet_intervals sums them in the database."""
    if sums.empty:
        return pd.DataFrame(columns=["time", "hit_rate", "computed_prompt_tokens_per_second"])
    # Nanoseconds, as replica_series' times are.
    times = pd.to_datetime(sums.bucket, unit="s", utc=True).astype("datetime64[ns, UTC]")
    fleet = sums.assign(time=times).drop(columns="bucket")
    return _with_fleet_ratios(fleet, replicas)


def _with_fleet_ratios(fleet: pd.DataFrame, replicas: int) -> pd.DataFrame:
    """`fleet` (the fleet's increases and replica-seconds per interval) with its hit rate
    (Σ hits ÷ Σ queries, none without queries) and its computed prompt tokens per second
    (over one replica's seconds), the same formulas whether pandas or the database summed
    the increases."""
    asked = fleet.d_prefix_cache_queries.where(fleet.d_prefix_cache_queries > 0)
    fleet["hit_rate"] = fleet.d_prefix_cache_hits / asked
    per_replica_seconds = fleet.seconds / replicas
    fleet["computed_prompt_tokens_per_second"] = (
        fleet.d_prompt_tokens_local_compute / per_replica_seconds.where(per_replica_seconds > 0)
    )
    return fleet


def _bucket(window: float) -> str:
    """An interval that gives a chart a few hundred points."""
    for seconds, rule in ((3600, "1min"), (6 * 3600, "5min"), (2 * 86400, "15min")):
        if window <= seconds:
            return rule
    return "1h"
