"""What-if against a real engine (issue 28): the validation bench's reduced version
(bench/whatif_validation.py), failing when a prediction leaves its published error.

The bench replays a recorded agent trace (kneepoint.whatif.trace) closed-loop against the
real vLLM (CPU build, the engine-bound model) at several loads and configurations,
calibrates the twin on configuration A and predicts the others; its table is published in
kneepoint/whatif/validation.json, each (change, load, metric) marked met or not against the
issue's aims. This test runs the same measurement and prediction (the bench's functions),
smaller: the servers the session starts anyway (tests/real/conftest.py: A; B, A with half
the KV blocks; C, A with a quarter of its max_num_seqs), the bench's lowest and highest
loads (below A's knee, and past it where B preempts and C queues), SESSIONS_PER_LOAD
sessions per unit of load instead of the bench's 6, ROUNDS rounds, the configurations
taking turns at each load (the machine is shared and drifts). A (configuration, load)'s
figure is the median over the rounds.

What is asserted:
- Exact, whatever the noise: every request of every run completed, and each server counted
  every request and generated exactly the tokens the trace asked for (ignore_eos; no other
  traffic on it), from its own counters before and after the run.
- Per (change, load, metric) the published table marks as met, this run's prediction meets
  the same aim (throughput within 10 %, TTFT and ITL p95 within 25 %, preemptions within
  1.5× or both at most 1 a minute): the aims, not bounds widened to pass. A latency or
  throughput aim is not judged where this run cannot tell the twin's error from the
  machine's (`unjudgeable`: the rounds disagree by more than the aim, or the calibrated
  twin misses A's own figure at that load by more than the aim, or the published error,
  that miss and half the rounds' spreads together pass it); the test prints each. The
  preemption counts are always judged. Where the table marks an aim missed, nothing is
  asserted.

It skips without the vLLM CPU environment (scripts/setup-vllm; tests/real/vllm_server.py), and
when the published table has no rows for this test's changes and loads.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from bench.whatif_validation import (
    LOADS as BENCH_LOADS,
)
from bench.whatif_validation import (
    SEED,
    TRACE,
    VALIDATION,
    exact_problems,
    figures,
    medians,
    replay,
    runs_of,
    schedule,
    table_of,
    text_table,
    twin_predictions,
)
from kneepoint.whatif.trace import agent_trace
from tests.real.vllm_server import BENCH_SERVERS, ENGINE_BOUND_SERVERS, Vllm

pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]

LOADS = (BENCH_LOADS[0], BENCH_LOADS[-1])
ROUNDS = 2
SESSIONS_PER_LOAD = 4  # the bench replays 6 per unit of load; fewer here, for CI's time
# The bench's configurations measured here, and the bench's servers they need
# (vllm_server.BENCH_SERVERS) by the session's engine-bound server with the same flags.
CONFIGURATIONS = ["A", "num_gpu_blocks", "max_num_seqs"]
SERVERS = {"A": "A", "blocks": "B", "seqs": "C"}


def published_aims() -> dict[tuple[str, int, str], dict[str, Any]]:
    """(change, load, metric) -> the published table's cell (its error, whether it is met)."""
    table = json.loads(VALIDATION.read_text())
    return {
        (row["change"], row["load"], metric): cell
        for row in table["rows"]
        for metric, cell in row["metrics"].items()
        if cell["met"] is not None
    }


def spread(runs: list[dict[str, Any]], metric: str) -> float | None:
    """How far A's rounds at one load are apart in `metric`: (max − min) ÷ median."""
    values = [figures(run)[metric] for run in runs]
    if any(v is None for v in values):
        return None
    middle = statistics.median(values)  # type: ignore[type-var]
    return (max(values) - min(values)) / middle if middle else None  # type: ignore[type-var, operator]


def test_whatif_predictions_stay_within_their_published_error(
    engine_bound_servers: dict[str, Vllm], tmp_path: Path
) -> None:
    """Measure A, B and C as the bench does (smaller), predict B and C from A, and hold
    each prediction the published table marks as meeting its aim to that aim.

    The machine's noise: the configurations take turns at each load, so a slower minute
    slows A's run and B's alike and the calibration on A carries it into B's prediction;
    what is left is the drift between one run and the next, and the tail latency the
    machine adds, which the calibration (on means) carries only as far as it reproduces A's
    own tail. Where either shows (`unjudgeable`), the metric is not judged at that load: the
    test prints it and asserts nothing of it. The exact checks and the preemption counts
    (the server's counters) are judged always."""
    if not VALIDATION.exists():
        pytest.skip("no published table: run bench/whatif_validation.py")
    published = published_aims()
    wanted = {(change, load) for change in CONFIGURATIONS[1:] for load in LOADS}
    missing = wanted - {(change, load) for change, load, _ in published}
    if missing:
        pytest.skip(f"kneepoint/whatif/validation.json has no rows for {sorted(missing)}")
    started = time.monotonic()
    trace = agent_trace(SEED, sessions=SESSIONS_PER_LOAD * max(LOADS), **TRACE)
    path = tmp_path / "trace.json"
    path.write_text(trace.to_json())
    for bench, session in SERVERS.items():
        assert BENCH_SERVERS[bench] == ENGINE_BOUND_SERVERS[session], (bench, session)
    urls = {bench: engine_bound_servers[session].url for bench, session in SERVERS.items()}
    runs = replay(schedule(urls, CONFIGURATIONS, LOADS, ROUNDS, path, SESSIONS_PER_LOAD))
    measure_seconds = time.monotonic() - started

    for run in runs:
        assert not exact_problems(run), (run["configuration"], run["load"], exact_problems(run))

    measured = {
        "loads": list(LOADS),
        "sessions_per_load": SESSIONS_PER_LOAD,
        "rounds": ROUNDS,
        "trace": {"file": str(path)},
        "runs": runs,
    }
    calibration, predictions = twin_predictions(measured)
    table = table_of(measured, predictions, calibration)
    print(f"\n{text_table(table)}\n(load and measurement {measure_seconds:.0f} s)")

    failures, unjudged = judge(table, published, measured, predictions)
    if unjudged:
        print("not judged:\n" + "\n".join(unjudged))
    assert not failures, "\n".join(failures)


def judge(
    table: dict[str, Any],
    published: dict[tuple[str, int, str], dict[str, Any]],
    measured: dict[str, Any],
    predictions: dict[tuple[str, int], dict[str, float | None]],
) -> tuple[list[str], list[str]]:
    """(failures, not judged): each (change, load, metric) the published table marks met and
    this run misses is a failure, unless the run cannot tell the twin's error from the
    machine's (`unjudgeable`)."""
    failures, unjudged = [], []
    for row in table["rows"]:
        change, load = row["change"], row["load"]
        for metric, cell in row["metrics"].items():
            mark = published.get((change, load, metric))
            if not mark or not mark["met"] or cell["met"]:
                continue
            why = unjudgeable(
                metric, change, load, cell["aim"], mark.get("error"), measured, predictions
            )
            if why:
                unjudged.append(f"{change} at load {load}: {metric}: {why}")
            else:
                failures.append(f"{change} at load {load}: {metric} {cell}")
    return failures, unjudged


def unjudgeable(
    metric: str,
    change: str,
    load: int,
    aim: float,
    published: float | None,
    measured: dict[str, Any],
    predictions: dict[tuple[str, int], dict[str, float | None]],
) -> str | None:
    """Why a missed throughput or latency aim says nothing of the what-if on this run, or
    None. Preemptions (the servers' own counters) are always judged.

    - The machine did not repeat itself: A's rounds at the load, or the change's, are
      further apart than the aim ((max − min) ÷ median).
    - The calibration does not carry the metric at this load: the calibrated twin, asked
      for A itself, misses A's own measured figure by more than the aim. The calibration
      fits mean TTFT, mean ITL and throughput; a p95 is the tail the two shared cores add,
      which moves with what else the machine runs (a CI run on a quiet machine measured
      TTFT p95 37-45 ms at load 4 where the published run's busier machine gave figures
      the calibration reproduced). A change's prediction can then be no closer than A's
      own, whatever the change.
    - A twin as good as published could miss the aim on this run: its published error
      here, plus the calibration's miss of A's own figure on this run (carried into every
      change's prediction), plus half of A's and of the change's rounds' spreads (where
      each measured figure stands) pass the aim. The run then cannot tell a twin that left
      its published error from one that did not; where they stay under the aim, a miss
      means the prediction moved from its published error by more than this run's noise.
      (CI runs: TTFT p95 at load 4 for 48 blocks, published −5 %, A's own missed by −21 %,
      each configuration's two rounds 15 % apart, measured −38 %; throughput at load 28 for
      max_num_seqs 16, published −6 %, rounds ±5 %, measured −10.1 %.)"""
    if metric == "preemptions":
        return None
    spreads = {}
    for configuration in ("A", change):
        noise = spread(runs_of(measured, configuration, load), metric)
        if noise is not None and noise > aim:
            return f"{configuration}'s rounds {noise:.0%} apart"
        spreads[configuration] = noise or 0.0
    own = medians(runs_of(measured, "A", load))[metric]
    twin = predictions.get(("A", load), {}).get(metric)
    if not own or twin is None:
        return None
    miss = (twin - own) / own
    if abs(miss) > aim:
        return f"the calibrated twin misses A's own by {miss:+.0%}"
    drift = (spreads["A"] + spreads[change]) / 2
    if abs(published or 0.0) + abs(miss) + drift > aim:
        return (
            f"published error {published or 0.0:+.0%}, the calibrated twin's miss of A's own"
            f" {miss:+.0%} and the rounds' ±{drift:.0%}: together past the aim"
        )
    return None
