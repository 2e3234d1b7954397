"""Overview: a tile per replica, then fleet time series."""

from __future__ import annotations

import streamlit as st

from app import data, filters
from app.format import engine_label, why
from dashboards.overview import replica_lines

config, _ = data.store()
view = filters.current(data.replica_names())
st.title("Overview")


def _fmt(value: float | None, fmt: str) -> str:
    return "–" if value is None else fmt.format(value)


@st.fragment(run_every=max(5.0, config.scrape_interval))
def tiles() -> None:
    report = data.status(300.0, data.now())
    shown = [r for r in report["replicas"] if not view.replicas or r["name"] in view.replicas]
    if not shown:
        st.info("No engine targets are configured: add some under `targets:` in kneepoint.yaml.")
        return
    columns = st.columns(min(4, len(shown)))
    for index, replica in enumerate(shown):
        with columns[index % len(columns)].container(border=True):
            state = {True: ":green[● up]", False: ":red[● down]", None: ":gray[● never scraped]"}
            st.markdown(f"**{replica['name']}** {state[replica['up']]}")
            if replica.get("stale"):
                st.caption(f"stale: not scraped since {replica['last_scrape_at']}")
            elif replica["up"] is False and replica["last_error"]:
                st.caption(replica["last_error"])
            left, right = st.columns(2)
            left.metric(
                "KV occupancy",
                _fmt(replica["kv_cache_occupancy"], "{:.0%}"),
                help=why(replica, "kv_cache_occupancy", "Latest KV-cache usage."),
            )
            right.metric(
                "Running",
                _fmt(replica["requests_running"], "{:.0f}"),
                help=why(replica, "requests_running", "Requests in the running batch."),
            )
            left.metric(
                "Waiting",
                _fmt(replica["requests_waiting"], "{:.0f}"),
                help=why(replica, "requests_waiting", "Requests waiting to be scheduled."),
            )
            right.metric(
                "Gen tok/s",
                _fmt(replica["generation_tokens_per_second"], "{:.0f}"),
                help=why(replica, "generation_tokens_per_second", "Generated tokens per second."),
            )
            st.caption(
                f"prompt {_fmt(replica['prompt_tokens_per_second'], '{:.0f}')} tok/s · "
                f"{engine_label(replica)}"
            )
    st.caption(f"Last 5 minutes, as of {report['generated_at']}")
    if report.get("gone"):  # discovery no longer finds them (or taken out of targets:)
        st.caption(
            "Gone, their history kept: "
            + ", ".join(f"{g['name']} since {g['gone_since']}" for g in report["gone"])
        )


tiles()


@st.fragment(run_every=max(15.0, config.scrape_interval))
def fleet_charts() -> None:
    end = data.now()
    series = data.series(end - view.range_seconds, end)
    if view.replicas:
        series = series[series.replica.isin(view.replicas)]
    st.subheader(f"Fleet, last {view.range_label}")
    if series.empty:
        st.info("No samples in this time range yet.")
        return
    left, right = st.columns(2)
    for index, column in enumerate(
        (
            "kv_cache_occupancy",
            "requests_waiting",
            "requests_running",
            "generation_tokens_per_second",
        )
    ):
        (left if index % 2 == 0 else right).plotly_chart(
            replica_lines(series, column), width="stretch"
        )


fleet_charts()
