"""`kneepoint status`: the numbers per replica, fleet and GPU over a window
(docs/explanation/design.md; its JSON: docs/reference/json.md).

One function turns a window into the numbers, for a replica and for the fleet alike, so the
CLI, the pages and the alerts can never disagree.

Its one concern is that window's numbers (`build_status`, `derived`, `hit_rates`) and the
facts about a target they rest on: whether it is stale (`stale_after`, `is_stale`) or
stalled (`stall_after`), which replica a GPU serves (`replica_of`, `GpuOwners`), and where
the database computes them at fleet size (`at_fleet_size`). Not here: the formulas
themselves (kneepoint/derived/), what a page adds to the status (kneepoint/views.py), the
fleet's one-word verdict from alerts and SLOs (kneepoint/fleet_status.py), and the
collector's own jobs and database (kneepoint/health.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import numpy as np
import pandas as pd
from sqlalchemy.orm import Session

from kneepoint import distribution, gpu_peaks
from kneepoint.config import ENGINE_KINDS, Config
from kneepoint.counters import increase
from kneepoint.derived import flops, ratios, tiers
from kneepoint.derived.cost import per_million, window_cost
from kneepoint.derived.latency import quantiles, window_histogram
from kneepoint.derived.saturation import (
    SUB_WINDOWS,
    LoadPoint,
    LoadStats,
    Saturation,
    verdict,
)
from kneepoint.derived.stall import PROGRESS, STALL_AFTER, Point, stalled_since
from kneepoint.derived.window import Window, counter_deltas, frame_windows, merge
from kneepoint.records import (
    Derived,
    EngineState,
    FleetNumbers,
    GoneTarget,
    GpuStatus,
    HitRate,
    HitRates,
    ModelUtilization,
    Numbers,
    Readings,
    ReplicaHitRate,
    ReplicaStatus,
    Sleep,
    StallSleep,
    Status,
)
from kneepoint.samples import QUANTITIES, sleep_state
from kneepoint.store import gpu_windows, queries, saturation_sql, window_rows
from kneepoint.store.codec import decode_histogram
from kneepoint.store.models import RAW, TargetRow


def build_status(
    session: Session,
    config: Config,
    now: float,
    window: float,
    samples: pd.DataFrame | None = None,
    spans: dict[int, Window] | None = None,
    gpu_rows: pd.DataFrame | None = None,
    edges: window_rows.Edges | None = None,
    aggregate: bool | None = None,
) -> Status:
    """The status over [now − window, now]; `samples` are that window's replica rows,
    `spans` their windows (frame_windows) and `gpu_rows` its GPU rows (queries.gpu_frame)
    when the caller has them already.

    Instead of every row, `edges` (kneepoint/store/window_rows.py: the database's few rows
    per replica) give the same numbers; they are read when the caller gives neither and
    `aggregate` says so (None: above distribution.FLEET_THRESHOLD replicas, where reading
    every replica's rows was most of a page's time)."""
    start = now - window
    rows = queries.targets(session)
    fleet = at_fleet_size(config) if aggregate is None else aggregate
    if samples is None and edges is None and fleet:
        edges = window_rows.read(session, start, now)
    if edges is not None:
        samples = edges.frame
    elif samples is None:
        samples = queries.replica_frame(session, start, now, columns=queries.LIGHT_COLUMNS)
    layouts = queries.histogram_layouts(session)
    exporters = {row.id: name for name, row in rows.items()}
    owners = GpuOwners(config)
    if gpu_rows is None and (fleet or edges is not None):
        # The database's one row per GPU (kneepoint/store/gpu_windows.py), not its rows.
        gpu_block, busy = _summed_gpus(gpu_windows.read(session, start, now), owners, exporters)
    else:
        gpus = queries.gpu_frame(session, start, now) if gpu_rows is None else gpu_rows
        gpu_block, busy = _gpus(gpus, owners, exporters)
    # Per replica, its GPUs and their busy shares in the GPUs' order: one pass, not a scan of
    # every GPU for every replica (1,000 × 1,000 at scale).
    gpus_of: dict[str | None, list[GpuStatus]] = {}
    busy_of: dict[str | None, list[float | None]] = {}
    for gpu, share in zip(gpu_block, busy, strict=True):
        gpus_of.setdefault(gpu["replica"], []).append(gpu)
        busy_of.setdefault(gpu["replica"], []).append(share)
    kinds: dict[str, str] = {}
    for target in config.targets:  # the first of a name, as Config.target finds it
        kinds.setdefault(target.name, target.kind)
    replicas: list[ReplicaStatus] = []
    windows, costs = [], []
    utilizations: list[flops.Utilization] = []
    names = [t.name for t in config.targets if t.kind in ENGINE_KINDS]
    if spans is None:
        spans = frame_windows(samples, layouts, _edge_reader(session, samples))
    # Each replica's latest row, all at once; its rows only where a stall may be going on.
    latest_rows = _last_rows(samples)
    maybe_stuck = _maybe_stuck(samples, stale_after(config))
    rows_of = _Rows(samples)
    if edges is not None:
        # Edge rows end with each target's last two rows: enough to rule a stall out. The
        # few that may be stalled are read whole, once, when first asked for.
        wanted = set(names)
        engines = {row.id for name, row in rows.items() if name in wanted}
        suspects = sorted(engines if maybe_stuck is None else engines & maybe_stuck)
        rows_of = _Rows(
            lambda: queries.replica_frame(
                session, start, now, suspects, columns=queries.LIGHT_COLUMNS
            )
        )
    budgets = {t.name: t.max_num_batched_tokens for t in config.targets}
    ids = {rows[name].id: name for name in names if name in rows}
    # At fleet size the window is read as its edge rows: the database reduces the series.
    saturations = (
        _saturations_sql(session, start, now, layouts, ids)
        if edges is not None
        else _saturations(session, samples, start, now, layouts, ids)
    )
    for name in names:
        row = rows.get(name)
        latest = latest_rows.get(row.id) if row is not None else None
        mine = gpus_of.get(name, [])
        span = spans.get(row.id, Window(histograms={})) if row is not None else Window()
        cost = (
            None
            if span.seconds is None
            else window_cost(
                config.pricing, name, [g["model"] for g in mine], span.seconds, len(names)
            )
        )
        busy_now = _mean(busy_of.get(name, []))
        stale = row is not None and is_stale(row.last_scrape_at, config, now)
        kind = kinds[name]
        used = _utilization(config, name, row, latest, span, mine)
        utilizations.append(used)
        numbers = _replica(name, kind, row, latest, span, cost, busy_now, stale, used)
        stall = _stall(session, config, row, latest, rows_of, maybe_stuck, stale)
        loads = saturations.get(row.id) if row is not None else None
        saturation = verdict(
            loads.stats if loads else LoadStats(),
            span.histograms.get("iteration_tokens"),
            budgets.get(name),
            loads.ttft_parts if loads else (),
            span.deltas.get("admission_rejections"),
        )
        replicas.append(
            {**numbers, **stall, "saturation": saturation, **_engine_state(row, latest)}
        )
        windows.append(span)
        costs.append(cost)
    return {
        "generated_at": iso(now),
        "window_seconds": int(window) if float(window).is_integer() else window,
        "replicas": replicas,
        "fleet": _fleet(replicas, windows, costs, utilizations),
        "gpus": gpu_block,
        "gone": gone_targets(rows, config, now, window),
    }


def _engine_state(row: TargetRow | None, latest: dict[str, Any] | None) -> EngineState:
    """The replica's LoRA adapters (TargetRow.lora_adapters, the latest scrape's) and its
    offload tier's occupancy (its latest sample)."""
    adapters = json.loads(row.lora_adapters) if row is not None and row.lora_adapters else None
    return {"lora_adapters": adapters, "kv_offload_usage": _value(latest, "kv_offload_usage")}


def gone_targets(
    rows: dict[str, TargetRow], config: Config, now: float, window: float
) -> list[GoneTarget]:
    """Targets (replicas and GPU nodes) scraped within the window that are no longer among
    the config's targets (discovery stopped finding them, or they were taken out of
    `targets:`) and not scraped since for longer than a stale target's limit: gone since
    their last scrape, their history kept in the store. Not listed while still scraped,
    so a process that cannot reach discovery itself never calls a live replica gone."""
    known = {t.name for t in config.targets}
    gone = [
        (row.last_scrape_at, name, row)
        for name, row in rows.items()
        if name not in known
        and row.last_scrape_at is not None
        and now - window <= row.last_scrape_at <= now
        and is_stale(row.last_scrape_at, config, now)
    ]
    return [
        {
            "name": name,
            "kind": "gpu_node" if row.kind == "dcgm" else "replica",
            "engine": None if row.kind == "dcgm" else (row.engine or row.kind),
            "state": "gone",
            "gone_since": iso(last),
            "last_success_at": iso(row.last_success_at) if row.last_success_at else None,
        }
        for last, name, row in sorted(gone, key=lambda item: (-item[0], item[1]))
    ]


def derived(
    window: Window,
    generation: str | None,
    cost: float | None,
    hit_rate_gauge: float | None = None,
    spec_gauges: tuple[float | None, float | None] = (None, None),
) -> Derived:
    """The windowed numbers of the status contract (docs/reference/json.md), from one window.

    `generation` is a vLLM generation (None for other engines). Where the engine has no
    prefix-cache hit and query counters (vLLM v0, SGLang 0.4.0), its own hit-rate gauge is
    the hit rate; where it has no draft and accept counters (SGLang, TensorRT-LLM), its own
    acceptance length and rate gauges (`spec_gauges`) are the acceptance figures."""
    d = window.deltas
    hit_rate = _hit_rate(d, generation, hit_rate_gauge)
    recompute = ratios.recompute(
        generation,
        d.get("preemptions"),
        d.get("prompt_tokens"),
        d.get("request_prompt_tokens_sum"),
        d.get("request_prompt_tokens_count"),
        d.get("request_generation_tokens_sum"),
        d.get("request_generation_tokens_count"),
        hit_rate,
    )
    spec = ratios.spec_decode(
        d.get("spec_decode_drafts"),
        d.get("spec_decode_draft_tokens"),
        d.get("spec_decode_accepted_tokens"),
        window.per_position,
    )
    generated, prompt = d.get("generation_tokens"), d.get("prompt_tokens")
    served = None if generated is None or prompt is None else generated + prompt
    own_length, own_rate = spec_gauges if spec.mean_acceptance_length is None else (None, None)
    return {
        "prefix_cache_hit_rate": hit_rate,
        "preemption_recompute_tokens": recompute.tokens,
        "preemption_recompute_is_estimate": recompute.is_estimate,
        "spec_decode_acceptance_rate": spec.acceptance_rate
        if spec.acceptance_rate is not None
        else own_rate,
        "spec_decode_mean_acceptance_length": spec.mean_acceptance_length
        if spec.mean_acceptance_length is not None
        else own_length,
        "spec_decode_per_position_acceptance": spec.per_position,
        "ttft_seconds": quantiles(window.histograms.get("ttft")),
        "itl_seconds": quantiles(window.histograms.get("itl")),
        "e2e_seconds": quantiles(window.histograms.get("e2e")),
        "cost_per_million_generated_tokens": per_million(cost, generated),
        "cost_per_million_tokens": per_million(cost, served),
        "prefix_cache_tier_shares": tiers.tier_shares(d),
        "external_prefix_cache_hit_rate": tiers.external_hit_rate(d),
        "corrupted_requests": d.get("corrupted_requests"),
        "requests_refused_share": ratios.refused_share(d.get("admission_rejections"), _finished(d)),
    }


# Every reason a request finishes for (vLLM's finished_reason; store/slo_sums.py FINISHED).
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def _finished(deltas: dict[str, float | None]) -> float | None:
    """Requests finished for any reason over the window (None: no reason counted)."""
    known = [v for r in FINISHED_REASONS if (v := deltas.get(f"requests_finished_{r}")) is not None]
    return sum(known) if known else None


def _hit_rate(
    deltas: dict[str, float | None], generation: str | None, gauge: float | None
) -> float | None:
    counted = (
        deltas.get("prefix_cache_hits") is not None
        or deltas.get("prefix_cache_queries") is not None
    )
    if generation == "v0" or not counted:
        return gauge
    return ratios.hit_rate(deltas.get("prefix_cache_hits"), deltas.get("prefix_cache_queries"))


HIT_COUNTERS = ("prefix_cache_hits", "prefix_cache_queries")
GAUGE = "prefix_cache_hit_rate_gauge"


def hit_rates(session: Session, config: Config, now: float, window: float) -> HitRates:
    """The prefix-cache hit rates build_status gives over [now − window, now], per replica
    and for the fleet, in its shape (`replicas` [{name, prefix_cache_hit_rate}] and `fleet`
    {prefix_cache_hit_rate}), from the two counters and the engine's own gauge alone: alert
    evaluation's one-hour baseline, without a whole status (histograms, GPUs, stalls)."""
    rows = queries.targets(session)
    # The database computes each replica's two increases and returns its last row: one row
    # per replica, where reading the hour's rows was 241,000 at 1,000 replicas.
    found = queries.counter_windows(
        session, now - window, now, HIT_COUNTERS, ("prefix_cache_queries", GAUGE)
    )
    deltas: dict[int, dict[str, float | None]] = {}
    latest: dict[int, dict[str, Any]] = {}
    gaps: list[int] = []  # targets missing a counter at some rows: computed from their rows
    for record in found.to_dict("records"):
        target_id = int(record["target_id"])
        latest[target_id] = {c: record[f"last_{c}"] for c in ("prefix_cache_queries", GAUGE)}
        if record["rows"] < 2:
            deltas[target_id] = {}
        elif any(_value(record, c) is None and record[f"{c}_known"] > 0 for c in HIT_COUNTERS):
            gaps.append(target_id)
        else:
            deltas[target_id] = {
                c: float(record[c]) if record[f"{c}_known"] >= 2 else None for c in HIT_COUNTERS
            }
    if gaps:
        samples = queries.replica_frame(session, now - window, now, gaps, columns=HIT_COUNTERS)
        deltas.update(counter_deltas(samples, HIT_COUNTERS))
    kinds: dict[str, str] = {}
    for target in config.targets:
        kinds.setdefault(target.name, target.kind)
    replicas: list[ReplicaHitRate] = []
    engines, generations, windows = set(), set(), []
    for name in (t.name for t in config.targets if t.kind in ENGINE_KINDS):
        row = rows.get(name)
        mine = deltas.get(row.id, {}) if row is not None else {}
        last = latest.get(row.id) if row is not None else None
        generation = row.generation if row else None
        engine = (row.engine if row else None) or (None if kinds[name] == "auto" else kinds[name])
        gauge = (
            None
            if _value(last, "prefix_cache_queries") is not None
            else _value(last, "prefix_cache_hit_rate_gauge")
        )
        rate = _hit_rate(mine, generation if engine == "vllm" else None, gauge)
        unavailable: dict[str, str] = json.loads(row.unavailable) if row and row.unavailable else {}
        if any("prefix_cache_hit_rate" in QUANTITIES.get(q, (q,)) for q in unavailable):
            rate = None
        replicas.append({"name": name, "prefix_cache_hit_rate": rate})
        engines.update([engine] if engine is not None else [])
        generations.update([generation] if generation is not None else [])
        windows.append(Window(deltas=mine))
    # The fleet's, as _fleet merges it.
    fleet_engine = engines.pop() if len(engines) == 1 else ("mixed" if engines else None)
    fleet_generation = (
        generations.pop() if len(generations) == 1 else ("mixed" if generations else None)
    )
    merged = merge(windows)
    gauge_rates = _gauge_hit_rates(replicas, windows)
    generation = (
        fleet_generation if fleet_engine == "vllm" and fleet_generation != "mixed" else None
    )
    rate = _hit_rate(merged.deltas, generation, _mean(gauge_rates))
    return {"replicas": replicas, "fleet": {"prefix_cache_hit_rate": rate}}


def _last_rows(frame: pd.DataFrame, key: str = "target_id") -> dict[Any, dict[str, Any]]:
    """Each target's (`key`'s) last row of `frame` as a dict, its values as `frame.iloc[-1]`
    of the target's rows gives them (one conversion for all, not a row Series each)."""
    if frame.empty:
        return {}
    last = frame[~frame[key].duplicated(keep="last") & frame[key].notna()]
    # A row of a frame takes the columns' common type (floats when all are numbers).
    common = frame.iloc[0].dtype
    columns = {
        name: last[name].tolist() if common.kind == "O" else last[name].to_numpy(common).tolist()
        for name in last.columns
    }
    return {
        target_id: {name: values[number] for name, values in columns.items()}
        for number, target_id in enumerate(last[key].tolist())
    }


def _utilization(
    config: Config,
    name: str,
    row: TargetRow | None,
    latest: dict[str, Any] | None,
    window: Window,
    gpus: list[GpuStatus],
) -> flops.Utilization:
    """The replica's MFU and MBU (kneepoint.derived.flops): its GPUs' model, by DCGM or its
    target's gpu_model, judged at its compute_dtype (else the config's)."""
    target = config.target(name)
    model, why = flops.gpu_model([g["model"] for g in gpus], target.gpu_model)
    peak = None if model is None else gpu_peaks.find(model, config.peaks())
    d = window.deltas
    generated, prompt = d.get("generation_tokens"), d.get("prompt_tokens")
    return flops.utilization(
        d.get("estimated_flops"),
        d.get("estimated_read_bytes"),
        d.get("estimated_write_bytes"),
        _value(latest, "estimated_flops"),
        (generated or 0.0) + (prompt or 0.0),
        window.seconds,
        row.engines if row else None,
        model,
        peak,
        target.compute_dtype or config.compute_dtype,
        why or flops.NO_GPU,
    )


def _model_utilization(used: flops.Utilization) -> ModelUtilization:
    return {
        "mfu": used.mfu,
        "mbu": used.mbu,
        "mfu_unavailable": used.mfu_unavailable,
        "mbu_unavailable": used.mbu_unavailable,
    }


def _replica(
    name: str,
    kind: str,
    row: TargetRow | None,
    latest: dict[str, Any] | None,
    window: Window,
    cost: float | None,
    gpu_utilization: float | None,
    stale: bool,
    used: flops.Utilization,
) -> Numbers:
    generation = row.generation if row else None
    # The engine of the stored samples; before the first one, the configured kind says it
    # (unless it is `auto`).
    engine = (row.engine if row else None) or (None if kind == "auto" else kind)
    unavailable: dict[str, str] = json.loads(row.unavailable) if row and row.unavailable else {}
    readings: Readings = {
        "name": name,
        # A stale target is down: its last answer is too old to vouch for it.
        "up": None if row is None else (False if stale else row.up),
        "stale": stale,
        "last_scrape_at": iso(row.last_scrape_at) if row and row.last_scrape_at else None,
        "last_error": row.last_error if row else None,
        "engine": engine,
        "engine_generation": generation,
        "unavailable": unavailable,
        "engines": row.engines if row else None,
        "model_names": json.loads(row.model_names) if row and row.model_names else [],
        "kv_cache_occupancy": _value(latest, "kv_cache_usage"),
        "kv_cache_occupancy_mean": _value(latest, "kv_cache_usage_mean"),
        "kv_cache_capacity_tokens": row.capacity_tokens if row else None,
        "requests_running": _value(latest, "requests_running"),
        "requests_waiting": _value(latest, "requests_waiting"),
        "requests_waiting_capacity": _value(latest, "requests_waiting_capacity"),
        "preemptions": window.deltas.get("preemptions"),
        "preemptions_per_second": _per_second(window, "preemptions"),
        "prompt_tokens_per_second": _per_second(window, "prompt_tokens"),
        "generation_tokens_per_second": _per_second(window, "generation_tokens"),
        "gpu_utilization": gpu_utilization,
        "requests_refused_per_second": _per_second(window, "admission_rejections"),
    }
    result: Numbers = {
        **readings,
        **derived(
            window,
            generation if engine == "vllm" else None,
            cost,
            # The engine's own hit rate only where it has no counters (not for a window
            # that merely holds one sample of an engine that has them).
            None
            if _value(latest, "prefix_cache_queries") is not None
            else _value(latest, "prefix_cache_hit_rate_gauge"),
            (
                _value(latest, "spec_decode_acceptance_length_gauge"),
                _value(latest, "spec_decode_acceptance_rate_gauge"),
            ),
        ),
        **_model_utilization(used),
    }
    # What the engine cannot give is null with its reason, never a number read elsewhere.
    # The catalogue names the keys at runtime: each is one of the nullable numbers.
    keyed = cast(dict[str, object], result)
    for quantity in unavailable:
        for key in QUANTITIES.get(quantity, (quantity,)):
            if key in keyed:
                keyed[key] = None
    return result


# How far back `stalled_since` looks for the start of a stall that fills the whole window.
STALL_LOOKBACK = 86400.0
STALL_RULE = "engine-stalled"


def stall_after(config: Config) -> float:
    """Seconds of work present with frozen counters before a replica counts as stalled: the
    `engine-stalled` rule's `for` (a config rule of that name overrides it), 60 s by
    default (kneepoint.derived.stall.STALL_AFTER)."""
    own = [rule.for_ for rule in config.rules if rule.name == STALL_RULE]
    return own[-1] if own else STALL_AFTER


def _points(frame: pd.DataFrame) -> list[Point]:
    def column(key: str) -> list[float | None]:
        return _column(frame, key) or [None] * len(frame)

    return [
        Point(float(ts), *values)
        for ts, *values in zip(
            frame["ts"],
            column("requests_running"),
            column("requests_waiting"),
            *(column(key) for key in PROGRESS),
            column("sleep_level"),
            strict=True,
        )
    ]


class _Rows:
    """A target's rows of a frame, found when first asked for (one grouping for all); the
    frame itself read then too when given as a function."""

    def __init__(self, frame: pd.DataFrame | Callable[[], pd.DataFrame]) -> None:
        self.source = frame
        self.frame: pd.DataFrame | None = None
        self.positions: dict[Any, Any] | None = None

    def of(self, target_id: int) -> pd.DataFrame:
        if self.frame is None:
            source = self.source
            self.frame = source if isinstance(source, pd.DataFrame) else source()
        if self.positions is None:
            self.positions = self.frame.groupby("target_id", sort=False).indices
        return self.frame.iloc[self.positions[target_id]]


def _maybe_stuck(frame: pd.DataFrame, max_gap: float) -> set[int] | None:
    """The targets of `frame` whose last two rows may be a stuck pair (stall.stuck), found
    for all targets in a few vectorized steps: only these can be stalled at their latest
    sample. Also those whose last two rows share a time (read exactly). None when rows are
    not grouped by target in time order (then every target is read)."""
    if frame.empty:
        return set()
    ids = frame.target_id.to_numpy()
    ts = frame.ts.astype(float).to_numpy()
    same = ids[1:] == ids[:-1]
    starts = int((~same).sum()) + 1
    if starts != len(pd.unique(ids)) or bool((ts[1:][same] < ts[:-1][same]).any()):
        return None
    # Pairs (row i−1, row i) where row i is its target's last and row i−1 its target's too.
    pair = np.append(ids[1:] != ids[:-1], True)  # the last row of its target
    pair[0] = False
    pair[1:] &= same  # and the row before it is the same target's
    later = np.flatnonzero(pair)
    earlier = later - 1

    def known(key: str) -> np.ndarray:
        if key not in frame:
            return np.full(len(frame), np.nan)
        return frame[key].astype(float).to_numpy()

    running, waiting = known("requests_running"), known("requests_waiting")
    queued = np.where(np.isnan(running), 0.0, running) + np.where(np.isnan(waiting), 0.0, waiting)
    # An asleep engine is not busy (kneepoint.derived.stall.busy).
    queued = np.where(known("sleep_level") > 0, 0.0, queued)
    busy = (queued[earlier] > 0) & (queued[later] > 0)
    close = ts[later] - ts[earlier] <= max_gap
    compared = np.zeros(len(later), dtype=bool)
    moved = np.zeros(len(later), dtype=bool)
    for key in PROGRESS:
        values = known(key)
        both = ~np.isnan(values[earlier]) & ~np.isnan(values[later])
        compared |= both
        moved |= both & (values[earlier] != values[later])
    stuck = busy & close & compared & ~moved
    tied = ts[later] == ts[earlier]
    return {int(t) for t in ids[later[stuck | tied]]}


def _stall(
    session: Session,
    config: Config,
    row: TargetRow | None,
    latest: dict[str, Any] | None,
    rows_of: _Rows,
    maybe_stuck: set[int] | None,
    stale: bool,
) -> StallSleep:
    """The replica's stall (kneepoint.derived.stall): `stall_seconds`, how long work has sat
    with frozen counters up to the latest sample (0: the counters moved or nothing is
    queued), `stalled` once that reaches stall_after, and `stalled_since`, when it began.
    No data (null) without samples, for a stale target, or when the engine has no token
    counters; a target whose last scrape failed is down, not stalled (`target-down`)."""
    level = _value(latest, "sleep_level") if not stale else None
    sleep: Sleep = {
        "asleep": None if level is None else level > 0,
        "sleep_state": sleep_state(level),
    }
    none: StallSleep = {"stalled": None, "stalled_since": None, "stall_seconds": None, **sleep}
    if row is None or latest is None or stale:
        return none
    if row.up is False:
        return {**none, "stalled": False}
    if all(_value(latest, key) is None for key in PROGRESS):
        return none
    if sleep["asleep"] or (maybe_stuck is not None and row.id not in maybe_stuck):
        # Asleep (its counters frozen on purpose: kneepoint.derived.stall), or its last two
        # samples are not stuck: no stall goes on (stalled_since is None).
        return {"stalled": False, "stalled_since": None, "stall_seconds": 0.0, **sleep}
    frame = rows_of.of(row.id)
    gap = stale_after(config)
    # The stall can only be in the latest rows: read back from the end, and before the
    # window when it fills the window.
    since: float | None = None
    size = 16
    while True:
        tail = frame.iloc[-size:]
        since = stalled_since(_points(tail), max_gap=gap)
        if since is None or since > float(tail["ts"].iloc[0]) or size >= len(frame):
            break
        size *= 4
    first = float(frame["ts"].iloc[0])
    if since is not None and since <= first:
        before = queries.replica_frame(
            session,
            first - STALL_LOOKBACK,
            first,
            target_ids=[row.id],
            columns=("requests_running", "requests_waiting", *PROGRESS, "sleep_level"),
            coarsest=RAW,
        )
        longer = stalled_since(_points(before) + _points(frame), max_gap=gap)
        since = since if longer is None else min(since, longer)
    lasted = 0.0 if since is None else float(latest["ts"]) - since
    stalled = since is not None and lasted >= stall_after(config)
    return {
        "stalled": stalled,
        "stalled_since": iso(since) if stalled and since is not None else None,
        "stall_seconds": lasted,
        **sleep,
    }


def _gauge_hit_rates(replicas: Sequence[HitRate], windows: list[Window]) -> list[float]:
    """The hit rates that are their engine's own gauge (no counters to merge): the fleet's
    rate is their mean where no replica has counters."""
    return [
        r["prefix_cache_hit_rate"]
        for r, w in zip(replicas, windows, strict=True)
        if r["prefix_cache_hit_rate"] is not None
        and w.deltas.get("prefix_cache_queries") is None
        and w.deltas.get("prefix_cache_hits") is None
    ]


def _fleet(
    replicas: list[ReplicaStatus],
    windows: list[Window],
    costs: list[float | None],
    utilizations: Sequence[flops.Utilization] = (),
) -> FleetNumbers:
    # Read by key name: each helper reads one key of every replica.
    rows: Sequence[Mapping[str, Any]] = replicas

    def values(key: str) -> list[Any]:
        return [r[key] for r in rows if r[key] is not None]

    def total(key: str) -> float | None:
        found = values(key)
        return sum(found) if found else None

    def count(key: str) -> int | None:  # a sum of whole numbers
        found = values(key)
        return sum(found) if found else None

    generations = set(values("engine_generation"))
    engines = set(values("engine"))
    scraped = values("last_scrape_at")
    engine = engines.pop() if len(engines) == 1 else ("mixed" if engines else None)
    engine_generation = (
        generations.pop() if len(generations) == 1 else ("mixed" if generations else None)
    )
    readings: Readings = {
        "name": "fleet",
        "up": all(r["up"] for r in replicas) if replicas else None,
        "stale": any(r["stale"] for r in replicas),
        "last_scrape_at": max(scraped) if scraped else None,
        "last_error": next(iter(values("last_error")), None),
        "engine": engine,
        "engine_generation": engine_generation,
        "unavailable": _fleet_unavailable(replicas),
        "engines": count("engines"),
        "model_names": sorted({m for r in replicas for m in r["model_names"]}),
        # A fraction is never summed: the fleet's occupancy is its fullest replica.
        "kv_cache_occupancy": max(values("kv_cache_occupancy"), default=None),
        "kv_cache_occupancy_mean": _mean(values("kv_cache_occupancy_mean")),
        "kv_cache_capacity_tokens": count("kv_cache_capacity_tokens"),
        "gpu_utilization": _mean(values("gpu_utilization")),
        "requests_running": total("requests_running"),
        "requests_waiting": total("requests_waiting"),
        "requests_waiting_capacity": total("requests_waiting_capacity"),
        "preemptions": total("preemptions"),
        "preemptions_per_second": total("preemptions_per_second"),
        "prompt_tokens_per_second": total("prompt_tokens_per_second"),
        "generation_tokens_per_second": total("generation_tokens_per_second"),
        "requests_refused_per_second": total("requests_refused_per_second"),
    }
    known_costs = [c for c in costs if c is not None]
    only_vllm = engine == "vllm"
    generation = engine_generation if only_vllm and engine_generation != "mixed" else None
    gauge_rates = _gauge_hit_rates(replicas, windows)
    # Recompute depends on each replica's own request shape and hit rate: add them up.
    estimates = values("preemption_recompute_is_estimate")
    return {
        **readings,
        **derived(
            merge(windows),
            generation,
            sum(known_costs) if known_costs else None,
            _mean(gauge_rates),
            (
                _mean(values("spec_decode_mean_acceptance_length")),
                _mean(values("spec_decode_acceptance_rate")),
            ),
        ),
        "preemption_recompute_is_estimate": any(estimates) if estimates else None,
        "preemption_recompute_tokens": total("preemption_recompute_tokens"),
        **_model_utilization(flops.fleet(utilizations)),
        "saturated_replicas": _saturated_count([r["saturation"] for r in replicas]),
    }


def _saturated_count(verdicts: Sequence[Saturation]) -> int | None:
    """Replicas judged saturated; None when no replica could be judged."""
    judged = [v["saturated"] for v in verdicts if v["saturated"] is not None]
    return sum(1 for v in judged if v) if judged else None


def _fleet_unavailable(replicas: Sequence[Numbers]) -> dict[str, str]:
    """Quantities no replica of the fleet can give: the reason, or each engine's."""
    if not replicas:
        return {}
    common = set.intersection(*(set(r["unavailable"]) for r in replicas))
    out = {}
    for quantity in sorted(common):
        reasons = sorted({r["unavailable"][quantity] for r in replicas})
        out[quantity] = "; ".join(reasons)
    return out


def _gpus(
    frame: pd.DataFrame, owners: GpuOwners, by_id: dict[int, str]
) -> tuple[list[GpuStatus], list[float | None]]:
    """Each GPU's block and its mean busy share over the window, in the order the GPUs
    first appear: each column converted once for all GPUs, then read per GPU as lists."""
    if frame.empty:
        return [], []
    latest = _last_rows(frame, "gpu_id")
    positions = frame.groupby("gpu_id", sort=False).indices
    energy, active, utilization = (
        _column(frame, key) for key in ("energy_mj", "gr_engine_active", "utilization")
    )
    blocks, busy = [], []
    for gpu_id in pd.unique(frame.gpu_id):
        if gpu_id not in positions:  # no group: a missing id
            continue
        mine = positions[gpu_id]
        joules = increase([energy[i] for i in mine] if energy else [])
        blocks.append(_gpu(latest[gpu_id], joules, owners, by_id))
        # GPU_UTIL only says a kernel ran; GR_ENGINE_ACTIVE is work done, where DCGM has it.
        shares = [active[i] for i in mine] if active else []
        if not any(v is not None for v in shares):
            shares = [utilization[i] for i in mine] if utilization else []
        busy.append(_mean(shares))
    return blocks, busy


def _summed_gpus(
    gpus: gpu_windows.Gpus, owners: GpuOwners, by_id: dict[int, str]
) -> tuple[list[GpuStatus], list[float | None]]:
    """_gpus' blocks and busy shares from the database's numbers per GPU: the same."""
    latest = _last_rows(gpus.last, "gpu_id")
    blocks = [_gpu(row, gpus.energy_mj[gpu_id], owners, by_id) for gpu_id, row in latest.items()]
    return blocks, [gpus.busy[gpu_id] for gpu_id in latest]


def _gpu(
    latest: dict[str, Any], energy: float | None, owners: GpuOwners, by_id: dict[int, str]
) -> GpuStatus:
    """A GPU's block from its last row and its energy counter's increase in mJ."""
    host, index = str(latest["host"]), int(latest["gpu_index"])
    exporter = by_id.get(int(latest["target_id"]), "")
    return {
        "host": host,
        "index": index,
        "model": latest["model"],
        "replica": owners.of(
            {host, exporter}, index, _text(latest, "pod"), _text(latest, "namespace")
        ),
        "utilization": _value(latest, "utilization"),
        "gr_engine_active": _value(latest, "gr_engine_active"),
        "sm_active": _value(latest, "sm_active"),
        "tensor_active": _value(latest, "tensor_active"),
        "dram_active": _value(latest, "dram_active"),
        "power_watts": _value(latest, "power_watts"),
        "energy_joules": None if energy is None else energy / 1000.0,
        "temperature_c": _value(latest, "temperature_c"),
        "memory_temperature_c": _value(latest, "memory_temperature_c"),
        "fb_used_mib": _value(latest, "fb_used_mib"),
        "xid_error": _value(latest, "xid_error"),
        "pod": None if pd.isna(latest["pod"]) else latest["pod"],
    }


def _edge_reader(
    session: Session, samples: pd.DataFrame
) -> Callable[[pd.DataFrame], pd.DataFrame] | None:
    """Read histogram rows at the window's edges when the bulk read left them out."""
    if "hist_ttft" in samples:
        return None
    return lambda keys: queries.replica_rows_at(session, keys)


class _Loads:
    """A replica's series inputs to the saturation verdict: its load gauges over the window
    as LoadStats, and TTFT's histogram increase over each of SUB_WINDOWS parts."""

    def __init__(self, stats: LoadStats, ttft_parts: Sequence[Any] = ()) -> None:
        self.stats = stats
        self.ttft_parts = ttft_parts


LOAD_COLUMNS = saturation_sql.COLUMNS


def _grid(stats: LoadStats) -> list[float]:
    """The SUB_WINDOWS + 1 boundaries of the window's sub-windows, as LoadStats.of and the
    database (kneepoint/store/saturation_sql.py) compute them."""
    if stats.start is None or stats.end is None:
        return []
    step = (stats.end - stats.start) / SUB_WINDOWS
    return [stats.start + k * step for k in range(SUB_WINDOWS)] + [stats.end]


def _saturations(
    session: Session,
    samples: pd.DataFrame,
    start: float,
    now: float,
    layouts: dict[int, tuple[float, ...]],
    ids: dict[int, str],
) -> dict[int, _Loads]:
    """Per replica (target id), the series kneepoint.derived.saturation.verdict reads: every
    sample's load gauges reduced to LoadStats, and TTFT's histogram at SUB_WINDOWS + 1
    evenly spaced rows (read once for all replicas)."""
    frame = samples
    if any(c not in samples for c in LOAD_COLUMNS):
        frame = queries.replica_frame(session, start, now, list(ids), columns=LOAD_COLUMNS)
    if frame.empty:
        return {}
    frame = frame[frame.target_id.isin(list(ids))]
    loads: dict[int, _Loads] = {}
    grids: dict[int, list[float]] = {}
    for target_id, rows in frame.groupby("target_id", sort=False):
        ts = rows.ts.astype(float).tolist()
        # Waiting for capacity where the engine says why requests wait (vLLM 0.11+), else all.
        capacity = rows.requests_waiting_capacity
        waiting = capacity if capacity.notna().any() else rows.requests_waiting
        points = [
            LoadPoint(t, _float(kv), _float(w), _float(r))
            for t, kv, w, r in zip(
                ts,
                rows.kv_cache_usage.tolist(),
                waiting.tolist(),
                rows.requests_running.tolist(),
                strict=True,
            )
        ]
        stats = LoadStats.of(points)
        loads[int(target_id)] = _Loads(stats)
        if len(ts) >= 2:
            # The last row at or before each boundary.
            at = np.searchsorted(np.asarray(ts), _grid(stats), side="right") - 1
            grids[int(target_id)] = [ts[max(int(i), 0)] for i in at]
    for target_id, parts in _ttft_parts(session, grids, layouts).items():
        loads[target_id].ttft_parts = parts
    return loads


def _saturations_sql(
    session: Session,
    start: float,
    now: float,
    layouts: dict[int, tuple[float, ...]],
    ids: dict[int, str],
) -> dict[int, _Loads]:
    """_saturations at fleet size: the database reduces each replica's rows to LoadStats and
    its grid rows' times in one statement (kneepoint/store/saturation_sql.py); TTFT's
    histogram is read at those rows, for all replicas at once."""
    found = saturation_sql.read(session, start, now, list(ids), SUB_WINDOWS)
    loads = {target: _Loads(LoadStats(**stats)) for target, (stats, _) in found.items()}
    grids = {target: grid for target, (_, grid) in found.items() if grid}
    for target_id, parts in _ttft_parts(session, grids, layouts).items():
        loads[target_id].ttft_parts = parts
    return loads


def _ttft_parts(
    session: Session, grids: dict[int, list[float]], layouts: dict[int, tuple[float, ...]]
) -> dict[int, list[Any]]:
    """Per target, TTFT's histogram increase between consecutive rows of its grid (its rows'
    TTFT column only, read once for all targets)."""
    picks = [(target, ts) for target, grid in grids.items() for ts in grid]
    if not picks:
        return {}
    keys = pd.DataFrame(sorted(set(picks)), columns=["target_id", "ts"])
    rows = queries.replica_rows_at(session, keys, columns=("hist_ttft",))
    found: dict[tuple[int, float], dict[str, Any]] = {
        (int(r["target_id"]), float(r["ts"])): r for r in rows.to_dict("records")
    }

    def histogram(row: dict[str, Any] | None) -> Any:
        text = None if row is None else row.get("hist_ttft")
        return None if text is None or isinstance(text, float) else decode_histogram(text, layouts)

    parts: dict[int, list[Any]] = {}
    for target, grid in grids.items():
        ttft = [histogram(found.get((target, ts))) for ts in grid]
        parts[target] = [window_histogram(ttft[i : i + 2]) for i in range(len(ttft) - 1)]
    return parts


def _float(value: Any) -> float | None:
    return (
        None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)
    )


def _per_second(window: Window, counter: str) -> float | None:
    """A counter's increase over the window ÷ the time between its first and last sample."""
    increase_ = window.deltas.get(counter)
    if increase_ is None or not window.seconds:
        return None
    return increase_ / window.seconds


# Staleness: a target whose last scrape (successful or not) is older than twice the scrape
# interval plus a grace (the interval itself, at most a minute) is no longer being watched.
STALE_GRACE_MAX = 60.0


def stale_after(config: Config) -> float:
    """Seconds after its last scrape at which a target counts as stale."""
    return 2 * config.scrape_interval + min(STALE_GRACE_MAX, config.scrape_interval)


def is_stale(last_scrape_at: float | None, config: Config, now: float) -> bool:
    """Was the target scraped, but not within stale_after? (Never scraped: not stale, its
    `up` is unknown.)"""
    return last_scrape_at is not None and now - last_scrape_at > stale_after(config)


def stale_targets(session: Session, config: Config, now: float) -> list[str]:
    """The configured targets, of every kind, that are stale now."""
    rows = queries.targets(session)
    return [
        t.name
        for t in config.targets
        if t.name in rows and is_stale(rows[t.name].last_scrape_at, config, now)
    ]


def replica_of(
    config: Config,
    hosts: set[str],
    index: int,
    pod: str | None = None,
    namespace: str | None = None,
) -> str | None:
    """The replica whose `gpus:` lists this GPU, by DCGM hostname or exporter target name;
    else the engine target without a `gpus:` list whose `pod` (and namespace, where both
    are known) dcgm-exporter labels the GPU with. None: the GPU is unassigned."""
    return GpuOwners(config).of(hosts, index, pod, namespace)


class GpuOwners:
    """replica_of for many GPUs: the config's `gpus:` references and pods indexed once, so
    each GPU is a few dictionary lookups, not a walk over every target's references (a
    million steps for 1,000 replicas' GPUs)."""

    def __init__(self, config: Config) -> None:
        # (host, index) -> (the target's position in the config, its name): the first
        # target listing the GPU wins, as the walk in config order found it.
        self.refs: dict[tuple[str, int], tuple[int, str]] = {}
        self.pods: dict[str, list[tuple[str | None, str]]] = {}
        for number, target in enumerate(config.targets):
            for ref in target.gpus:
                host, _, position = ref.rpartition("/")
                self.refs.setdefault((host, int(position)), (number, target.name))
            if not target.gpus and target.kind in ENGINE_KINDS and target.pod is not None:
                self.pods.setdefault(target.pod, []).append((target.namespace, target.name))

    def of(
        self, hosts: set[str], index: int, pod: str | None = None, namespace: str | None = None
    ) -> str | None:
        listed = [found for host in hosts if (found := self.refs.get((host, index)))]
        if listed:
            return min(listed)[1]
        if pod is None:
            return None
        for own_namespace, name in self.pods.get(pod, []):
            if namespace is None or own_namespace is None or own_namespace == namespace:
                return name
        return None


def _text(row: pd.Series, key: str) -> str | None:
    value = row.get(key)
    return None if value is None or pd.isna(value) else str(value)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _value(row: dict[str, Any] | None, key: str) -> Any:
    if row is None or key not in row:
        return None
    value = row[key]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def _column(frame: pd.DataFrame, key: str) -> list[float | None]:
    if key not in frame:
        return []
    # One conversion for the column, not pd.isna per value (7,000 columns a page at 1,000).
    return [None if v != v else v for v in frame[key].astype(float).tolist()]


def _mean(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def fleet_window(session: Session, config: Config, now: float, window: float) -> Window:
    """The fleet's window over [now − window, now] (its counter increases and histograms),
    from the same reads and the same merge as the status's fleet numbers."""
    if at_fleet_size(config):  # the database's few rows per replica (build_status)
        samples = window_rows.read(session, now - window, now).frame
    else:
        samples = queries.replica_frame(session, now - window, now, columns=queries.LIGHT_COLUMNS)
    spans = frame_windows(
        samples, queries.histogram_layouts(session), _edge_reader(session, samples)
    )
    replicas = _replica_names(config)  # once, not per target
    ids = {row.id for name, row in queries.targets(session).items() if name in replicas}
    return merge([w for target_id, w in spans.items() if target_id in ids])


def _replica_names(config: Config) -> set[str]:
    return {t.name for t in config.targets if t.kind in ENGINE_KINDS}


def at_fleet_size(config: Config) -> bool:
    """More replicas than distribution.FLEET_THRESHOLD: where pages draw from the database
    and the window's numbers come from its few rows per replica (window_rows). Reads the
    threshold when called, so a test can lower it."""
    return len(_replica_names(config)) > distribution.FLEET_THRESHOLD
