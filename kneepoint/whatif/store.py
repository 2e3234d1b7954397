"""Calibrated profiles in the store (table calibrations, migration 0016)."""

from __future__ import annotations

import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from kneepoint.store.models import CalibrationRow
from kneepoint.whatif.profile import (
    EngineShape,
    FitQuality,
    Profile,
    WhatIfError,
    cost_dict,
    cost_from_dict,
)


def save_profile(session: Session, profile: Profile) -> int:
    """Store a calibration (every one is kept: the newest is the replica's); its id."""
    row = CalibrationRow(
        replica=profile.replica,
        run_label=profile.run_label,
        fitted_at=profile.fitted_at or 0.0,
        shape=json.dumps(profile.shape.as_dict(), sort_keys=True),
        coefficients=json.dumps(cost_dict(profile.cost), sort_keys=True),
        errors=json.dumps(profile.fit.as_dict(), sort_keys=True),
        trusted=profile.fit.trusted,
        notes=json.dumps(
            {
                **profile.notes,
                "input_tokens": profile.input_tokens,
                "output_tokens": profile.output_tokens,
            },
            sort_keys=True,
        ),
    )
    session.add(row)
    session.flush()
    return row.id


def latest_profile(session: Session, replica: str, at: float | None = None) -> Profile:
    """The replica's newest calibration (fitted at or before `at`, if given); WhatIfError
    when it has none."""
    query = select(CalibrationRow).where(CalibrationRow.replica == replica)
    if at is not None:
        query = query.where(CalibrationRow.fitted_at <= at)
    row = session.scalars(
        query.order_by(CalibrationRow.fitted_at.desc(), CalibrationRow.id.desc()).limit(1)
    ).first()
    if row is None:
        raise WhatIfError(
            f"{replica} has no calibration: run `kneepoint calibrate --replica {replica}` first"
        )
    return profile_of(row)


def profile_of(row: CalibrationRow) -> Profile:
    notes = json.loads(row.notes)
    return Profile(
        replica=row.replica,
        shape=EngineShape.from_dict(json.loads(row.shape)),
        cost=cost_from_dict(json.loads(row.coefficients)),
        fit=FitQuality.from_dict(json.loads(row.errors)),
        run_label=row.run_label,
        fitted_at=row.fitted_at,
        input_tokens=notes.pop("input_tokens", None),
        output_tokens=notes.pop("output_tokens", None),
        notes=notes,
    )
