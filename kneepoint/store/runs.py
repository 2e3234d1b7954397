"""Load-test runs in the store: saved by label and model, merged step by step."""

from __future__ import annotations

import json

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from kneepoint.knee.runs import Point, Run
from kneepoint.store.models import RunPointRow, RunRow


class RunNotFound(LookupError):
    pass


def save_run(session: Session, run: Run, now: float) -> None:
    """Store a run; a run with the same label and model gains or replaces its steps."""
    row = session.scalar(select(RunRow).where(RunRow.label == run.label, RunRow.model == run.model))
    if row is None:
        row = RunRow(
            label=run.label,
            model=run.model,
            source=run.source,
            created_at=run.created_at or now,
            notes=json.dumps(run.notes),
        )
        session.add(row)
        session.flush()
    else:
        row.notes = json.dumps({**json.loads(row.notes), **run.notes})
        session.execute(
            delete(RunPointRow).where(
                RunPointRow.run_id == row.id,
                RunPointRow.concurrency.in_([p.concurrency for p in run.points]),
            )
        )
    session.add_all(
        RunPointRow(run_id=row.id, concurrency=p.concurrency, data=json.dumps(p.as_dict()))
        for p in run.points
    )


def load_runs(session: Session, labels: list[str] | None = None) -> list[Run]:
    query = select(RunRow).order_by(RunRow.created_at, RunRow.id)
    if labels:
        query = query.where(RunRow.label.in_(labels))
    rows = session.scalars(query).all()
    points: dict[int, list[Point]] = {row.id: [] for row in rows}
    if rows:
        for point in session.scalars(
            select(RunPointRow).where(RunPointRow.run_id.in_(list(points)))
        ):
            points[point.run_id].append(Point.from_dict(json.loads(point.data)))
    return [
        Run(
            row.label,
            row.model,
            row.source,
            tuple(points[row.id]),
            row.created_at,
            json.loads(row.notes),
        )
        for row in rows
    ]


def load_run(session: Session, label: str) -> Run:
    """The run with this label; an unknown or ambiguous label names what there is."""
    found = load_runs(session, [label])
    if len(found) == 1:
        return found[0]
    if not found:
        known = ", ".join(r.label for r in load_runs(session)) or "none yet"
        raise RunNotFound(f"no run labelled {label!r} (runs: {known})")
    models = ", ".join(r.model for r in found)
    raise RunNotFound(f"the label {label!r} names runs of several models ({models}); relabel one")


def delete_run(session: Session, label: str) -> int:
    """Delete every run with this label; how many went."""
    ids = list(session.scalars(select(RunRow.id).where(RunRow.label == label)))
    if ids:
        session.execute(delete(RunPointRow).where(RunPointRow.run_id.in_(ids)))
        session.execute(delete(RunRow).where(RunRow.id.in_(ids)))
    return len(ids)
