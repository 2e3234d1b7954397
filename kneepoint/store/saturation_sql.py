"""The saturation verdict's load statistics at fleet size, computed by the database: one
statement over exactly the rows queries.replica_frame reads (queries._range_rows: the same
summary-tier pieces) gives, per target, the numbers kneepoint.derived.saturation.LoadStats
holds (its fields, by name), and the times of the rows at which TTFT's histogram is read
for each sub-window.

`LoadStats.of` computes the same numbers from a small fleet's rows in Python; the SQL mirrors
it step by step: a sample's weight is half the time to its neighbours (LAG and LEAD), the
waiting series is the capacity one where the target's rows know it (a window COUNT), the
least-squares sums are centred on the means of the samples that know waiting (window AVGs),
and the sub-windows' bounds are computed with the same operations in the same order
(start + k × ((end − start) / parts)), so a sample on a boundary falls in the same parts.
The grid rows are each sub-window boundary's last row at or before it, as
numpy.searchsorted finds them in kneepoint/status.py's small-fleet path."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Float, case, func, literal, select
from sqlalchemy.orm import Session

from kneepoint.samples import SATURATION
from kneepoint.store import queries

# The gauges the verdict reads (kneepoint/status.py LOAD_COLUMNS).
COLUMNS = ("kv_cache_usage", "requests_waiting", "requests_waiting_capacity", "requests_running")


def read(
    session: Session, start: float, end: float, keys: list[int], parts: int
) -> dict[int, tuple[dict[str, Any], list[float]]]:
    """Per target of `keys` with rows in [start, end]: its LoadStats fields and the times of
    its `parts` + 1 grid rows (none when it has fewer than two rows)."""
    if not keys:
        return {}
    coarsest = queries.coarsest_for(end - start)
    reach = queries.reach(session, queries.REPLICA_ROLLUPS) if coarsest else {}
    pieces = queries.plan(start, end, reach, coarsest)
    rows = queries._range_rows(
        queries.REPLICA_SAMPLES,
        queries.REPLICA_ROLLUPS,
        "target_id",
        keys,
        start,
        end,
        list(COLUMNS),
        pieces,
    )
    frame = queries.read_bulk(session, _statement(rows, parts))
    found: dict[int, tuple[dict[str, Any], list[float]]] = {}
    for record in frame.to_dict("records"):
        target = int(record["target_id"])
        stats = {
            "start": _number(record["t_start"]),
            "end": _number(record["t_end"]),
            "kv_known": int(record["kv_known"]),
            "kv_seconds": _number(record["kv_seconds"]) or 0.0,
            "kv_above_seconds": _number(record["kv_above_seconds"]) or 0.0,
            "kv_peak": _number(record["kv_peak"]),
            "waiting_known": int(record["waiting_known"]),
            "waiting_positive": int(record["waiting_positive"] or 0),
            "waiting_first": _number(record["waiting_first"]),
            "waiting_last": _number(record["waiting_last"]),
            "waiting_peak": _number(record["waiting_peak"]),
            "waiting_sxx": _number(record["waiting_sxx"]) or 0.0,
            "waiting_sxy": _number(record["waiting_sxy"]) or 0.0,
            "running_known": int(record["running_known"]),
            "part_load": tuple(_number(record[f"load_{k}"]) or 0.0 for k in range(parts)),
            "part_samples": tuple(int(record[f"samples_{k}"]) for k in range(parts)),
        }
        grid = [float(record[f"grid_{k}"]) for k in range(parts + 1)]
        found[target] = (stats, grid if int(record["n_rows"]) >= 2 else [])
    return found


def _statement(rows: Any, parts: int) -> Any:
    whole: dict[str, Any] = {
        "partition_by": rows.c.target_id,
        "order_by": rows.c.ts,
        "rows": (None, None),
    }
    marked = select(
        rows.c.target_id,
        rows.c.ts,
        *(rows.c[c] for c in COLUMNS),
        func.lag(rows.c.ts).over(**whole).label("prev_ts"),
        func.lead(rows.c.ts).over(**whole).label("next_ts"),
        func.min(rows.c.ts).over(**whole).label("t_start"),
        func.max(rows.c.ts).over(**whole).label("t_end"),
        func.count(rows.c.requests_waiting_capacity).over(**whole).label("capacity_known"),
    ).subquery("marked")
    m = marked.c
    # Waiting for capacity where the engine says why requests wait (vLLM 0.11+), else all.
    waiting = case((m.capacity_known > 0, m.requests_waiting_capacity), else_=m.requests_waiting)
    weight = (func.coalesce(m.next_ts, m.ts) - func.coalesce(m.prev_ts, m.ts)) / literal(2.0)
    again: dict[str, Any] = {"partition_by": m.target_id, "rows": (None, None)}
    chosen = select(
        marked,
        waiting.label("waiting"),
        weight.label("weight"),
        # The means the least-squares sums are centred on: over the rows that know waiting.
        func.avg(case((waiting.is_not(None), m.ts))).over(**again).label("t_mean"),
        func.avg(waiting).over(**again).label("w_mean"),
    ).subquery("chosen")
    c = chosen.c
    known = c.waiting.is_not(None)
    dt = c.ts - c.t_mean
    step = (c.t_end - c.t_start) / literal(float(parts), Float)

    def bound(k: int) -> ColumnElement[Any]:
        return c.t_start + literal(float(k), Float) * step

    inside = [
        c.requests_running.is_not(None) & (c.ts >= bound(k)) & (c.ts <= bound(k + 1))
        for k in range(parts)
    ]
    load = c.requests_running + func.coalesce(c.waiting, literal(0.0))
    return select(
        c.target_id,
        func.count().label("n_rows"),
        func.min(c.t_start).label("t_start"),
        func.max(c.t_end).label("t_end"),
        func.count(c.kv_cache_usage).label("kv_known"),
        func.sum(case((c.kv_cache_usage.is_not(None), c.weight))).label("kv_seconds"),
        func.sum(case((c.kv_cache_usage > SATURATION, c.weight))).label("kv_above_seconds"),
        func.max(c.kv_cache_usage).label("kv_peak"),
        func.count(c.waiting).label("waiting_known"),
        func.sum(case((c.waiting > 0, 1), else_=0)).label("waiting_positive"),
        func.min(case((known, c.ts))).label("waiting_first"),
        func.max(case((known, c.ts))).label("waiting_last"),
        func.max(c.waiting).label("waiting_peak"),
        func.sum(case((known, dt * dt))).label("waiting_sxx"),
        func.sum(case((known, dt * (c.waiting - c.w_mean)))).label("waiting_sxy"),
        func.count(c.requests_running).label("running_known"),
        *(func.sum(case((inside[k], load))).label(f"load_{k}") for k in range(parts)),
        *(func.count(case((inside[k], 1))).label(f"samples_{k}") for k in range(parts)),
        # Each boundary's last row at or before it; the last boundary is the last row.
        *(func.max(case((c.ts <= bound(k), c.ts))).label(f"grid_{k}") for k in range(parts)),
        func.max(c.ts).label(f"grid_{parts}"),
    ).group_by(c.target_id)


def _number(value: Any) -> float | None:
    return None if value is None or value != value else float(value)
