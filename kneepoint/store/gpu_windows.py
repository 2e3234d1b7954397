"""A window's GPU numbers at fleet size, computed by the database: what status.build_status
reads instead of every GPU's rows of the range (queries.gpu_frame: 240 a GPU at 1 h, 48,000
rows at 200 replicas).

One SQL statement (the same text on SQLite and PostgreSQL) over exactly the rows gpu_frame
reads (queries._range_rows: the same summary-tier pieces) returns per GPU its last row, with
its identity, and on it:

- `energy_sum`: the energy counter's increase over the window as counters.increase counts
  it (a fall is a reset: the new value is the increase), summed in time order;
- `active_sum` and `active_known`, `utilization_sum` and `utilization_known`: the sum and
  count of the known values of each busy share, for their mean (status._gpus).

The sums are window sums over each GPU's rows ordered by time, which both databases add row
by row in that order: the same values in the same order as Python's loop over the rows,
so equal, not merely close (a GROUP BY's SUM adds in whatever order the database groups
rows).

counters.increase steps over a missing value from the last known one, which LAG cannot do
on both databases: a GPU whose energy is known at some of its rows but not all
(`energy_known` between 0 and `n_rows`) has every row returned, for the caller to count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from sqlalchemy import Select, and_, case, func, or_, select
from sqlalchemy.orm import Session

from kneepoint.counters import increase
from kneepoint.store import queries
from kneepoint.store.models import GPU_READINGS, GpuRow

# The readings status._gpu reads from a GPU's last row, and the energy counter.
COLUMNS = ("energy_mj", "xid_error", *GPU_READINGS)
IDENTITY = ("target_id", "host", "gpu_index", "model", "pod", "namespace", "uuid")
# Columns this statement adds to gpu_frame's; dropped before the last rows are returned.
HELPERS = (
    "next_ts",
    "n_rows",
    "energy_known",
    "energy_sum",
    "active_known",
    "active_sum",
    "utilization_known",
    "utilization_sum",
)


@dataclass
class Gpus:
    """Each GPU's last row in the range (gpu_frame's columns), by gpu_id; its energy
    increase in mJ and its mean busy share (status._gpus)."""

    last: pd.DataFrame
    energy_mj: dict[int, float | None] = field(default_factory=dict)
    busy: dict[int, float | None] = field(default_factory=dict)


def read(session: Session, start: float, end: float) -> Gpus:
    """Every GPU's last row, energy increase and mean busy share over [start, end]."""
    keys = list(session.scalars(select(GpuRow.id)))
    empty = pd.DataFrame(columns=["gpu_id", *IDENTITY, "ts", *COLUMNS])
    if not keys:
        return Gpus(empty)
    coarsest = queries.coarsest_for(end - start)
    reach = queries.reach(session, queries.GPU_ROLLUPS) if coarsest else {}
    pieces = queries.plan(start, end, reach, coarsest)
    rows = queries._range_rows(
        queries.GPU_SAMPLES, queries.GPU_ROLLUPS, "gpu_id", keys, start, end, COLUMNS, pieces
    )
    frame = queries.read_bulk(session, _statement(rows))
    if frame.empty:
        return Gpus(empty)
    last = frame[frame.next_ts.isna()]
    records = dict(zip(last.gpu_id.astype(int), last.to_dict("records"), strict=True))
    energy = {gpu_id: _energy(record) for gpu_id, record in records.items()}
    busy = {gpu_id: _busy(record) for gpu_id, record in records.items()}
    # The partly known: every row of theirs came back, counted as counters.increase does.
    partly = frame[(frame.energy_known > 0) & (frame.energy_known < frame.n_rows)]
    for gpu_id, mine in partly.groupby("gpu_id", sort=False):
        energy[int(gpu_id)] = increase(_column(mine.energy_mj))
    return Gpus(last.drop(columns=list(HELPERS)).reset_index(drop=True), energy, busy)


def _statement(rows: Any) -> Select[Any]:
    r = rows.c
    # Every window function over one window, the whole of a GPU's rows in time order: one
    # pass over the rows (LAG and LEAD ignore the frame), where a window each for the
    # running sums, the counts and the neighbours were three on PostgreSQL.
    whole = {"partition_by": r.gpu_id, "order_by": r.ts, "rows": (None, None)}
    previous = func.lag(r.energy_mj).over(**whole)
    marked = select(
        r.gpu_id,
        r.ts,
        *(r[c] for c in COLUMNS),
        func.lead(r.ts).over(**whole).label("next_ts"),
        func.count().over(**whole).label("n_rows"),
        func.count(r.energy_mj).over(**whole).label("energy_known"),
        # counters.increase: a fall is a reset, whose new value is the increase.
        case(
            (previous.is_(None), None),
            (r.energy_mj >= previous, r.energy_mj - previous),
            else_=r.energy_mj,
        ).label("energy_step"),
        func.count(r.gr_engine_active).over(**whole).label("active_known"),
        func.sum(r.gr_engine_active).over(**whole).label("active_sum"),
        func.count(r.utilization).over(**whole).label("utilization_known"),
        func.sum(r.utilization).over(**whole).label("utilization_sum"),
    ).subquery("marked")
    m = marked.c
    summed = select(
        marked,
        func.sum(m.energy_step)
        .over(partition_by=m.gpu_id, order_by=m.ts, rows=(None, None))
        .label("energy_sum"),
    ).subquery("summed")
    s = summed.c
    identity = GpuRow.__table__.c
    partly = and_(s.energy_known > 0, s.energy_known < s.n_rows)
    return (
        select(
            s.gpu_id,
            *(identity[c] for c in IDENTITY),
            s.ts,
            *(s[c] for c in COLUMNS),
            *(s[c] for c in HELPERS),
        )
        .join(GpuRow, GpuRow.id == s.gpu_id)
        .where(or_(s.next_ts.is_(None), partly))
        .order_by(s.gpu_id, s.ts)
    )


def _energy(record: dict[str, Any]) -> float | None:
    """counters.increase of a GPU whose energy is known at every row of it (or none)."""
    known = int(record["energy_known"])
    if known < 2 or known < int(record["n_rows"]):
        return None  # fewer than two values, or partly known (counted from its rows)
    # increase's total starts at 0.0 (a -0.0 step stays -0.0 without it).
    return 0.0 + float(record["energy_sum"])


def _busy(record: dict[str, Any]) -> float | None:
    """status._gpus' mean busy share: of gr_engine_active where it is ever known, else of
    utilization."""
    for share in ("active", "utilization"):
        known = int(record[f"{share}_known"])
        if known:
            return float(record[f"{share}_sum"]) / known
    return None


def _column(values: pd.Series) -> list[float | None]:
    return [None if v != v else v for v in values.astype(float).tolist()]
