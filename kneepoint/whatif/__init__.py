"""What-if: the twin calibrated to a replica replays its week under a change.

The API other code builds on (docs/explanation/whatif.md, "The Python API"):

- `EngineShape`, `StepCost`: a replica's engine configuration (model-agnostic) and the
  twin's step-time model.
- `calibrate_sweep(points, shape, input_tokens, output_tokens, ...) -> Profile`: fit the
  step cost to measured sweep points (kneepoint.whatif.calibrate.calibrate(run, shape,
  replica, levels) from a stored knee run and production load levels).
- `predict_sweep(profile, change, ladder, ...) -> list[SweepPrediction]`: a closed-loop
  sweep predicted at a changed configuration.
- `Change`, `parse_changes`: the changes (kv_cache_dtype, max_num_seqs, …).
- `load_history`, `load_of`: a stored window as load; kneepoint.whatif.replay.replay
  replays it (the submodules `calibrate` and `replay` keep their names: the functions of
  the same names are not re-exported here).
- `calibrate_replica(session, config, replica, run_label, start, end, now=None) -> Profile`
  and `whatif_replica(session, config, replica, change, start, end) -> WhatIf`
  (`.as_dict()`: the `whatif --json` contract): what the CLI commands do.
- `save_profile`, `latest_profile`: calibrations in the store.
- `AgentTrace`, `Session`, `Turn`, `agent_trace`: agent-like traffic (kneepoint.whatif.trace
  says how a run of it goes); `simulate_trace(config, trace, load, seed, engines) ->
  TraceRun`: the twin runs it; `calibrate_trace(measured, shape, trace) -> Profile` from
  `TraceMeasurement`s; `predict_trace(profile, change, trace, loads) ->
  list[TracePrediction]`.
"""

from kneepoint.twin.simulated_engine import StepCost
from kneepoint.whatif.calibrate import Level, TraceMeasurement, calibrate_sweep, calibrate_trace
from kneepoint.whatif.changes import KEYS, Change, parse_changes
from kneepoint.whatif.history import History, load_history
from kneepoint.whatif.predict import CONTRACT, WhatIf, calibrate_replica, whatif_replica
from kneepoint.whatif.predict_sweep import predict_sweep, predict_trace
from kneepoint.whatif.profile import (
    TRUST_RMS,
    EngineShape,
    FitPoint,
    FitQuality,
    Profile,
    UntrustedProfile,
    WhatIfError,
)
from kneepoint.whatif.replay import Load, Replay, load_of
from kneepoint.whatif.store import latest_profile, save_profile
from kneepoint.whatif.sweep import SweepPrediction
from kneepoint.whatif.trace import (
    AgentTrace,
    Session,
    TracePrediction,
    TraceRun,
    Turn,
    agent_trace,
    simulate_trace,
)

__all__ = [
    "CONTRACT",
    "KEYS",
    "TRUST_RMS",
    "AgentTrace",
    "Change",
    "EngineShape",
    "FitPoint",
    "FitQuality",
    "History",
    "Level",
    "Load",
    "Profile",
    "Replay",
    "Session",
    "StepCost",
    "SweepPrediction",
    "TraceMeasurement",
    "TracePrediction",
    "TraceRun",
    "Turn",
    "UntrustedProfile",
    "WhatIf",
    "WhatIfError",
    "agent_trace",
    "calibrate_replica",
    "calibrate_sweep",
    "calibrate_trace",
    "latest_profile",
    "load_history",
    "load_of",
    "parse_changes",
    "predict_sweep",
    "predict_trace",
    "save_profile",
    "simulate_trace",
    "whatif_replica",
]
