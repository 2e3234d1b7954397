"""Cost: true cost per served token beside model FLOPs utilization (MFU: the cost of idle
FLOPs), energy, idle GPU-hours."""

from __future__ import annotations

import streamlit as st

from app import data, filters
from app import tables as t
from app.fleet import at_fleet_size, worst_first
from app.format import GPU_BUSY_VS_LOAD, show, si
from kneepoint.catalogue import help_text

view_filter = filters.current(data.replica_names())
st.title("Cost")
view = data.view(view_filter.range_seconds, data.now())
config, _ = data.store()
fleet_numbers = view.status["fleet"]
a, b, m = st.columns(3)
a.metric(
    "Fleet $ / 1M generated tokens",
    show(fleet_numbers["cost_per_million_generated_tokens"], "$"),
    help="GPU-hours of the window (idle included) × price by DCGM modelName, plus "
    "extra_monthly spread over time, ÷ generated tokens served in it.",
)
b.metric(
    "Fleet $ / 1M tokens",
    show(fleet_numbers["cost_per_million_tokens"], "$"),
    help="The same cost ÷ all tokens served (prompt + generated).",
)
m.metric(
    "Fleet MFU",
    show(fleet_numbers["mfu"], "%"),
    help=help_text("mfu")
    + " The rest of the FLOPs paid for were idle."
    + (
        f" No figure: {fleet_numbers['mfu_unavailable']}."
        if fleet_numbers["mfu_unavailable"]
        else ""
    ),
)
# A fleet: one table, the dearest tokens first and paged; tiles only for the sidebar's replicas.
fleet = at_fleet_size(len(view.status["replicas"]))
if fleet:
    st.subheader(f"Replicas ({len(view.status['replicas']):,}), the dearest tokens first")
    t.people_table(
        worst_first(
            [
                {
                    "replica": r["name"],
                    "cost_per_million_generated_tokens": r["cost_per_million_generated_tokens"],
                    "mfu": r["mfu"],
                    **{
                        k: view.rows[r["name"]][k]
                        for k in (
                            "energy_kwh",
                            "joules_per_million_tokens",
                            "idle_gpu_hours",
                            "nominal_cost_per_million_generated_tokens",
                            "utilization",
                            "true_over_nominal",
                            "break_even_utilization",
                        )
                    },
                }
                for r in view.status["replicas"]
            ],
            [("cost_per_million_generated_tokens", "higher"), ("idle_gpu_hours", "higher")],
        ),
        {
            "replica": t.text("Replica"),
            "cost_per_million_generated_tokens": t.money(
                "$ / 1M generated", help="Its GPU cost over the window ÷ its generated tokens."
            ),
            "mfu": t.percent("MFU", help=help_text("mfu")),
            "idle_gpu_hours": t.number("Idle GPU-hours", "h", digits=2),
            "utilization": t.percent("Load vs knee"),
            "true_over_nominal": t.ratio("True ÷ nominal", digits=2),
            "nominal_cost_per_million_generated_tokens": t.money("Nominal $ / 1M generated"),
            "break_even_utilization": t.percent("Break-even load vs knee"),
            "energy_kwh": t.number("Energy", "kWh", digits=3),
            "joules_per_million_tokens": t.number("Energy / 1M tokens", "J", compact=True),
        },
        identity="replica",
        matters=("cost_per_million_generated_tokens",),
    )
    st.caption("Pick replicas in the sidebar for their own tiles.")
for replica in view.status["replicas"]:
    if view_filter.replicas and replica["name"] not in view_filter.replicas:
        continue
    if fleet and not view_filter.replicas:
        break  # the table above has them all
    extra = view.rows[replica["name"]]
    st.subheader(replica["name"])
    c, m, d, e, f = st.columns(5)
    c.metric(
        "$ / 1M generated",
        show(replica["cost_per_million_generated_tokens"], "$"),
        help="This replica's GPU cost over the window ÷ its generated tokens.",
    )
    m.metric(
        "MFU",
        show(replica["mfu"], "%"),
        help=help_text("mfu")
        + " The rest of the FLOPs paid for were idle."
        + (f" No figure: {replica['mfu_unavailable']}." if replica["mfu_unavailable"] else ""),
    )
    d.metric(
        "Energy",
        show(extra["energy_kwh"], "kWh", 3),
        help="Increase of DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ) of its GPUs.",
    )
    e.metric(
        "Energy / 1M tokens",
        si(extra["joules_per_million_tokens"], "J"),
        help="Joules of its GPUs ÷ tokens served, per million.",
    )
    f.metric(
        "Idle GPU-hours",
        show(extra["idle_gpu_hours"], "h", 2),
        help="(1 − GPU busy: DCGM graphics-engine activity) × hours of the window × GPUs.",
    )
    g, h, i, j = st.columns(4)
    g.metric(
        "Nominal $ / 1M generated",
        show(extra["nominal_cost_per_million_generated_tokens"], "$"),
        help="Its GPU $/hour ÷ (knee throughput × 3600), per million: the price of a token if "
        f"it always ran at its knee (run: {extra['knee_run'] or 'none with a knee yet'}).",
    )
    h.metric(
        "Load vs knee",
        show(extra["utilization"], "%"),
        help="Generated tokens/s served in the window ÷ the knee's output tokens/s. Not GPU "
        "busy (DCGM, the GPUs page).",
    )
    i.metric(
        "True ÷ nominal",
        show(extra["true_over_nominal"], "×", 2),
        help="How much idle and light load multiply the price of a token.",
    )
    j.metric(
        "Break-even load vs knee",
        show(extra["break_even_utilization"], "%"),
        help="Nominal cost ÷ the hosted API's price for the same mix of prompt and generated "
        "tokens: below this load vs knee the API is cheaper (above 100 %: it always is).",
    )
api = config.pricing.api_reference
st.caption(
    f"Hosted-API reference ({api.name}): ${api.input_per_mtok}/1M input, "
    f"${api.output_per_mtok}/1M output. Nominal cost, load vs knee and break-even use the knee "
    "of the newest sweep of the replica (or of its model) on the Knee points page. "
    + GPU_BUSY_VS_LOAD
)
