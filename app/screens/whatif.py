"""What-if: the replica's calibrated twin replays its stored window unchanged (the baseline,
against what was measured) and under one change (kneepoint.whatif), before and after."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import actions, auth, data, filters
from app import tables as t
from app.format import utc
from app.plots import chart
from dashboards.charts import LAYOUT, axis_title
from kneepoint.auth import Refused
from kneepoint.config import config_path
from kneepoint.durations import parse_duration
from kneepoint.twin.profiles import GPUS
from kneepoint.whatif import (
    KEYS,
    TRUST_RMS,
    Profile,
    WhatIfError,
    latest_profile,
    parse_changes,
    validation,
    whatif_replica,
)
from kneepoint.whatif.predict import SHOWN
from review.effects import METRICS, bound, flags, number
from review.render import value

WINDOWS = ("1d", "3d", "7d", "14d", "30d")
DEFAULT_WINDOW = "7d"
# The changes, as a person picks them (kneepoint.whatif.KEYS less the modifiers that go with
# another: routing with replicas, spec_acceptance_rate with a drafter).
LABELS = {
    "kv_cache_dtype": "KV-cache dtype (--kv-cache-dtype)",
    "max_num_seqs": "Max sequences (--max-num-seqs)",
    "max_model_len": "Max model length (--max-model-len)",
    "max_num_batched_tokens": "Token budget per step (--max-num-batched-tokens)",
    "gpu_memory_utilization": "GPU memory share (--gpu-memory-utilization)",
    "num_gpu_blocks": "KV blocks (--num-gpu-blocks-override)",
    "num_speculative_tokens": "Speculative tokens (0: no drafter)",
    "enable_prefix_caching": "Prefix caching",
    "gpu": "Another GPU",
    "replicas": "Replicas behind the same traffic",
    "growth": "Traffic growth (×)",
}
CHOICES = [key for key in LABELS if key in KEYS]


# -- reads (cached by their inputs) and the one write ---------------------------------------


def profile_of(replica: str) -> dict[str, Any] | None:
    """The replica's latest calibration (Profile.as_dict()), or None."""
    return _profile(str(config_path().resolve()), replica)


@st.cache_data(ttl=10, show_spinner=False)
def _profile(path: str, replica: str) -> dict[str, Any] | None:
    _, sessions = data.store()
    with sessions() as session:
        try:
            return latest_profile(session, replica).as_dict()
        except WhatIfError:  # none yet
            return None


def predict(
    replica: str,
    change: tuple[tuple[str, Any], ...],
    start: float,
    end: float,
    profile: dict[str, Any],
) -> dict[str, Any]:
    """`whatif --json` for the replica and change over [start, end] with the calibration
    shown (cached by all of them: a new calibration replays again)."""
    return _predict(str(config_path().resolve()), replica, change, start, end, profile)


@st.cache_data(ttl=3600, show_spinner="Replaying the window through the twin…", max_entries=64)
def _predict(
    path: str,
    replica: str,
    change: tuple[tuple[str, Any], ...],
    start: float,
    end: float,
    profile: dict[str, Any],
) -> dict[str, Any]:
    config, sessions = data.store()
    with sessions() as session:
        result = whatif_replica(
            session,
            config,
            replica,
            parse_changes(dict(change)),
            start,
            end,
            profile=Profile.from_dict(profile),
        )
    return result.as_dict()


def calibrate(replica: str, run_label: str | None, start: float, end: float) -> dict[str, Any]:
    """Fit and store the replica's calibration (app/actions.py: role checked and audited
    there), then forget the cached profile so the page shows the new fit."""
    profile = actions.calibrate(replica, run_label, start, end)
    _profile.clear()
    return profile.as_dict()


# -- how it reads ---------------------------------------------------------------------------


def picker(key: str, shape: dict[str, Any]) -> dict[str, Any]:
    """A value picker for `key`, starting from a sensible step away from the calibrated
    engine; returns the change as kneepoint.whatif takes it."""
    seqs = int(shape.get("max_num_seqs") or 256)
    if key == "kv_cache_dtype":
        now = shape.get("kv_cache_dtype") or "auto"
        options = ["fp8", "auto"] if now == "auto" else ["auto", "fp8"]
        return {key: st.selectbox("KV-cache dtype", options, help="auto: the model's dtype.")}
    if key == "max_num_seqs":
        return {key: int(st.number_input("--max-num-seqs", 1, 4096, max(2, 2 * seqs)))}
    if key == "max_model_len":
        now = int(shape.get("max_model_len") or 32768)
        return {key: int(st.number_input("--max-model-len", 128, 1_048_576, max(128, now // 2)))}
    if key == "max_num_batched_tokens":
        now = int(shape.get("max_num_batched_tokens") or 2048)
        return {key: int(st.number_input("--max-num-batched-tokens", 16, 1_048_576, 2 * now))}
    if key == "gpu_memory_utilization":
        now = float(shape.get("gpu_memory_utilization") or 0.9)
        share = st.slider("--gpu-memory-utilization", 0.11, 0.99, min(0.99, now + 0.05), 0.01)
        return {key: share}
    if key == "num_gpu_blocks":
        now = int(shape.get("num_gpu_blocks") or 2)
        return {key: int(st.number_input("KV blocks", 2, 10_000_000, max(2, now // 2)))}
    if key == "num_speculative_tokens":
        drafted = int(st.slider("Speculative tokens per step (0: no drafter)", 0, 8, 0))
        if drafted and not shape.get("num_speculative_tokens"):
            rate = st.slider("Acceptance rate per drafted token", 0.0, 1.0, 0.7, 0.05)
            return {key: drafted, "spec_acceptance_rate": rate}
        return {key: drafted}
    if key == "enable_prefix_caching":
        on = st.toggle("Prefix caching on", value=not shape.get("enable_prefix_caching", True))
        return {key: on}
    if key == "gpu":
        options = [name for name in GPUS if name != shape.get("gpu")]
        return {key: st.selectbox("GPU profile", options, format_func=lambda k: GPUS[k].name)}
    if key == "replicas":
        count = int(st.number_input("Replicas", 1, 64, 2))
        routing = st.radio("Routing", ["sticky", "round-robin"], horizontal=True)
        return {key: count, "routing": routing}
    growth = st.number_input("Traffic ×", 0.1, 100.0, 1.5, 0.1)
    return {key: float(growth)}


def calibration(profile: dict[str, Any]) -> None:
    fit = profile.get("fit") or {}
    trusted = bool(fit.get("trusted"))
    rms = number(fit.get("rms_relative_error"))
    a, b, c, d = st.columns(4)
    a.metric("Fit", "trusted" if trusted else "not trusted", help=fit.get("reason") or None)
    b.metric(
        "RMS error",
        value(rms, "%"),
        help=f"Root-mean-square relative error over the fitted points; trusted below "
        f"{TRUST_RMS:.0%}.",
    )
    c.metric("Fitted points", str(len(fit.get("points") or [])))
    fitted_at = number(profile.get("fitted_at"))
    d.metric(
        "Fitted",
        "–"
        if fitted_at is None
        else pd.Timestamp(fitted_at, unit="s", tz="UTC").strftime("%Y-%m-%d %H:%M UTC"),
        help=f"From the knee run {profile.get('run_label')!r}."
        if profile.get("run_label")
        else None,
    )
    shape = profile.get("shape") or {}
    st.caption(
        f"Engine as calibrated: {shape.get('num_gpu_blocks')} KV blocks of "
        f"{shape.get('block_size')} tokens, KV dtype {shape.get('kv_cache_dtype')}, "
        f"--max-num-seqs {shape.get('max_num_seqs')}, --max-model-len "
        f"{shape.get('max_model_len')}, prefix caching "
        f"{'on' if shape.get('enable_prefix_caching') else 'off'}"
        + (f", GPU {GPUS[shape['gpu']].name}" if shape.get("gpu") in GPUS else "")
        + (f", model {shape['model']}" if shape.get("model") else "")
        + "."
    )
    if not trusted:
        st.warning(
            f"This calibration is not trusted ({fit.get('reason') or 'too poor a fit'}): "
            "it predicts nothing. Calibrate again from a cleaner sweep."
        )
    points = pd.DataFrame(fit.get("points") or [])
    if not points.empty:
        with st.expander("Fitted points: measured against the fit"):
            t.people_table(
                points,
                {
                    "metric": t.text("Number"),
                    "load": t.number("Load", digits=0),
                    "measured": t.number("Measured", digits=4),
                    "fitted": t.number("Fitted", digits=4),
                    "relative_error": t.percent("Error", help="(fitted − measured) ÷ measured."),
                    "source": t.text("Source", help="The sweep or stored window measured."),
                },
                identity="metric",
                matters=("relative_error", "measured"),
                budget=t.PHONE_WIDTH_IN_EXPANDER,
            )


def before_after(result: dict[str, Any]) -> None:
    measured = result.get("measured") or {}
    predicted = result.get("predicted") or {}
    columns = st.columns(len(METRICS))
    for column, (key, label, unit) in zip(columns, METRICS, strict=True):
        before, after = number(measured.get(key)), number(predicted.get(key))
        error = bound(result, key)
        column.metric(
            label[0].upper() + label[1:],
            value(after, unit),
            delta=None if before is None or after is None else f"{value(after - before, unit)}",
            delta_color="off",
            help=f"Predicted under the change; measured {value(before, unit)}"
            + ("" if error is None else f", ± {error:.0%} from the calibration's error"),
        )
    # The row's name pinned, then what it will be and what it is: on a phone the other
    # numbers scroll under the name, never off with it (tables.phone_layout).
    shown = table(result)
    order, config = t.phone_layout(
        shown,
        WHAT,
        [PREDICTED, MEASURED],
        {
            PREDICTED: st.column_config.TextColumn("Predicted", help=PREDICTED + "."),
            BASELINE: st.column_config.TextColumn("Baseline", help=BASELINE + "."),
        },
    )
    st.dataframe(shown, hide_index=True, width="stretch", column_order=order, column_config=config)
    st.caption(
        "Baseline vs measured: how closely the unchanged replay reproduces the window (its "
        "relative error); the predicted range adds it to the calibration's error."
    )
    left, right = st.columns(2)
    for index, (key, label, unit) in enumerate(METRICS):
        chart(figure(result, key, label, unit), left if index % 2 == 0 else right)


# The other numbers of the result: label, unit, scale (kneepoint.whatif.predict.SHOWN).
EXTRA: dict[str, tuple[str, str, float]] = {
    "prompt_tokens_per_second": ("prompt throughput", "tok/s", 1.0),
    "recomputed_prefill_tokens": ("recomputed prefill", "tokens", 1.0),
    "prefix_cache_hit_rate": ("prefix hit rate", "%", 1.0),
    "saturated_seconds": ("time KV full", "h", 1 / 3600),
    "waiting_mean": ("waiting (mean)", "seqs", 1.0),
    "ttft_p50_seconds": ("TTFT p50", "s", 1.0),
    "itl_p50_seconds": ("ITL p50", "s", 1.0),
    "itl_p99_seconds": ("ITL p99", "s", 1.0),
    "e2e_p99_seconds": ("end-to-end p99", "s", 1.0),
    "knee_concurrency": ("knee (concurrency)", "", 1.0),
    "knee_output_tokens_per_second": ("throughput at the knee", "tok/s", 1.0),
}


def unit_of(key: str) -> str:
    if key in ("kv_cache_occupancy_p95", "prefix_cache_hit_rate"):
        return "%"
    if key.endswith("tokens_per_second"):
        return "tok/s"
    if key.startswith("cost_"):
        return "$"
    if key.endswith("_seconds"):
        return "s"
    return "tokens" if key.endswith("_tokens") else ""


# The before-and-after table's headers, as people read them.
WHAT, MEASURED, BASELINE, BASELINE_ERROR, PREDICTED, RANGE = (
    "Number",
    "Measured",
    "Baseline (twin, unchanged)",
    "Baseline vs measured",
    "Predicted (twin, changed)",
    "Predicted range",
)


def table(result: dict[str, Any]) -> pd.DataFrame:
    """Every number of the result: measured, baseline, predicted with its range, and how
    closely the baseline reproduced what was measured."""
    sides = {side: result.get(side) or {} for side in ("measured", "baseline", "predicted")}
    shown = {key: (label, unit, 1.0) for key, label, unit in METRICS}
    shown |= {
        key: EXTRA.get(key, (key.replace("_", " "), unit_of(key), 1.0))
        for key in SHOWN
        if key not in shown
    }
    rows = []
    for key, (label, unit, scale) in shown.items():

        def at(side: str, key: str = key, scale: float = scale) -> float | None:
            found = number(sides[side].get(key))
            return None if found is None else found * scale

        low, high = ((sides["predicted"].get("bounds") or {}).get(key) or [None, None])[:2]
        low, high = number(low), number(high)
        error = number((result.get("baseline_error") or {}).get(key))
        rows.append(
            {
                WHAT: label,
                MEASURED: value(at("measured"), unit),
                BASELINE: value(at("baseline"), unit),
                BASELINE_ERROR: "–" if error is None else f"{error:+.0%}",
                PREDICTED: value(at("predicted"), unit),
                RANGE: "–"
                if low is None or high is None
                else f"{value(low * scale, unit)} – {value(high * scale, unit)}",
            }
        )
    for name in (sides["measured"].get("slo_compliance") or {}) | (
        sides["predicted"].get("slo_compliance") or {}
    ):
        rows.append(
            {
                WHAT: f"SLO {name}: compliance",
                **{
                    column: value(number((sides[side].get("slo_compliance") or {}).get(name)), "%")
                    for column, side in (
                        (MEASURED, "measured"),
                        (BASELINE, "baseline"),
                        (PREDICTED, "predicted"),
                    )
                },
                BASELINE_ERROR: "–",
                RANGE: "–",
            }
        )
    return pd.DataFrame(rows)


def _when(iso: Any) -> str:
    """The replayed window's ISO bound as the app writes times: "2026-12-01 14:03:05 UTC"."""
    if not iso:
        return "–"
    return utc(datetime.fromisoformat(str(iso).replace("Z", "+00:00")).timestamp())


def figure(result: dict[str, Any], key: str, label: str, unit: str) -> go.Figure:
    """Measured, baseline and predicted as three bars, the prediction with its error bar."""
    names = ("measured", "baseline", "predicted")
    heights = [number((result.get(name) or {}).get(key)) for name in names]
    error = bound(result, key)
    predicted = heights[2]
    spread = [0.0, 0.0, 0.0 if error is None or predicted is None else abs(predicted) * error]
    shown = [(n, h, s) for n, h, s in zip(names, heights, spread, strict=True) if h is not None]
    scale = 100.0 if unit == "%" else 1.0
    bars = go.Bar(
        x=[n for n, _, _ in shown],
        y=[h * scale for _, h, _ in shown],  # type: ignore[operator]
        error_y={"type": "data", "array": [s * scale for _, _, s in shown], "visible": True},
        marker_color=["#8c959f", "#54aeff", "#0969da"][: len(shown)],
        name=label,
    )
    chart_figure = go.Figure(bars)
    chart_figure.update_layout(
        **{**LAYOUT, "hovermode": "closest", "height": 300},
        title=f"{label[0].upper()}{label[1:]}: before and after",
        yaxis_title=axis_title(label, unit or "count"),
        showlegend=False,
    )
    return chart_figure


def trust() -> None:
    """The bench's published errors against a real vLLM, one row per kind of change. Shown
    open, not in an expander: it says how far to trust what the page predicts (and a
    browser does not paint a table in a closed expander)."""
    st.subheader("How close the predictions are")
    document = validation.load()
    if document is None:
        st.info("No validation against a real vLLM has been published with this build.")
        return
    rows = pd.DataFrame(validation.table(document))
    t.people_table(
        rows,
        {column: t.text(column[0].upper() + column[1:]) for column in rows.columns},
        identity="change",
        matters=("throughput", "TTFT p95"),  # whole on a phone; ITL and preemptions scroll
    )
    st.caption(
        f"{validation.aims_sentence(document)} The worst miss over the loads tried; "
        "✓: every load met the aim, ✗: one did not. From `bench/whatif_validation.py` "
        f"(vLLM {document.get('vllm') or ''}, CPU build, "
        f"{_when(document.get('generated_at'))}): docs/how-to/whatif.md says why each miss."
    )


def verdict(result: dict[str, Any]) -> None:
    """Marks a prediction outside what the bench validated (`whatif --json`'s validation),
    or gives the published error of the change it makes."""
    checked = result.get("validation") or {}
    if not checked.get("validated"):
        reasons = checked.get("reasons") or ["no validation was published"]
        st.warning("Outside the validated range: " + "; ".join(reasons) + ".")
        return
    errors = checked.get("published_error") or {}
    misses = [
        f"{label} {validation.describe(key, errors.get(key))}"
        for key, label in validation.METRICS
        if key in validation.AIMED and errors.get(key) is not None
    ]
    st.caption("Inside the validated range; worst published miss: " + ", ".join(misses) + ".")


# -- the page -------------------------------------------------------------------------------

replicas = data.replica_names()
view = filters.current(replicas)
st.title("What-if")
st.caption(
    "The twin, calibrated to a replica from its knee runs and its own history, replays the "
    "replica's stored window: first unchanged (the baseline, which should reproduce what was "
    "measured) and then under one change. Predictions carry the calibration's error; an "
    "untrusted calibration predicts nothing. `kneepoint whatif --replica R --set k=v --json` "
    "gives the same numbers."
)
if not replicas:
    st.info("No replicas are configured.")
    st.stop()
first = view.replicas[0] if view.replicas else replicas[0]
top = st.columns(2)
replica = top[0].selectbox("Replica", replicas, index=replicas.index(first))
window_label = top[1].selectbox("Window replayed", WINDOWS, index=WINDOWS.index(DEFAULT_WINDOW))
end = data.now()
end -= end % 300  # one cached replay per five minutes, not per second
start = end - parse_duration(window_label)

st.subheader("Calibration")
if "whatif_calibrated" in st.session_state:
    st.success(st.session_state.pop("whatif_calibrated"))
profile = profile_of(replica)
if profile is None:
    st.info(
        f"{replica} has no calibration yet: calibrate it below (operator), or run "
        f"`kneepoint calibrate --replica {replica}`. Without one the twin predicts nothing."
    )
else:
    calibration(profile)

if auth.current().can("operator"):
    runs = [a.run.label for a in data.runs()]
    with st.form("calibrate"):
        run = st.selectbox(
            "From the knee run",
            [None, *runs],
            format_func=lambda label: (
                "the latest that fits this replica" if label is None else label
            ),
        )
        if st.form_submit_button(
            "Calibrate",
            help="Fits the twin to the knee run and the window's history, and stores it. "
            "Needs operator.",
        ):
            try:
                with st.spinner("Fitting the twin…"):
                    profile = calibrate(replica, run, start, end)
                st.session_state["whatif_calibrated"] = (
                    f"Calibrated {replica} from {profile.get('run_label') or 'its history'}"
                    + ("." if profile["fit"]["trusted"] else ", not trusted.")
                )
                st.rerun()  # the calibration above shows the new fit
            except Refused as refused:
                st.error(str(refused))
            except WhatIfError as error:
                st.error(f"Cannot calibrate {replica}: {error}")

trust()
st.subheader("Change")
if profile is None or not (profile.get("fit") or {}).get("trusted"):
    st.info("No prediction without a trusted calibration.")
    st.stop()
key = st.selectbox("What to change", CHOICES, format_func=lambda k: LABELS[k])
try:
    change = parse_changes(picker(key, profile.get("shape") or {})).as_dict()
except WhatIfError as error:
    st.error(str(error))
    st.stop()
request = (replica, tuple(sorted(change.items())), start, end, profile)
if st.button("Replay the window", type="primary", help="Minutes of virtual time; cached."):
    st.session_state["whatif_request"] = request
if st.session_state.get("whatif_request") != request:
    st.caption(f"Replay {replica}'s last {window_label} with {flags(change) or 'no change'}.")
    st.stop()
try:
    result = predict(*request)
except WhatIfError as error:
    st.warning(f"No prediction: {error}")
    st.stop()

st.subheader(f"Before and after: {flags(change)}")
window = result.get("window") or {}
st.caption(f"Replayed {_when(window.get('start'))} → {_when(window.get('end'))}.")
verdict(result)
before_after(result)
