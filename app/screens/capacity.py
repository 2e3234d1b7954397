"""Capacity: KV occupancy over time, slots left, waiting, preemption and recompute, planner."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from app import data, filters, fleet_data, insight
from app import tables as t
from app.fleet import at_fleet_size, worst_first
from app.format import compact, engine_label, quantile, show, why
from app.plots import chart
from dashboards.charts import lines
from dashboards.forecast import headroom
from kneepoint.derived.capacity import Plan, what_ifs
from kneepoint.derived.details import SATURATION
from kneepoint.derived.ratios import RECOMPUTE_FORMULA
from kneepoint.forecast import HISTORY_DAYS, MIN_DAYS

view_filter = filters.current(data.replica_names())
st.title("Capacity")
view = data.view(view_filter.range_seconds, data.now())
chosen = [
    r
    for r in view.status["replicas"]
    if not view_filter.replicas or r["name"] in view_filter.replicas
]
# A fleet: one table, worst first and paged; tiles only for the replicas chosen in the sidebar.
fleet = at_fleet_size(len(view.status["replicas"]))
if fleet:
    st.subheader(f"Replicas ({len(view.status['replicas']):,}), the most saturated first")
    t.people_table(
        worst_first(
            [
                {
                    "replica": r["name"],
                    "engine": engine_label(r),
                    "kv_cache_occupancy": r["kv_cache_occupancy"],
                    "kv_cache_capacity_tokens": r["kv_cache_capacity_tokens"],
                    "preemptions_per_second": r["preemptions_per_second"],
                    **{
                        k: view.rows[r["name"]][k]
                        for k in (
                            "sequence_slots_left",
                            "time_saturated",
                            "peak_waiting",
                            "mean_context_tokens",
                            "recompute_share_of_prefill",
                            "recompute_tokens_per_second",
                        )
                    },
                    "queue_p99": (view.rows[r["name"]]["queue_seconds"] or {}).get("p99"),
                }
                for r in view.status["replicas"]
            ],
            [("time_saturated", "higher"), ("kv_cache_occupancy", "higher")],
        ),
        {
            "replica": t.text("Replica"),
            "time_saturated": t.percent(
                "Time KV full",
                help=f"Share of the window with KV occupancy above {SATURATION:.0%}.",
            ),
            "kv_cache_occupancy": t.percent("KV occupancy", help="Latest KV-cache usage."),
            "sequence_slots_left": t.number("Slots left", "seqs", digits=1),
            "peak_waiting": t.number("Peak waiting", "seqs", digits=0),
            "queue_p99": t.seconds("Queue p99"),
            "kv_cache_capacity_tokens": t.number("Capacity", "tokens", compact=True),
            "mean_context_tokens": t.number("Live mean context", "tokens", compact=True),
            "preemptions_per_second": t.number("Preemptions", "/s", digits=3),
            "recompute_share_of_prefill": t.percent("Recompute share"),
            "recompute_tokens_per_second": t.number("Recompute", "tok/s", compact=True),
            "engine": t.text("Engine"),
        },
        identity="replica",
        matters=("time_saturated", "kv_cache_occupancy"),
    )
    st.caption("Pick replicas in the sidebar for their own tiles and lines on the charts.")
tiled = [r for r in chosen if r["name"] in view_filter.replicas] if fleet else chosen

for replica in tiled:
    extra = view.rows[replica["name"]]
    st.subheader(replica["name"])
    st.caption(engine_label(replica))
    a, b, c, d, e = st.columns(5)
    a.metric(
        "KV occupancy",
        show(replica["kv_cache_occupancy"], "%"),
        help=why(
            replica,
            "kv_cache_occupancy",
            "Latest KV-cache usage (max over engines): 1 − free blocks ÷ blocks.",
        ),
    )
    b.metric(
        "Sequence slots left",
        show(extra["sequence_slots_left"], "", 1),
        help="How many more agents fit: KV capacity ÷ live mean context − running.",
    )
    c.metric(
        "Time KV full",
        show(extra["time_saturated"], "%"),
        help=f"Share of the window with KV occupancy above {SATURATION:.0%}.",
    )
    d.metric(
        "Peak waiting",
        show(extra["peak_waiting"], "seqs", 0),
        help="Most sequences waiting in the window (capacity and deferred).",
    )
    e.metric(
        "Queue p99",
        quantile(extra["queue_seconds"], "p99"),
        help="99th percentile of time waiting before first scheduled, from the "
        "request_queue_time histogram over the window.",
    )
    f, g, h, i, j = st.columns(5)
    f.metric(
        "Capacity",
        compact(replica["kv_cache_capacity_tokens"], "tokens"),
        help=why(
            replica,
            "kv_cache_capacity_tokens",
            "KV capacity in tokens (vLLM: num_gpu_blocks × block_size from cache_config_info; "
            "docs/reference/engines.md for the others).",
        ),
    )
    g.metric(
        "Live mean context",
        compact(extra["mean_context_tokens"], "tokens"),
        help="Occupied KV tokens ÷ running sequences.",
    )
    h.metric(
        "Preemptions / s",
        show(replica["preemptions_per_second"], "/s", 3),
        help=why(
            replica,
            "preemptions_per_second",
            "Increase of the preemption (SGLang: retraction) counter over the window ÷ its length.",
        ),
    )
    i.metric(
        "Recompute share",
        show(extra["recompute_share_of_prefill"], "%"),
        help=why(
            replica,
            "recompute_share_of_prefill",
            "Recomputed prefill tokens ÷ all prefill work in the window.",
        ),
    )
    estimate = " (estimate)" if replica["preemption_recompute_is_estimate"] else ""
    j.metric(
        f"Recompute{estimate}",
        compact(extra["recompute_tokens_per_second"], "tok/s"),
        help=RECOMPUTE_FORMULA
        if replica["preemption_recompute_is_estimate"]
        else "Exact on v0: Δprompt_tokens − Δ requests' own prompt tokens.",
    )
if any(r["preemption_recompute_is_estimate"] for r in chosen):
    st.caption(f"Recompute on V1 engines is an estimate: {RECOMPUTE_FORMULA}")

mine = view_filter.replicas
end = data.now()
start = end - view_filter.range_seconds


def draw(
    column: str, title: str, percent: bool = False, unit: str = "", y_title: str | None = None
) -> go.Figure:
    """A small fleet's lines (only the chosen replicas', when any); a large fleet's chart as
    the database computes it (app/fleet_data.py): its distribution, the worst and the chosen
    replicas on top, never every replica's series in the page run."""
    if fleet:
        return fleet_data.replica_lines(
            column, start, end, title, percent, unit, y_title, chosen=mine
        )
    return lines(
        view.series, column, title, percent=percent, unit=unit, y_title=y_title, chosen=mine
    )


if fleet:
    empty = fleet_data.replica_chart("kv_cache_occupancy", start, end, chosen=mine).size == 0
else:
    empty = (view.series[view.series.replica.isin(mine)] if mine else view.series).empty
if empty:
    st.info("No samples in this time range yet.")
else:
    left, right = st.columns(2)
    chart(draw("kv_cache_occupancy", "KV-cache occupancy", percent=True), left)
    chart(draw("requests_waiting", "Waiting sequences", unit="seqs", y_title="waiting"), right)
    chart(draw("preemptions_per_second", "Preemptions", unit="1/s", y_title="preemptions"), left)
    chart(draw("requests_running", "Running sequences", unit="seqs", y_title="running"), right)

st.subheader("Headroom forecast")
st.caption(
    f"Each replica's daily peak of requests running + waiting (the knee's scale: a sweep's "
    f"concurrency counts queued requests too, and running alone stops at --max-num-seqs) over "
    f"the last {HISTORY_DAYS} whole UTC days, a least-squares trend, and the day it reaches "
    f"the knee at the current growth, with a range from the slope's standard error. No date "
    f"with under {MIN_DAYS} days, a trend that is flat, falling or not significant (one-sided "
    f"95 %), no knee, or a crossing over a year away."
)
outlooks = [
    o
    for o in insight.forecasts(data.now())
    if fleet or not view_filter.replicas or o.replica in view_filter.replicas
]
if not outlooks:
    st.info("No replica has stored history yet.")
else:
    t.people_table(
        [o.as_dict() for o in outlooks],
        {
            "replica": t.text("Replica"),
            "knee": t.number("Knee", "seqs", digits=0, help="The knee's concurrency."),
            "latest_peak": t.number(
                "Latest daily peak", "seqs", digits=0, help="Requests running + waiting."
            ),
            "days": t.number("Days", digits=0, help="Whole UTC days of history."),
            "slope_per_day": t.number("Growth", "seqs / day", digits=2),
            "slope_stderr": t.number("± std. error", "seqs / day", digits=2),
            "crossing": t.text("Reaches the knee", help="At the current growth (UTC date)."),
            "earliest": t.text("Earliest"),
            "latest": t.text("Latest"),
            "note": t.text("Why no date"),
        },
        identity="replica",
        matters=("crossing", "knee"),
    )
    # A fleet's table lists every replica; the charts are the chosen replicas' only.
    shown = [o for o in outlooks if o.peaks and (not fleet or o.replica in view_filter.replicas)]
    for column, o in zip(st.columns(2) * len(shown), shown, strict=False):
        chart(headroom(o), column)

st.subheader("Planner: how many agents fit")
with st.form("planner"):
    cols = st.columns(4)
    layers = cols[0].number_input("Layers", 1, 200, 32)
    kv_heads = cols[1].number_input("KV heads", 1, 128, 8)
    head_dim = cols[2].number_input("Head dim", 16, 512, 128)
    dtype = cols[3].selectbox("KV dtype", ["fp16", "bf16", "fp8"])
    cols = st.columns(4)
    context = cols[0].number_input("Context (tokens)", 256, 1_048_576, 131072)
    memory = cols[1].number_input("GPU memory (GiB)", 1.0, 512.0, 80.0)
    weights = cols[2].number_input("Weights (GiB)", 0.0, 2048.0, 16.0)
    share = cols[3].number_input("gpu_memory_utilization", 0.1, 0.99, 0.95)
    st.form_submit_button("Plan")
plan = Plan(
    int(layers),
    int(kv_heads),
    int(head_dim),
    dtype,
    int(context),
    gpu_memory_gib=memory,
    weights_gib=weights,
    gpu_memory_utilization=share,
)
t.people_table(
    [{"variant": name, **result} for name, result in what_ifs(plan).items()],
    {
        "variant": t.text("Plan"),
        "bytes_per_token": t.number("KV per token", "bytes", digits=0, compact=True),
        "sequence_gib": t.number("KV per sequence", "GiB", digits=2),
        "kv_tokens": t.number("KV capacity", "tokens", compact=True),
        "max_sequences": t.number("Sequences that fit", digits=2),
    },
    identity="variant",
    matters=("max_sequences",),
)
st.caption(
    "Bytes per token = 2 × layers × KV heads × head dim × dtype bytes; KV tokens = "
    "(GPU memory × utilization − weights) ÷ bytes per token; sequences = KV tokens ÷ "
    "context."
)
