"""GPUs: GPU busy (DCGM GPU_UTIL) against graphics activity, DRAM activity, power, temperature,
XID."""

from __future__ import annotations

import streamlit as st

from app import data, filters
from app.format import GPU_BUSY_VS_LOAD, show
from app.plots import chart
from dashboards.charts import lines

view_filter = filters.current(data.replica_names())
st.title("GPUs")
st.caption(GPU_BUSY_VS_LOAD + " Load vs knee is on the Cost page.")
view = data.view(view_filter.range_seconds, data.now())
gpus = view.status["gpus"]
if not gpus:
    st.info("No dcgm-exporter data in this time range.")
for gpu in gpus:
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
    if gpu["xid_error"] is not None:
        st.error(f"XID error {gpu['xid_error']:.0f} on {gpu['host']}/{gpu['index']}")
frame = view.gpus
if not frame.empty:
    left, right = st.columns(2)
    chart(
        lines(frame, "utilization", "GPU busy (GPU_UTIL)", "gpu", percent=True, y_title="busy"),
        left,
    )
    chart(
        lines(frame, "gr_engine_active", "Graphics engine active", color="gpu", percent=True),
        right,
    )
    chart(lines(frame, "dram_active", "DRAM active", color="gpu", percent=True), left)
    chart(lines(frame, "power_watts", "Power", color="gpu", unit="W", y_title="power"), right)
