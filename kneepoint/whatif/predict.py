"""The what-if for a stored replica: calibrate it, replay its window unchanged and changed,
and set both against what was measured, with error bounds (the `whatif --json` contract).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from scipy.optimize import brentq
from sqlalchemy import select
from sqlalchemy.orm import Session

from kneepoint.config import Config, Slo
from kneepoint.derived.cost import gpu_hour_price
from kneepoint.knee.detect import knee
from kneepoint.knee.runs import Point, Run
from kneepoint.knee.sweep import DEFAULT_LADDER
from kneepoint.status import replica_of
from kneepoint.store import queries
from kneepoint.store.models import GpuRow
from kneepoint.store.runs import RunNotFound, load_run, load_runs
from kneepoint.timeline import iso
from kneepoint.twin.profiles import GPUS, MODELS
from kneepoint.whatif import validation
from kneepoint.whatif.calibrate import calibrate, calibrate_sweep
from kneepoint.whatif.changes import Change
from kneepoint.whatif.history import History, fraction_at_most, load_history
from kneepoint.whatif.predict_sweep import predict_sweep
from kneepoint.whatif.profile import EngineShape, Profile, WhatIfError
from kneepoint.whatif.replay import SLICE_SECONDS, Load, Replay, load_of, replay, reuse_share
from kneepoint.whatif.store import latest_profile

WEEK = 7 * 86400.0
# The numbers every one of measured, baseline and predicted has (the JSON contract).
CONTRACT = (
    "preemptions",
    "generation_tokens_per_second",
    "ttft_p99_seconds",
    "kv_cache_occupancy_p95",
    "cost_per_million_tokens",
)
SHOWN = (
    *CONTRACT,
    "prompt_tokens_per_second",
    "recomputed_prefill_tokens",
    "prefix_cache_hit_rate",
    "saturated_seconds",
    "waiting_mean",
    "ttft_p50_seconds",
    "itl_p50_seconds",
    "itl_p99_seconds",
    "e2e_p99_seconds",
    "knee_concurrency",
    "knee_output_tokens_per_second",
)
FRACTIONS = ("kv_cache_occupancy_p95", "prefix_cache_hit_rate")
RECOMPUTE_OUTPUT_SHARE = 0.5  # docs/reference/metrics.md: half its output made when preempted
# vLLM's defaults for the scheduler flags no engine exports (docs/explanation/whatif.md).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_MODEL_LEN = 32768
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
# What the twin does that no scrape can confirm: it always chunks prefills (vLLM V1's
# default; the flag is not exported).
CHUNKED_PREFILL = "not exported: chunked prefill on, as vLLM V1 always runs it"


def assumed_settings(
    config: Config,
    replica: str,
    max_num_seqs: int | None,
    max_model_len: int | None,
    max_num_batched_tokens: int | None,
    seen_running: float = 0.0,
) -> tuple[dict[str, int], dict[str, str]]:
    """The scheduler flags vLLM does not export (cache_config_info holds the KV cache's only),
    each from what was given (the calibrate flags), else the target's config
    (`max_num_batched_tokens`), else vLLM's default; and, for each not given or configured,
    what was assumed, in words (the what-if output's calibration.assumed)."""
    target = next((t for t in config.targets if t.name == replica), None)
    configured = target.max_num_batched_tokens if target is not None else None
    values: dict[str, int] = {}
    assumed: dict[str, str] = {}
    if max_num_seqs is not None:
        values["max_num_seqs"] = max_num_seqs
    else:
        values["max_num_seqs"] = max(DEFAULT_MAX_NUM_SEQS, math.ceil(seen_running))
        assumed["max_num_seqs"] = f"not exported: vLLM's default {DEFAULT_MAX_NUM_SEQS}" + (
            " raised to the most requests seen running" if seen_running > 256 else ""
        )
    if max_model_len is not None:
        values["max_model_len"] = max_model_len
    else:
        values["max_model_len"] = DEFAULT_MAX_MODEL_LEN
        assumed["max_model_len"] = f"not exported: {DEFAULT_MAX_MODEL_LEN} assumed"
    if max_num_batched_tokens is not None:
        values["max_num_batched_tokens"] = max_num_batched_tokens
    elif configured is not None:
        values["max_num_batched_tokens"] = configured
    else:
        values["max_num_batched_tokens"] = DEFAULT_MAX_NUM_BATCHED_TOKENS
        assumed["max_num_batched_tokens"] = (
            f"not exported and not in the target's config: vLLM's default "
            f"{DEFAULT_MAX_NUM_BATCHED_TOKENS}"
        )
    assumed["enable_chunked_prefill"] = CHUNKED_PREFILL
    return values, assumed


def replica_shape(
    session: Session,
    config: Config,
    replica: str,
    history: History | None = None,
    max_num_seqs: int | None = None,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> EngineShape:
    """The replica's engine as its scrapes say it (cache_config_info: blocks, block size,
    dtype, prefix caching, memory share; the model; its GPU by DCGM's model name; the
    drafter's tokens and acceptance from its counters). Its scheduler's limits are not
    exposed: assumed_settings (max_num_seqs defaults to vLLM's 256, or the most requests
    seen running if more; max_num_batched_tokens the target's config, else 2048)."""
    target = queries.targets(session).get(replica)
    if target is None or target.kind == "dcgm":
        raise WhatIfError(f"unknown replica {replica!r}")
    if not target.num_gpu_blocks or not target.block_size:
        raise WhatIfError(f"{replica} has not reported its KV cache (cache_config_info) yet")
    names = set(_json_list(target.model_names))
    model = next((key for key, m in MODELS.items() if m.name in names), None)
    gpu = _gpu_key(session, config, replica)
    spec, acceptance = 0, 0.0
    seen = 0.0
    if history is not None:
        spec, acceptance = _drafter(history)
        seen = history.running_peak
    values, _ = assumed_settings(
        config, replica, max_num_seqs, max_model_len, max_num_batched_tokens, seen
    )
    return EngineShape(
        num_gpu_blocks=int(target.num_gpu_blocks),
        block_size=int(target.block_size),
        max_num_seqs=values["max_num_seqs"],
        max_model_len=values["max_model_len"],
        max_num_batched_tokens=values["max_num_batched_tokens"],
        enable_prefix_caching=target.prefix_caching is not False,
        kv_cache_dtype="fp8" if (target.cache_dtype or "").startswith("fp8") else "auto",
        gpu_memory_utilization=target.gpu_memory_utilization or 0.9,
        num_speculative_tokens=spec,
        spec_acceptance_rate=acceptance,
        gpu=gpu,
        model=model,
    )


def _json_list(text: str | None) -> list[str]:
    return list(json.loads(text)) if text else []


def _gpu_key(session: Session, config: Config, replica: str) -> str | None:
    """The profile of the replica's GPU, where its DCGM model name has one."""
    exporters = {row.id: name for name, row in queries.targets(session).items()}
    for row in session.scalars(select(GpuRow)):
        hosts = {row.host, exporters.get(row.target_id, "")}
        if replica_of(config, hosts, row.gpu_index, row.pod, row.namespace) == replica:
            return next((key for key, g in GPUS.items() if g.name == row.model), None)
    return None


def _drafter(history: History) -> tuple[int, float]:
    """Draft tokens per step and the per-token acceptance α (each drafted token accepted
    with α given the ones before it: E[accepted] = α + α² + … + α^γ) from the counters."""
    drafts = history.totals.get("spec_decode_drafts") or 0.0
    drafted = history.totals.get("spec_decode_draft_tokens") or 0.0
    accepted = history.totals.get("spec_decode_accepted_tokens") or 0.0
    if drafts <= 0 or drafted <= 0:
        return 0, 0.0
    gamma = max(1, round(drafted / drafts))
    mean = min(accepted / drafts, gamma - 1e-9)
    if mean <= 0:
        return gamma, 0.0
    alpha = brentq(lambda a: sum(a**i for i in range(1, gamma + 1)) - mean, 0.0, 1.0)
    return gamma, float(alpha)


CANDIDATE_RUNS = 5  # the newest runs tried when no run is named


def candidate_runs(
    session: Session, replica: str, model_names: list[str], label: str | None
) -> list[Run]:
    """The knee runs to calibrate from: `label`, else the newest few whose label starts with
    the replica's name, else the newest few of the model it serves (newest first)."""
    if label is not None:
        try:
            return [load_run(session, label)]
        except RunNotFound as error:
            raise WhatIfError(str(error)) from None
    runs = load_runs(session)
    own = [r for r in runs if r.label.startswith(replica)]
    same = [r for r in runs if r.model in model_names]
    chosen = own or same
    if not chosen:
        raise WhatIfError(
            f"no knee run of {replica} or its model: run `kneepoint sweep` or give --run"
        )
    return chosen[::-1][:CANDIDATE_RUNS]


def calibrate_replica(
    session: Session,
    config: Config,
    replica: str,
    run_label: str | None,
    start: float,
    end: float,
    now: float | None = None,
    max_num_seqs: int | None = None,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> Profile:
    """Fit the replica's profile from its knee run and its production history over
    [start, end] (either may be missing, not both); fitted at `now` (default `end`). The
    run is `run_label`, else of the replica's newest runs (or its model's) the one the fit
    reproduces best: a what-if sweep at another configuration (fp8 KV, half the context)
    is not the replica's, and its numbers do not fit the replica's shape. The caller stores
    the profile (store.save_profile)."""
    now = end if now is None else now
    try:
        history: History | None = load_history(session, replica, start, end)
    except WhatIfError:
        if replica not in queries.targets(session):
            raise
        history = None
    shape = replica_shape(
        session, config, replica, history, max_num_seqs, max_model_len, max_num_batched_tokens
    )
    _, assumed = assumed_settings(
        config,
        replica,
        max_num_seqs,
        max_model_len,
        max_num_batched_tokens,
        history.running_peak if history is not None else 0.0,
    )
    target = queries.targets(session)[replica]
    levels = history.levels() if history is not None else []
    try:
        runs = candidate_runs(session, replica, _json_list(target.model_names), run_label)
    except WhatIfError:
        if run_label is not None or not levels:
            raise
        fitted = calibrate_sweep([], shape, replica=replica, levels=levels, now=now)
        fitted.notes["assumed"] = assumed
        return fitted
    fits = [calibrate(run, shape, replica, levels, now=now) for run in runs]
    best = min(fits, key=lambda fit: (not fit.fit.trusted, fit.fit.rms))
    best.notes["assumed"] = assumed
    return best


@dataclass
class WhatIf:
    replica: str
    change: Change
    start: float
    end: float
    profile: Profile
    load: Load
    measured: dict[str, Any]
    baseline: dict[str, Any]
    predicted: dict[str, Any]
    baseline_error: dict[str, float | None]
    how: dict[str, Any] = field(default_factory=dict)  # the replay's bucket and slice

    def as_dict(self) -> dict[str, Any]:
        """The `kneepoint whatif --json` contract (docs/explanation/whatif.md)."""
        return {
            "replica": self.replica,
            "change": self.change.as_dict(),
            "window": {
                "start": iso(self.start),
                "end": iso(self.end),
                "seconds": self.end - self.start,
            },
            "calibration": {
                "run_label": self.profile.run_label,
                "fitted_at": iso(self.profile.fitted_at) if self.profile.fitted_at else None,
                "trusted": self.profile.fit.trusted,
                "rms_relative_error": self.profile.fit.rms,
                # Settings no scrape gives, each with what was assumed (else read or given).
                "assumed": self.profile.notes.get("assumed"),
            },
            "replay": _plain(self.how),
            "load": _plain(self.load.as_dict()),
            "measured": _plain(self.measured),
            "baseline": _plain(self.baseline),
            "predicted": _plain(self.predicted),
            "baseline_error": _plain(self.baseline_error),
            "validation": self.validation(),
        }

    def validation(self) -> dict[str, Any]:
        """Whether the change lies inside what the validation bench measured against a real
        vLLM (kneepoint/whatif/validation.py), why not, and the worst published miss of each
        aimed number for the changes it makes."""
        verdict = validation.judge(
            validation.load(), self.change.as_dict(), self.profile.shape.as_dict()
        )
        return {
            "validated": verdict.validated,
            "reasons": list(verdict.reasons),
            "published_error": verdict.errors,
        }


@dataclass
class Baseline:
    """A window replayed as it is: shared by every change of (replica, calibration, window,
    seed, slice) and by the page (baseline_replay's cache)."""

    history: History
    load: Load
    shared: float  # reuse_share's session prefix share
    replay: Replay
    seconds: float  # wall time it took (history read, reuse share, replay)
    knee: tuple[int | None, float | None] | None = None  # the unchanged sweep's, once asked


BASELINE_CACHE = 32  # baselines kept per process (the review's and the page's)
_BASELINES: OrderedDict[tuple[Any, ...], Baseline] = OrderedDict()


def _profile_key(profile: Profile) -> str:
    text = json.dumps(_plain(profile.as_dict()), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def baseline_replay(
    session: Session,
    replica: str,
    profile: Profile,
    start: float,
    end: float,
    slos: tuple[Slo, ...] | list[Slo] = (),
    seed: int = 0,
    slice_seconds: float = SLICE_SECONDS,
    requests: int = 400,
) -> Baseline:
    """The replica's window [start, end] replayed unchanged, computed once per process for
    (replica, calibration, window, seed, slice, SLOs) and kept in an in-process cache (the
    weekly review and the What-if page each run in one process)."""
    key = (
        replica,
        _profile_key(profile),
        float(start),
        float(end),
        seed,
        float(slice_seconds),
        requests,
        tuple(json.dumps(slo.model_dump(mode="json"), sort_keys=True) for slo in slos),
    )
    cached = _BASELINES.get(key)
    if cached is not None:
        _BASELINES.move_to_end(key)
        return cached
    began = time.perf_counter()
    history = load_history(session, replica, start, end)
    load = load_of(history)
    shared = reuse_share(profile, load, seed=seed, requests=requests)
    base = replay(profile, load, None, slos, slice_seconds, seed, shared=shared)
    baseline = Baseline(history, load, shared, base, time.perf_counter() - began)
    _BASELINES[key] = baseline
    while len(_BASELINES) > BASELINE_CACHE:
        _BASELINES.popitem(last=False)
    return baseline


def whatif_replica(
    session: Session,
    config: Config,
    replica: str,
    change: Change,
    start: float,
    end: float,
    profile: Profile | None = None,
    slice_seconds: float = SLICE_SECONDS,
    requests: int = 400,
    baseline: Baseline | None = None,
    seed: int = 0,
    knees: bool = True,
) -> WhatIf:
    """The replica's window [start, end], measured, replayed as it is (baseline) and after
    `change` (predicted), with the newest calibration fitted by `end` unless `profile` is
    given. The baseline is `baseline` when given (baseline_replay's for this replica,
    calibration and window), else baseline_replay's cached one. `knees=False` leaves out the
    knee of a predicted sweep (null: the weekly review does not read it, and each sweep costs
    more than the replay). WhatIfError: no
    calibration, an untrusted one, an unknown replica, no history, a change that cannot
    apply."""
    target = queries.targets(session).get(replica)
    if target is None or target.kind == "dcgm":
        raise WhatIfError(f"unknown replica {replica!r}")
    profile = profile or latest_profile(session, replica, end)
    profile.require_trusted()
    if baseline is None:
        baseline = baseline_replay(
            session, replica, profile, start, end, config.slos, seed, slice_seconds, requests
        )
    history, load, base = baseline.history, baseline.load, baseline.replay
    run = _run_of(session, profile)
    after = replay(profile, load, change, config.slos, slice_seconds, seed, shared=baseline.shared)
    price = _price(session, config, replica, profile.shape.gpu)
    new_price = (
        config.pricing.gpu_hour.get(
            GPUS[change.gpu].name, config.pricing.gpu_hour.get("default", 0.0)
        )
        if change.gpu
        else price
    )
    measured = _measured(history, load, config, price, run)
    if knees and baseline.knee is None:
        baseline.knee = _knee(profile, Change())
    unchanged = _numbers(base, price, (baseline.knee or (None, None)) if knees else (None, None))
    predicted = _numbers(after, new_price, _knee(profile, change) if knees else (None, None))
    errors = {
        key: _relative(unchanged.get(key), measured.get(key))
        for key in SHOWN
        if key not in ("cost_per_million_tokens",)
    }
    calibration = profile.fit.rms
    for numbers in (unchanged, predicted):
        numbers["bounds"] = {
            key: _bounds(numbers.get(key), calibration, errors.get(key), key in FRACTIONS)
            for key in SHOWN
            if not key.startswith("knee_")
        }
    how = {
        "buckets": len(load.per_bucket),
        "slice_seconds": slice_seconds,
        "seed": seed,
        "lengths_from_histograms": load.lengths_from_histograms,
        "baseline_seconds": baseline.seconds,
    }
    return WhatIf(
        replica, change, start, end, profile, load, measured, unchanged, predicted, errors, how
    )


def _run_of(session: Session, profile: Profile) -> Run | None:
    if profile.run_label is None:
        return None
    try:
        return load_run(session, profile.run_label)
    except RunNotFound:
        return None


def _price(session: Session, config: Config, replica: str, gpu: str | None) -> float:
    """USD per hour of one replica (kneepoint/derived/cost.py's price, by its GPU)."""
    models = [GPUS[gpu].name] if gpu else []
    return gpu_hour_price(config.pricing, replica, models)


def _measured(
    history: History, load: Load, config: Config, price: float, run: Run | None
) -> dict[str, Any]:
    m = history.measured()
    hit = m.get("prefix_cache_hit_rate") or 0.0
    per_preemption = load.prompt_tokens_mean + RECOMPUTE_OUTPUT_SHARE * load.output_tokens_mean
    out: dict[str, Any] = {key: m.get(key) for key in SHOWN if key in m}
    out["recomputed_prefill_tokens"] = (m["preemptions"] or 0.0) * per_preemption * (1 - hit)
    out["recomputed_prefill_is_estimate"] = True  # V1 counts none (docs/reference/metrics.md)
    out["cost_per_million_tokens"] = _cost(
        price, m["seconds"] or 0.0, 1, (m["generation_tokens"] or 0.0) + (m["prompt_tokens"] or 0.0)
    )
    out["slo_compliance"] = {
        slo.name: fraction_at_most(history.histograms.get(slo.metric), slo.threshold)
        for slo in config.slos
        if slo.kind == "latency" and slo.metric and slo.threshold
    }
    at = knee(run.points) if run is not None else None
    out["knee_concurrency"] = at
    out["knee_output_tokens_per_second"] = _throughput_at(run.points, at) if run else None
    out["replicas"] = 1
    return out


def _numbers(
    result: Replay, price: float, knee_point: tuple[int | None, float | None]
) -> dict[str, Any]:
    n = dict(result.numbers)
    served = n["generation_tokens"] + n["prompt_tokens"]
    n["cost_per_million_tokens"] = _cost(price, n["seconds"], result.replicas, served)
    n["knee_concurrency"], n["knee_output_tokens_per_second"] = knee_point
    return n


def _knee(profile: Profile, change: Change) -> tuple[int | None, float | None]:
    """The knee of a predicted sweep of one replica after `change` (the calibration
    sweep's request shape)."""
    one = replace(change, replicas=1, growth=1.0, routing="sticky")
    ladder = profile.notes.get("ladder") or DEFAULT_LADDER
    predicted = predict_sweep(profile, one, tuple(ladder))
    points = [Point(p.concurrency, p.output_tokens_per_second) for p in predicted]
    at = knee(points)
    return at, _throughput_at(points, at)


def _throughput_at(points: tuple[Point, ...] | list[Point], at: int | None) -> float | None:
    return next((p.output_tokens_per_second for p in points if p.concurrency == at), None)


def _cost(price: float, seconds: float, replicas: int, tokens: float) -> float | None:
    if tokens <= 0:
        return None
    return price * replicas * seconds / 3600.0 / (tokens / 1e6)


def _relative(value: Any, reference: Any) -> float | None:
    if not isinstance(value, (int, float)) or not isinstance(reference, (int, float)):
        return None
    if reference == 0:
        return 0.0 if value == 0 else None
    return float((value - reference) / abs(reference))


def _bounds(
    value: Any, calibration: float, baseline: float | None, fraction: bool
) -> list[float] | None:
    """± the calibration's RMS relative error and the baseline's relative error for the
    same number, added in quadrature (a baseline that missed what was measured by e misses
    the changed week by about as much)."""
    if not isinstance(value, (int, float)):
        return None
    spread = math.sqrt(calibration**2 + (baseline or 0.0) ** 2)
    low, high = value * (1 - spread), value * (1 + spread)
    if fraction:
        high = min(high, 1.0)
    return [max(0.0, float(low)), float(high)]


def _plain(data: Any) -> Any:
    """JSON-ready: numpy scalars as Python numbers, NaN and infinity as null."""
    if isinstance(data, dict):
        return {str(k): _plain(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_plain(v) for v in data]
    if hasattr(data, "item"):
        data = data.item()
    if isinstance(data, float) and not math.isfinite(data):
        return None
    return data
