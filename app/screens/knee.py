"""Knee points: sweeps and imported runs overlaid, knee and recommended markers, the SLO line,
the production curve and peak of a replica, a compare view, and run import and delete."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import actions, auth, data, filters
from app import tables as t
from app.format import EMPTY
from app.plots import chart
from app.tables import people_table
from dashboards.knee import knee_chart
from kneepoint.auth import Refused
from kneepoint.knee import tables
from kneepoint.knee.compare import compare

replicas = data.replica_names()
view = filters.current(replicas)
st.title("Knee points")
st.caption(
    "Where more concurrency stops buying throughput but still costs latency: run just below "
    "the knee and cap admission there. Knee: Kneedle on output tokens/s against concurrency. "
    "Recommended: the highest measured step that meets every latency SLO and is not past it."
)
assessments = data.runs()
by_label = {a.run.label: a for a in assessments}

if not assessments:
    st.info("No runs yet: `kneepoint sweep --url … --model …`, or import a result file below.")
else:
    labels = list(by_label)
    chosen = st.multiselect("Runs", labels, default=labels[-3:])
    latency = st.radio(
        "Latency",
        ["ttft_p99_seconds", "itl_p99_seconds"],
        horizontal=True,
        format_func=lambda c: "TTFT p99" if c.startswith("ttft") else "ITL p99",
    )
    scale = st.radio(
        "Throughput axis",
        ["share", "shared"],
        horizontal=True,
        format_func=lambda s: "% of each run's peak" if s == "share" else "tok/s, shared",
        help="% of each run's peak: every run's knee shows, a small replica's too. "
        "tok/s, shared: runs compared in absolute throughput (and the production curve).",
    )
    production_replica = st.selectbox(
        "Production curve of",
        ["(none)", *replicas],
        index=1 + replicas.index(view.replicas[0]) if view.replicas else 0,
        help="Running requests binned by powers of two against generation tokens/s and p99 "
        f"TTFT from the stored histograms, over the last {view.range_label}.",
    )
    curve = None
    if production_replica != "(none)":
        end = data.now()
        curve = data.production_curve(production_replica, end - view.range_seconds, end)
    slo = next((s for s in data.store()[0].slos if s.metric and latency.startswith(s.metric)), None)
    shown = [by_label[label] for label in chosen]
    if shown:
        chart(
            knee_chart(
                tables.curves(shown, latency),
                tables.markers(shown),
                slo.threshold if slo else None,
                tables.production(curve, latency),
                curve.peak_concurrency if curve else None,
                latency,
                normalized=scale == "share",
            )
        )
        if scale == "share" and curve is not None:
            st.caption("The production curve is on the shared tok/s axis; here, its peak's line.")
        summary = tables.summary(shown, curve)
        # The run pinned, then its knee and what to run at (tables.phone_layout); people's
        # headers as labels, the frame's own names kept.
        order, config = t.phone_layout(
            summary,
            "run",
            ["knee", "recommended"],
            {
                "run": st.column_config.TextColumn("Run"),
                "source": st.column_config.TextColumn("Source"),
                "model": st.column_config.TextColumn("Model"),
                "steps": st.column_config.NumberColumn("Steps"),
                "knee": st.column_config.NumberColumn(
                    "Knee", help="Where the curve bends (Kneedle)."
                ),
                "recommended": st.column_config.NumberColumn(
                    "Recommended",
                    help="Highest step meeting every latency SLO and not past the knee.",
                ),
                "limiting SLO": st.column_config.TextColumn("Limiting SLO"),
                "production peak": st.column_config.NumberColumn(
                    "Production peak",
                    help="Most running requests the replica had in the time range.",
                ),
                "headroom to knee": st.column_config.NumberColumn(
                    "Headroom",
                    help="Knee − production peak: concurrency left (negative: past the knee).",
                ),
            },
        )
        st.dataframe(
            summary,
            hide_index=True,
            width="stretch",
            placeholder=EMPTY,  # not "None" where a run has no production peak
            column_order=order,
            column_config=config,
        )

    st.subheader("Compare two runs")
    st.caption(
        "Change one flag at a time: per step the throughput ratio, the p99 change, a verdict."
    )
    left, right = st.columns(2)
    base = left.selectbox("Baseline", labels, index=0)
    candidate = right.selectbox("Candidate", labels, index=len(labels) - 1)
    result = compare(by_label[base].run, by_label[candidate].run)
    if not result.steps:
        st.warning(f"{base} and {candidate} share no concurrency step.")
    else:
        st.metric(
            "Verdict",
            result.verdict,
            help="better / worse / same, from the steps' verdicts "
            "(5 % throughput, 10 % latency tolerance).",
        )
        people_table(
            pd.DataFrame([s.as_dict() for s in result.steps]),
            {
                "concurrency": t.number("Concurrency", "requests", digits=0, short="Concurrency"),
                "baseline_output_tokens_per_second": t.number("Baseline", "tok/s", digits=0),
                "candidate_output_tokens_per_second": t.number("Candidate", "tok/s", digits=0),
                "ratio": t.ratio("Throughput", "baseline"),
                "ttft_change": t.percent("TTFT change", help="p99 (mean where no p99)."),
                "itl_change": t.percent("ITL change", help="p99 (mean where no p99)."),
                "verdict": t.text("Verdict"),
            },
            identity="concurrency",
            matters=("ratio", "verdict"),
        )

    with st.expander("Delete a run"):
        doomed = st.selectbox("Run to delete", labels, key="delete-run")
        if st.button("Delete", type="secondary", help="Needs operator."):
            try:
                actions.delete_run(doomed)
            except Refused as denied:
                st.error(str(denied))
            else:
                st.rerun()

with st.expander("Import result files", expanded=not assessments):
    st.caption(
        "vllm bench serve (--save-result), GuideLLM benchmarks.json, AIPerf / GenAI-Perf "
        "profile exports, LLMPerf summaries."
    )
    if not auth.current().can("operator"):  # the uploader stores files before any action
        st.caption("Importing runs needs the operator role.")
    else:
        uploads = st.file_uploader(
            "Result files",
            accept_multiple_files=True,
            type=["json", "jsonl"],
            help=f"At most {data.limits().upload_mb:g} MB each (limits.upload_mb). Needs operator.",
        )
        if uploads and st.button("Import"):
            try:
                stored, refused = actions.import_results([(u.name, u.getvalue()) for u in uploads])
            except Refused as error:
                stored, refused = [], [str(error)]
            for run in stored:
                st.success(f"Imported {run.label} ({run.source}): {len(run.points)} steps.")
            for reason in refused:
                st.error(reason)
