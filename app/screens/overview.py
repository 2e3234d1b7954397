"""Overview, the on-call landing page: is the fleet OK (kneepoint/fleet_status.py), what fires
or is pending, each SLO's budget and burn, the replicas in trouble; then a tile per replica
and the fleet's time series. Every line links to the view that explains it."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from urllib.parse import urlencode

import streamlit as st

from app import data, filters, fleet_data
from app import tables as t
from app.fleet import at_fleet_size, worst_first
from app.format import (
    GPU_BUSY_VS_LOAD,
    ago,
    clock,
    duration,
    engine_label,
    metric_unit,
    metric_value,
    show,
    utc,
    why,
)
from app.plots import chart
from app.registry import PAGES
from dashboards.overview import WORSE, fleet_replica_lines, replica_lines
from kneepoint import catalogue, fleet_status, runbooks
from kneepoint.derived import saturation
from kneepoint.fleet_status import SEVERITY_COLOURS, AlertState, ReplicaState, SloState
from kneepoint.records import ReplicaStatus

config, _ = data.store()
view = filters.current(data.replica_names())
TITLES = {spec.url_path: spec.title for spec in PAGES}
SHOWN_REASONS = 4  # on the status line, the worst first; the sections below list every one
st.title("Overview")


def link(target: Mapping[str, str]) -> str:
    """A relative link (works under any base path) to a view, in this page's time range."""
    query = {**target, "range": view.range_label}
    return f"./?{urlencode(query)}"


def replica_link(name: str) -> dict[str, str]:
    """This page on one replica: its tile and charts alone."""
    return {"page": "overview", "replica": name}


def page_link(target: Mapping[str, str]) -> str:
    return f"[{TITLES.get(target.get('page', ''), 'Open')} →]({link(target)})"


def _fmt(value: float | None, fmt: str) -> str:
    return "–" if value is None else fmt.format(value)


def status_line(status: fleet_status.FleetStatus) -> None:
    icon = {
        fleet_status.OK: "check_circle",
        fleet_status.DEGRADED: "warning",
        fleet_status.PAGING: "notifications_active",
        fleet_status.BURNING: "local_fire_department",
        fleet_status.DOWN: "error",
    }[status.level]
    st.markdown(f"#### :{status.colour}[:material/{icon}: {status.summary()}]")
    if status.reasons:  # one paragraph, each reason a link to the view that explains it
        shown = [f"[{r.text}]({link(r.view)})" for r in status.reasons[:SHOWN_REASONS]]
        more = len(status.reasons) - SHOWN_REASONS
        st.markdown(" · ".join(shown) + (f" · and {more} more below" if more > 0 else ""))


def alert_line(alert: AlertState, now: float) -> None:
    colour = SEVERITY_COLOURS.get(alert.severity, "orange")
    state = ":red[firing]" if alert.state == fleet_status.FIRING else ":gray[pending]"
    lasted = "–" if alert.since is None else duration(now - alert.since)
    book = runbooks.url(".", alert.rule)
    parts = [
        f":{colour}-badge[{alert.severity}] **{alert.rule}**",
        alert.where,
        f"{state} for {lasted}",
        page_link(alert.view),
    ]
    if book:
        parts.append(f"[runbook]({book})")
    hover = f"{alert.state} since {utc(alert.since)}"
    if alert.metric:
        unit = metric_unit(alert.metric)
        value = "no data" if alert.value is None else metric_value(alert.value, unit)
        hover += f" · value {value} (threshold {alert.op} {metric_value(alert.threshold, unit)})"
    st.markdown(" · ".join(parts), help=hover)


def slo_line(slo: SloState) -> None:
    target = fleet_status.slo_view(slo.name)
    if slo.problem is not None:
        st.markdown(
            f":orange-badge[cannot judge] **{slo.name}** · {page_link(target)}", help=slo.problem
        )
        return
    badges = []
    if slo.exhausted:
        badges.append(":red-badge[budget exhausted]")
    if slo.burning:
        badges.append(f":red-badge[burning {', '.join(slo.burning)}]")
    if not badges:
        badges.append(":green-badge[ok]" if slo.budget_left is not None else ":gray-badge[no data]")
    burn = "–" if slo.burn_rate is None else f"{slo.burn_rate:.2f}×"
    st.markdown(
        f"{' '.join(badges)} **{slo.name}** · budget left {show(slo.budget_left, '%')} · "
        f"burn {burn} over {slo.burn_window} · {page_link(target)}",
        help="Budget left: 1 − bad share ÷ allowed share over the SLO's window (negative: "
        "overspent). Burn rate: how fast it is spent; at 1× it lasts exactly the window.",
    )


def _at(iso: str | None) -> float | None:
    """An ISO time of `kneepoint status` as epoch seconds; None for none."""
    if not iso:
        return None
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _for(iso: str | None, now: float) -> tuple[str, str]:
    """How long since an ISO time ("12 min"), and the time itself for the hover."""
    at = _at(iso)
    if at is None:
        return "–", "–"
    return duration(now - at), utc(at)


def replica_line(replica: ReplicaState, now: float) -> None:
    trouble = replica.trouble
    target = fleet_status.replica_view(replica)
    hover = None
    if trouble == "stale":
        lasted, hover = _for(replica.last_scrape_at, now)
        detail = f"not scraped for {lasted}"
    elif trouble == "down":
        detail = replica.last_error or "its last scrape failed"
    else:
        lasted, hover = _for(replica.stalled_since, now)
        detail = f"no token counted for {lasted} while requests wait"
    help_ = None if hover is None else f"since {hover}"
    st.markdown(
        f":red-badge[{trouble}] **{replica.name}** · {detail} · {page_link(target)}", help=help_
    )


@st.fragment(run_every=max(5.0, config.scrape_interval))
def landing() -> None:
    now = data.now()
    report = data.status(300.0, now)
    alerts = fleet_status.ordered(data.alert_states())
    slos = data.slo_states(now)
    replicas = [ReplicaState.from_status(r) for r in report["replicas"]]
    status_line(fleet_status.assess(alerts, slos, replicas))

    firing = sum(1 for a in alerts if a.state == fleet_status.FIRING)
    st.subheader(f"Alerts: {firing} firing, {len(alerts) - firing} pending")
    if not alerts:
        st.markdown(":green[Nothing is firing or pending.]")
    for alert in alerts:
        alert_line(alert, now)

    if slos:
        st.subheader("SLOs")
        for slo in slos:
            slo_line(slo)

    troubled = [r for r in replicas if r.trouble is not None]
    never = [r.name for r in replicas if not r.known]
    st.subheader(f"Replicas: {len(troubled)} of {len(replicas)} down, stale or stalled")
    for replica in troubled:
        replica_line(replica, now)
    asleep = [r for r in replicas if r.asleep_label is not None]
    for replica in asleep:
        st.markdown(
            f":blue-badge[{replica.asleep_label}] **{replica.name}** · put to sleep on purpose "
            f"(vLLM's sleep mode): not stalled, no alert applies · "
            f"{page_link(replica_link(replica.name))}"
        )
    if not troubled and replicas:
        others = " other" if asleep else ""
        st.markdown(f":green[Every{others} scraped replica is up and serving.]")
    if never:
        st.caption(f"Never scraped yet: {', '.join(never)}")


landing()


@st.fragment(run_every=max(5.0, config.scrape_interval))
def tiles() -> None:
    now = data.now()
    report = data.status(300.0, now)
    shown = [r for r in report["replicas"] if not view.replicas or r["name"] in view.replicas]
    if not shown:
        st.info("No engine targets are configured: add some under `targets:` in kneepoint.yaml.")
        return
    st.subheader("Replicas, last 5 minutes")
    fleet = report["fleet"]
    saturated = fleet["saturated_replicas"]
    top = st.container(horizontal=True, gap="medium")
    top.metric(
        "Saturated replicas",
        "–" if saturated is None else f"{saturated} of {len(report['replicas'])}",
        help=catalogue.help_text("replica_saturated"),
        width="content",
    )
    top.metric(
        "Requests refused",
        refused_text(fleet["requests_refused_per_second"], fleet["requests_refused_share"]),
        help=why(
            fleet, "requests_refused_per_second", catalogue.help_text("requests_refused_share")
        ),
        width="content",
    )
    if at_fleet_size(len(report["replicas"])):
        # A fleet: one table, those in trouble first and paged; tiles for the sidebar's only.
        fleet_table(report["replicas"])
        shown = [r for r in report["replicas"] if r["name"] in view.replicas]
        if not shown:
            st.caption("Pick replicas in the sidebar for their own tiles and lines.")
    columns = st.columns(min(4, len(shown))) if shown else []
    for index, replica in enumerate(shown):
        with columns[index % len(columns)].container(border=True):
            state = {True: ":green[● up]", False: ":red[● down]", None: ":gray[● never scraped]"}
            sleeping = fleet_status.asleep_label(replica)
            shown_state = state[replica["up"]] if sleeping is None else f":blue[● {sleeping}]"
            stalled = " :red[● stalled]" if replica.get("stalled") else ""
            name = f"[**{replica['name']}**]({link(replica_link(replica['name']))})"
            st.markdown(f"{name} {shown_state}{stalled}")
            if replica.get("stale"):
                last = _at(replica["last_scrape_at"])
                st.caption(f"stale: not scraped since {clock(last, now)} ({ago(last, now)})")
            elif replica["up"] is False and replica["last_error"]:
                st.caption(replica["last_error"])
            # Side by side where they fit, wrapping (not one per line) on a phone.
            row = st.container(horizontal=True, gap="medium")
            row.metric(
                "KV occupancy",
                _fmt(replica["kv_cache_occupancy"], "{:.0%}"),
                help=why(replica, "kv_cache_occupancy", "Latest KV-cache usage."),
                width="content",
            )
            row.metric(
                "Running",
                _fmt(replica["requests_running"], "{:.0f}"),
                help=why(replica, "requests_running", "Requests in the running batch."),
                width="content",
            )
            row.metric(
                "Waiting",
                _fmt(replica["requests_waiting"], "{:.0f}"),
                help=why(replica, "requests_waiting", "Requests waiting to be scheduled."),
                width="content",
            )
            row.metric(
                "Gen tok/s",
                _fmt(replica["generation_tokens_per_second"], "{:.0f}"),
                help=why(replica, "generation_tokens_per_second", "Generated tokens per second."),
                width="content",
            )
            verdict = replica["saturation"]
            st.caption(
                f"Saturated: {saturation.labels(verdict) or '–'}",
                help="; ".join(r["evidence"] for r in verdict["reasons"])
                or verdict["unknown"]
                or catalogue.help_text("replica_saturated"),
            )
            st.caption(
                f"GPU busy {_fmt(replica.get('gpu_utilization'), '{:.0%}')} · "
                f"prompt {_fmt(replica['prompt_tokens_per_second'], '{:,.0f}')} tok/s · "
                f"{engine_label(replica)}",
                help="GPU busy (DCGM): the share of time the replica's GPUs ran a kernel, mean "
                "over its GPUs; not load vs knee.",
            )
            refused_line(replica)
            engine_notes(replica)
    st.caption(f"{GPU_BUSY_VS_LOAD} As of {clock(_at(report['generated_at']), now)}.")
    if report.get("gone"):  # discovery no longer finds them (or taken out of targets:)
        st.caption(
            "Gone, their history kept: "
            + ", ".join(
                f"{g['name']} since {clock(_at(g['gone_since']), now)}" for g in report["gone"]
            )
        )


def refused_text(per_second: float | None, share: float | None) -> str:
    """Refused requests per second and their share: "1.20/s (8.0%)", "–" when not known."""
    if per_second is None:
        return "–"
    return f"{per_second:,.2f}/s" + ("" if share is None else f" ({share:.1%})")


def refused_line(replica: ReplicaStatus) -> None:
    """The replica's load shedding over the window: in red while it refuses requests."""
    per_second = replica["requests_refused_per_second"]
    text = refused_text(per_second, replica["requests_refused_share"])
    hover = why(
        replica, "requests_refused_per_second", catalogue.help_text("requests_refused_share")
    )
    if per_second:
        st.markdown(f":red[● refusing requests: {text}]", help=hover)
    else:
        st.caption(f"Refused: {text}", help=hover)


def engine_notes(replica: ReplicaStatus) -> None:
    """The replica's LoRA adapters (running, waiting, the engine's max_lora) and its
    corrupted requests in the window, in red: shown only where the engine reports them."""
    adapters = replica.get("lora_adapters")
    if adapters is not None:
        running = ", ".join(adapters["running"]) or "none"
        waiting = ", ".join(adapters["waiting"]) or "none"
        most = adapters["max_lora"] if adapters["max_lora"] is not None else "?"
        st.caption(
            f"LoRA: running {running} · waiting {waiting} · max {most}",
            help=catalogue.help_text("lora_adapters"),
        )
    corrupted = replica.get("corrupted_requests")
    if corrupted:
        st.markdown(
            f":red[● {corrupted:,.0f} corrupted requests] in the last 5 minutes",
            help=catalogue.help_text("corrupted_requests"),
        )


def _state(replica: ReplicaStatus) -> str:
    """A replica's state as its tile says it, for a table's badge (app/format.tone):
    refusing while it sheds load, asleep (and why) when put to sleep on purpose."""
    if replica.get("up") is None:
        return "never scraped"
    if replica.get("up") is False:
        return "down"
    if replica.get("stale"):
        return "stale"
    if replica.get("stalled"):
        return "stalled"
    if replica.get("requests_refused_per_second"):
        return "refusing"
    return fleet_status.asleep_label(replica) or "up"


# Worst first: down, stale, stalled, refusing, then up or asleep; never-scraped ones last.
_STATE_ORDER = {"down": 4.0, "stale": 3.0, "stalled": 2.0, "refusing": 1.5, "up": 1.0}


def fleet_table(replicas: list[ReplicaStatus]) -> None:
    """Every replica in one paged table, those in trouble first, then the fullest KV cache."""
    rows = [
        {
            "replica": r["name"],
            "state": _state(r),
            "rank": _STATE_ORDER.get(_state(r), 1.0 if r.get("up") else None),
            "engine": engine_label(r),
            "saturated": saturation.labels(r["saturation"]),
            **{
                k: r.get(k)
                for k in (
                    "kv_cache_occupancy",
                    "requests_running",
                    "requests_waiting",
                    "generation_tokens_per_second",
                    "prompt_tokens_per_second",
                    "gpu_utilization",
                    "requests_refused_per_second",
                    "requests_refused_share",
                )
            },
        }
        for r in replicas
    ]
    t.people_table(
        worst_first(rows, [("rank", "higher"), ("kv_cache_occupancy", "higher")]),
        {
            "replica": t.text("Replica"),
            "state": t.badge("State"),
            "saturated": t.text("Saturated"),
            "kv_cache_occupancy": t.percent("KV occupancy", digits=0),
            "requests_waiting": t.number("Waiting", digits=0),
            "requests_running": t.number("Running", digits=0),
            "generation_tokens_per_second": t.number("Gen", "tok/s", digits=0),
            "prompt_tokens_per_second": t.number("Prompt", "tok/s", digits=0),
            "gpu_utilization": t.percent("GPU busy", digits=0),
            "requests_refused_per_second": t.number(
                "Refused", "req/s", digits=2, help=catalogue.help_text("requests_refused_share")
            ),
            "requests_refused_share": t.percent("Refused share", digits=1),
            "engine": t.text("Engine"),
        },
        identity="replica",
        matters=("state", "kv_cache_occupancy"),
    )


tiles()


@st.fragment(run_every=max(15.0, config.scrape_interval))
def fleet_charts() -> None:
    end = data.now()
    start = end - view.range_seconds
    st.subheader(f"Fleet, last {view.range_label}")
    columns = (
        "kv_cache_occupancy",
        "requests_waiting",
        "requests_running",
        "generation_tokens_per_second",
    )
    if at_fleet_size(len(data.status(300.0, end)["replicas"])):
        # The database computes a fleet's charts (app/fleet_data.py): the page run never
        # reads every replica's series.
        fleets = [
            fleet_data.replica_chart(c, start, end, WORSE.get(c, "higher"), view.replicas)
            for c in columns
        ]
        if fleets[0].size == 0:
            st.info("No samples in this time range yet.")
            return
        left, right = st.columns(2)
        for index, (column, fleet) in enumerate(zip(columns, fleets, strict=True)):
            figure = fleet_replica_lines(fleet, column, chosen=view.replicas)
            chart(figure, left if index % 2 == 0 else right)
        return
    series = data.series(start, end)
    # replica_lines draws a small fleet's chosen replicas only.
    if (series[series.replica.isin(view.replicas)] if view.replicas else series).empty:
        st.info("No samples in this time range yet.")
        return
    left, right = st.columns(2)
    for index, column in enumerate(columns):
        figure = replica_lines(series, column, chosen=view.replicas)
        chart(figure, left if index % 2 == 0 else right)


fleet_charts()
