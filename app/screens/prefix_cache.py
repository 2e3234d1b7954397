"""Prefix cache: hit rate per replica and fleet, divergence, drops and prefill storms."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import data, filters, fleet_data
from app import tables as t
from app.fleet import at_fleet_size, worst_first
from app.format import compact, show, why
from app.plots import chart
from dashboards.charts import events, lines
from kneepoint import catalogue
from kneepoint.derived.details import divergence
from kneepoint.views import _bucket as coarse_rule

view_filter = filters.current(data.replica_names())
st.title("Prefix cache")
view = data.view(view_filter.range_seconds, data.now())
fleet_numbers = view.status["fleet"]
rates = {r["name"]: r["prefix_cache_hit_rate"] for r in view.status["replicas"]}
a, b, c, d = st.columns(4)
a.metric(
    "Fleet hit rate",
    show(fleet_numbers["prefix_cache_hit_rate"], "%"),
    help="Σ prefix-cache hit tokens ÷ Σ queried tokens over the window (token-weighted).",
)
b.metric(
    "Divergence",
    show(divergence(rates), "%"),
    help="Best minus worst replica hit rate: a wide spread means routing ignores caches.",
)
c.metric(
    "Hit-rate drops",
    str(len(view.events["hit_rate_drops"])),
    help="Intervals where the fleet hit rate fell 30 points below its 1-hour average.",
)
d.metric(
    "Prefill storms",
    str(len(view.events["prefill_storms"])),
    help="Bursts of computed prompt tokens above 3× their 1-hour median (deploys).",
)
# A fleet: one table, the lowest hit rate first and paged; tiles for the sidebar's replicas.
fleet = at_fleet_size(len(view.status["replicas"]))
if fleet:
    st.subheader(f"Replicas ({len(view.status['replicas']):,}), the lowest hit rate first")
    t.people_table(
        worst_first(
            [
                {
                    "replica": r["name"],
                    "prefix_cache_hit_rate": r["prefix_cache_hit_rate"],
                    "prefix_cross_check": view.rows[r["name"]]["prefix_cross_check"],
                }
                for r in view.status["replicas"]
            ],
            [("prefix_cache_hit_rate", "lower")],
        ),
        {
            "replica": t.text("Replica"),
            "prefix_cache_hit_rate": t.percent(
                "Hit rate", help=catalogue.help_text("prefix_cache_hit_rate")
            ),
            "prefix_cross_check": t.percent(
                "Cross-check", help="Δprompt_tokens_by_source{local_cache_hit} ÷ Δprompt_tokens."
            ),
        },
        identity="replica",
        matters=("prefix_cache_hit_rate",),
    )
for replica in view.status["replicas"]:
    if view_filter.replicas and replica["name"] not in view_filter.replicas:
        continue
    if fleet and not view_filter.replicas:
        break  # the table above has them all
    extra = view.rows[replica["name"]]
    left, right = st.columns(2)
    left.metric(
        f"{replica['name']}: hit rate",
        show(replica["prefix_cache_hit_rate"], "%"),
        help=why(
            replica,
            "prefix_cache_hit_rate",
            "Δprefix_cache_hits ÷ Δprefix_cache_queries (tokens) over the window; where the "
            "engine has no such counters, its own hit-rate gauge (docs/reference/engines.md).",
        ),
    )
    right.metric(
        f"{replica['name']}: cross-check",
        show(extra["prefix_cross_check"], "%"),
        help="Δprompt_tokens_by_source{local_cache_hit} ÷ Δprompt_tokens.",
    )
# Where the cached prompt tokens came from, per replica and for the fleet, beside what the
# connector, the offload tier and the multimodal cache did (kneepoint/derived/tiers.py).
TIER_LABELS = {
    "device": "GPU",
    "host": "CPU offload",
    "p2p": "P2P",
    "disk": "Disk",
    "external": "External (connector)",
}
tier_rows = []
blocks: list[Mapping[str, Any]] = [*view.status["replicas"], fleet_numbers]
for block in blocks:
    if view_filter.replicas and block["name"] not in (*view_filter.replicas, "fleet"):
        continue
    shares = block["prefix_cache_tier_shares"] or {}
    page_row: Mapping[str, Any] = view.rows.get(block["name"]) or {}
    tier_rows.append(
        {
            "replica": block["name"],
            **{f"tier_{tier}": shares.get(tier) for tier in TIER_LABELS},
            "external_prefix_cache_hit_rate": block["external_prefix_cache_hit_rate"],
            "prefill_computed_tokens_per_request": page_row.get(
                "prefill_computed_tokens_per_request"
            ),
            "mean_prompt_tokens": page_row.get("mean_prompt_tokens"),
            "kv_offload_usage": block.get("kv_offload_usage"),  # a replica's only
            "kv_offload_load_bytes_per_second": page_row.get("kv_offload_load_bytes_per_second"),
            "kv_offload_store_bytes_per_second": page_row.get("kv_offload_store_bytes_per_second"),
            "mm_cache_hit_rate": page_row.get("mm_cache_hit_rate"),
        }
    )
st.subheader("Hit rate by tier")
st.caption(
    "The share of prompt tokens each tier served (Δcached tokens of the tier ÷ Δprompt "
    "tokens); the rest was computed. Empty where the engine does not say the tier "
    "(docs/reference/engines.md)."
)
t.people_table(
    tier_rows,
    {
        "replica": t.text("Replica"),
        **{
            f"tier_{tier}": t.percent(label, help=catalogue.help_text("prefix_cache_tier_shares"))
            for tier, label in TIER_LABELS.items()
        },
        "external_prefix_cache_hit_rate": t.percent(
            "Connector hit rate", help=catalogue.help_text("external_prefix_cache_hit_rate")
        ),
        "prefill_computed_tokens_per_request": t.number(
            "Computed / request",
            "tokens",
            help=catalogue.help_text("prefill_computed_tokens_per_request"),
            digits=0,
        ),
        "mean_prompt_tokens": t.number(
            "Prompt / request", "tokens", help=catalogue.help_text("mean_prompt_tokens"), digits=0
        ),
        "kv_offload_usage": t.percent(
            "Offload tier used", help=catalogue.help_text("kv_offload_usage")
        ),
        "kv_offload_load_bytes_per_second": t.number(
            "Offload loads",
            "B/s",
            help=catalogue.help_text("kv_offload_load_bytes_per_second"),
            compact=True,
        ),
        "kv_offload_store_bytes_per_second": t.number(
            "Offload stores",
            "B/s",
            help=catalogue.help_text("kv_offload_store_bytes_per_second"),
            compact=True,
        ),
        "mm_cache_hit_rate": t.percent(
            "Multimodal hit rate", help=catalogue.help_text("mm_cache_hit_rate")
        ),
    },
    identity="replica",
    matters=("tier_device",),
)
end = data.now()
start = end - view_filter.range_seconds
# The page's intervals (views.build_view's `coarse`): hit rates of summed increases.
every = int(pd.Timedelta(coarse_rule(view_filter.range_seconds)).total_seconds())


def draw(column: str, title: str, **style: Any) -> go.Figure:
    """A small fleet's lines, every replica's as always; a large fleet's chart as the
    database computes it (app/fleet_data.py), with the sidebar's replicas on top."""
    if fleet:
        return fleet_data.replica_lines(
            column, start, end, title, chosen=view_filter.replicas, resample=every, **style
        )
    return lines(view.coarse, column, title, **style)


if fleet:
    empty = not fleet_data.replica_chart(
        "hit_rate", start, end, "lower", view_filter.replicas, every
    ).size
else:
    empty = view.coarse.empty
if empty:
    st.info("No samples in this time range yet.")
else:
    figure = draw("hit_rate", "Prefix-cache hit rate", percent=True, worse="lower")
    chart(events(figure, [e.start for e in view.events["hit_rate_drops"]], "drop"))
    storms = draw(
        "computed_prompt_tokens_per_second",
        "Computed prompt tokens / s",
        unit="tok/s",
        y_title="computed prompt tokens",
    )
    chart(events(storms, [e.start for e in view.events["prefill_storms"]], "storm"))
found = [
    {
        "kind": "Hit-rate drop",
        "at": e.start,
        "value": show(e.value, "%"),
        "was": show(e.baseline, "%"),
    }
    for e in view.events["hit_rate_drops"]
] + [
    {
        "kind": "Prefill storm",
        "at": e.start,
        "value": compact(e.value, "tok/s"),
        "was": compact(e.baseline, "tok/s"),
    }
    for e in view.events["prefill_storms"]
]
if found:
    t.people_table(
        sorted(found, key=lambda e: e["at"], reverse=True),
        {
            "kind": t.text("Event"),
            "at": t.time("From"),
            "value": t.text("Value", help="Hit rate, or computed prompt tokens per second."),
            "was": t.text("Baseline", help="Its 1-hour trailing mean (storms: median)."),
        },
        identity="kind",
        matters=("at", "value"),
    )
