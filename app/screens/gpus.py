"""GPUs: GPU busy (DCGM GPU_UTIL) against graphics activity, SM and tensor activity beside the
model FLOPs and memory-bandwidth utilization (MFU, MBU) of the replica on each GPU, DRAM
activity, power, temperature, XID."""

from __future__ import annotations

from typing import Literal

import plotly.graph_objects as go
import streamlit as st

from app import data, filters, fleet_data
from app import tables as t
from app.fleet import at_fleet_size, worst_first
from app.format import GPU_BUSY_VS_LOAD, show
from app.plots import chart
from dashboards.charts import lines
from kneepoint.catalogue import help_text
from kneepoint.records import GpuStatus

view_filter = filters.current(data.replica_names())
st.title("GPUs")
st.caption(GPU_BUSY_VS_LOAD + " Load vs knee is on the Cost page.")
view = data.view(view_filter.range_seconds, data.now())
gpus = view.status["gpus"]
# The replica's MFU and MBU (kneepoint.derived.flops): the same for each GPU of it.
used = {r["name"]: r for r in view.status["replicas"]}


def replica_figure(gpu: GpuStatus, key: Literal["mfu", "mbu"]) -> float | None:
    replica = used.get(gpu["replica"] or "")
    return None if replica is None else replica[key]


def why_not(gpu: GpuStatus, key: Literal["mfu", "mbu"]) -> str:
    replica = used.get(gpu["replica"] or "")
    if replica is None:
        return ""
    reason = replica["mfu_unavailable"] if key == "mfu" else replica["mbu_unavailable"]
    return f" No figure: {reason}." if reason else ""


if not gpus:
    st.info("No dcgm-exporter data in this time range.")
# A fleet of GPUs: one table, XID errors then the hottest first, paged; tiles and own lines
# only for the GPUs of the replicas chosen in the sidebar.
fleet = at_fleet_size(len(gpus))
mine = tuple(
    f"{g['host']}/{g['index']}" for g in gpus if fleet and g["replica"] in view_filter.replicas
)
if fleet:
    st.subheader(f"GPUs ({len(gpus):,}), XID errors and the hottest first")
    t.people_table(
        worst_first(
            [
                {
                    **g,
                    "gpu": f"{g['host']}/{g['index']}",
                    "has_xid": 0.0 if g["xid_error"] is None else 1.0,
                    "mfu": replica_figure(g, "mfu"),
                    "mbu": replica_figure(g, "mbu"),
                }
                for g in gpus
            ],
            [("has_xid", "higher"), ("temperature_c", "higher"), ("utilization", "higher")],
            name="gpu",
        ),
        {
            "gpu": t.text("GPU", help="host/index"),
            "replica": t.text("Replica"),
            "xid_error": t.number("XID error", digits=0),
            "temperature_c": t.number("Temperature", "°C", digits=0),
            "utilization": t.percent("GPU busy", help="DCGM_FI_DEV_GPU_UTIL."),
            "gr_engine_active": t.percent("Graphics active"),
            "sm_active": t.percent("SM active", help="DCGM_FI_PROF_SM_ACTIVE."),
            "tensor_active": t.percent("Tensor active", help="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE."),
            "mfu": t.percent("MFU", help=help_text("mfu")),
            "mbu": t.percent("MBU", help=help_text("mbu")),
            "dram_active": t.percent("DRAM active"),
            "power_watts": t.number("Power", "W", digits=0),
            "model": t.text("Model"),
        },
        identity="gpu",
        matters=("xid_error", "temperature_c"),
    )
    failing = [g for g in gpus if g["xid_error"] is not None]
    if failing:
        st.error(
            f"XID errors on {len(failing):,} GPUs: "
            + ", ".join(f"{g['host']}/{g['index']} ({g['xid_error']:.0f})" for g in failing[:5])
            + (" and more (the table lists them first)" if len(failing) > 5 else "")
        )
for gpu in [g for g in gpus if f"{g['host']}/{g['index']}" in mine] if fleet else gpus:
    st.subheader(f"{gpu['host']}/{gpu['index']} {gpu['model'] or ''} → {gpu['replica'] or '–'}")
    a, b, c, d, e = st.columns(5)
    a.metric(
        "GPU busy",
        show(gpu["utilization"], "%"),
        help="DCGM_FI_DEV_GPU_UTIL: share of time a kernel ran. Says busy, not how much work "
        "was done: not load vs knee.",
    )
    b.metric(
        "Graphics active",
        show(gpu["gr_engine_active"], "%"),
        help="DCGM_FI_PROF_GR_ENGINE_ACTIVE: share of time the engine did work.",
    )
    c.metric(
        "DRAM active",
        show(gpu["dram_active"], "%"),
        help="DCGM_FI_PROF_DRAM_ACTIVE: memory bandwidth in use (decode saturation).",
    )
    d.metric("Power", show(gpu["power_watts"], "W", 0), help="DCGM_FI_DEV_POWER_USAGE.")
    e.metric("Temperature", show(gpu["temperature_c"], "°C", 0), help="DCGM_FI_DEV_GPU_TEMP.")
    f, g, h, i = st.columns(4)
    f.metric(
        "MFU",
        show(replica_figure(gpu, "mfu"), "%"),
        help=help_text("mfu") + why_not(gpu, "mfu"),
    )
    g.metric(
        "SM active",
        show(gpu["sm_active"], "%"),
        help="DCGM_FI_PROF_SM_ACTIVE: share of time the SMs had work.",
    )
    h.metric(
        "Tensor active",
        show(gpu["tensor_active"], "%"),
        help="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: share of cycles the tensor pipes were busy.",
    )
    i.metric(
        "MBU",
        show(replica_figure(gpu, "mbu"), "%"),
        help=help_text("mbu") + why_not(gpu, "mbu"),
    )
    if gpu["xid_error"] is not None:
        st.error(f"XID error {gpu['xid_error']:.0f} on {gpu['host']}/{gpu['index']}")
end = data.now()
start = end - view_filter.range_seconds


def draw(
    column: str, title: str, percent: bool = False, unit: str = "", y_title: str | None = None
) -> go.Figure:
    """A few GPUs' lines; a fleet's chart as the database computes it (app/fleet_data.py),
    never every GPU's readings in the page run."""
    if fleet or view.charts_from_database:
        return fleet_data.gpu_lines(column, start, end, title, percent, unit, y_title, chosen=mine)
    return lines(view.gpus, column, title, "gpu", percent, unit, y_title, chosen=mine)


if fleet or (gpus and view.charts_from_database) or not view.gpus.empty:
    left, right = st.columns(2)
    chart(draw("utilization", "GPU busy (GPU_UTIL)", percent=True, y_title="busy"), left)
    chart(draw("gr_engine_active", "Graphics engine active", percent=True), right)
    chart(draw("dram_active", "DRAM active", percent=True), left)
    chart(draw("power_watts", "Power", unit="W", y_title="power"), right)
