"""What-if: the twin calibrated to a replica replays its week under a change.

The API other code builds on (docs/whatif.md, "API for other helpers"):

- `EngineShape`, `StepCost`: a replica's engine configuration (model-agnostic) and the
  twin's step-time model.
- `calibrate_sweep(points, shape, input_tokens, output_tokens, ...) -> Profile`: fit the
  step cost to measured sweep points; `calibrate(run, shape, replica, levels)` from a
  stored knee run and production load levels.
- `predict_sweep(profile, change, ladder, ...) -> list[SweepPrediction]`: a closed-loop
  sweep predicted at a changed configuration.
- `Change`, `parse_changes`: the changes (kv_cache_dtype, max_num_seqs, …).
- `load_history`, `replay`, `whatif`: a stored window replayed, baseline and changed.
- `save_profile`, `latest_profile`: calibrations in the store.
"""

from kneepoint.twin.engine import StepCost
from kneepoint.whatif.calibrate import Level, calibrate, calibrate_sweep
from kneepoint.whatif.changes import KEYS, Change, parse_changes
from kneepoint.whatif.predict_sweep import predict_sweep
from kneepoint.whatif.profile import (
    TRUST_RMS,
    EngineShape,
    FitPoint,
    FitQuality,
    Profile,
    UntrustedProfile,
    WhatIfError,
)
from kneepoint.whatif.sweep import SweepPrediction

__all__ = [
    "KEYS",
    "TRUST_RMS",
    "Change",
    "EngineShape",
    "FitPoint",
    "FitQuality",
    "Level",
    "Profile",
    "StepCost",
    "SweepPrediction",
    "UntrustedProfile",
    "WhatIfError",
    "calibrate",
    "calibrate_sweep",
    "parse_changes",
    "predict_sweep",
]
