"""The what-if validation bench (issue 28, "Publish the error"): the real vLLM (CPU build, the
test suite's engine-bound model) under a recorded agent-like trace at several loads; the
twin calibrated on configuration A and predicting every other configuration; the error.

    .venv/bin/python bench/whatif_validation.py              # measure (once), then predict
    .venv/bin/python bench/whatif_validation.py --measure    # measure again, then predict
    .venv/bin/python bench/whatif_validation.py --predict-only
    .venv/bin/python bench/whatif_validation.py --markdown   # the published table, per change
    .venv/bin/python bench/whatif_validation.py --rows       # every row of it, markdown

Measuring and predicting are separate steps so that the predictions can be recomputed (in a
minute or two) after the twin changes. `measure` (it needs the vLLM CPU environment,
scripts/setup-vllm) starts the servers of vllm_server.BENCH_SERVERS together,
writes the trace (kneepoint.whatif.trace.agent_trace, SEED and TRACE) to TRACE_FILE and
replays it (tests/real/whatif_load.py, on the core the engines leave free) ROUNDS rounds:
in each round, at each load of LOADS, every configuration in turn (who goes first
alternates), so that the configurations of one load meet the machine in the same state.
Load n replays the trace's first SESSIONS_PER_LOAD × n sessions. It writes every run's
figures, the servers' flags, the vLLM version and the machine's load to MEASURED.

`predict` calibrates the twin on A's runs (`calibrate`: the step cost whose simulated runs
of the same trace, kneepoint.whatif.trace.simulate_trace, come closest to A's), predicts
each change at each load (kneepoint.whatif.predict_trace on the load's slice of the trace;
the n-gram drafter's acceptance from the ngram server's counters, its drafting free; two
engines as two sticky twin engines), writes the published table,
VALIDATION (kneepoint/whatif/validation.json), and prints it. The measured figure of a
(configuration, load) is the median over rounds of each metric; a load is past the knee
when it is past A's knee as kneepoint.knee.detect.knee finds it in A's throughput.

Two engines ("replicas"): A and A2 (A's flags), A's engine threads bound to core 0 (vLLM's
automatic binding here), A2's to core 1 (VLLM_CPU_OMP_THREADS_BIND). Each engine has a core,
but the machine has no third one: both API servers and the load generator share them with
the engines (the client is bound to core 1, A2's). The twin's two replicas each have their
own hardware, so the measured two-engine throughput is a lower bound of a real second
replica's, and the prediction is expected above it by what the front ends take (a client
on the engine's core cost 15-30 % of its throughput, vllm_server.off_engine_core).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.real.vllm_server import (  # noqa: E402
    BATCHED_TOKENS,
    BATCHED_TOKENS_SMALL,
    BENCH_ENV,
    BENCH_SERVERS,
    BLOCKS_A,
    BLOCKS_B,
    ENGINE_BOUND,
    MAX_SEQS,
    MAX_SEQS_C,
    NGRAM,
    VLLM_PYTHON,
    off_engine_core,
    running_together,
)

RESULTS = ROOT / "bench" / "results"
MEASURED = RESULTS / "whatif_measured.json"
TRACE_FILE = RESULTS / "whatif_trace.json"
VALIDATION = ROOT / "kneepoint" / "whatif" / "validation.json"
COMMAND = ".venv/bin/python bench/whatif_validation.py"

# The recorded traffic: agent sessions (kneepoint.whatif.trace.agent_trace's arguments). A
# session's context ends at most MAX_CONTEXT tokens, 6 blocks of 128 with a shared system
# prompt of 2: A (95 usable blocks) holds about 24 sessions at their longest.
SEED = 28
TRACE: dict[str, Any] = {
    "system_tokens": 256,
    "turns": 6,
    "tool_tokens": (16, 96),
    "output_tokens": (16, 96),
    "think_seconds": 0.05,
    "max_context": 768,
    "vocabulary": 320,  # the engine-bound model has 340 token ids
}
LOADS = (4, 12, 28)  # sessions at once: below A's knee, near it, past it
SESSIONS_PER_LOAD = 6  # load n replays the trace's first 6n sessions
ROUNDS = 3

# Each configuration: the servers it runs on (vllm_server.BENCH_SERVERS), the change from A
# the twin predicts it with (None: A itself, the calibration), and the setting as published.
CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "A": {"servers": ["A"], "change": None},
    "num_gpu_blocks": {
        "servers": ["blocks"],
        "change": {"num_gpu_blocks": BLOCKS_B},
        "calibrated": {"num_gpu_blocks": BLOCKS_A},
    },
    "max_num_seqs": {
        "servers": ["seqs"],
        "change": {"max_num_seqs": MAX_SEQS_C},
        "calibrated": {"max_num_seqs": MAX_SEQS},
    },
    "max_num_batched_tokens": {
        "servers": ["budget"],
        "change": {"max_num_batched_tokens": BATCHED_TOKENS_SMALL},
        "calibrated": {"max_num_batched_tokens": BATCHED_TOKENS},
    },
    "enable_prefix_caching": {
        "servers": ["no_prefix"],
        "change": {"enable_prefix_caching": False},
        "calibrated": {"enable_prefix_caching": True},
    },
    "num_speculative_tokens": {
        "servers": ["ngram"],
        "change": {"num_speculative_tokens": json.loads(NGRAM)["num_speculative_tokens"]},
        "calibrated": {"num_speculative_tokens": 0},
    },
    "replicas": {
        "servers": ["A", "A2"],
        "change": {"replicas": 2},
        "calibrated": {"replicas": 1},
    },
}
AIMS = {
    "throughput": 0.10,
    "ttft_p95": 0.25,
    "itl_p95": 0.25,
    "preemptions_ratio": 1.5,
    "preemptions_per_minute_floor": 1.0,
}
METRICS = ("throughput", "ttft_p50", "ttft_p95", "itl_p50", "itl_p95", "waiting_mean")
METRIC_AIMS = {"throughput": "throughput", "ttft_p95": "ttft_p95", "itl_p95": "itl_p95"}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def vllm_version() -> str:
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return done.stdout.strip().splitlines()[-1]


def sessions_for(load: int) -> int:
    return SESSIONS_PER_LOAD * load


def schedule(
    urls: dict[str, str],
    names: list[str],
    loads: tuple[int, ...] = LOADS,
    rounds: int = ROUNDS,
    trace: Path = TRACE_FILE,
    per_load: int = SESSIONS_PER_LOAD,
) -> list[dict[str, Any]]:
    """Every run of a measurement, in order: a warm-up run on each configuration of `names`
    (round -1: the first requests of a server are slower, and spec decoding compiles on
    its first draft), then per round, per load, each configuration in turn (`urls`: each
    server's), the order reversed every other time. Load n replays the trace's first
    `per_load` × n sessions."""
    runs: list[dict[str, Any]] = [  # first, a short unreported run on each configuration
        {
            "configuration": name,
            "round": -1,
            "warmup": True,
            "load": loads[0],
            "sessions": loads[0],
            "urls": [urls[server] for server in CONFIGURATIONS[name]["servers"]],
            "trace": str(trace),
        }
        for name in names
    ]
    turn = 0
    for number in range(rounds):
        for load in loads:
            order = names if turn % 2 == 0 else names[::-1]
            turn += 1
            for name in order:
                runs.append(
                    {
                        "configuration": name,
                        "round": number,
                        "load": load,
                        "sessions": per_load * load,
                        "urls": [urls[server] for server in CONFIGURATIONS[name]["servers"]],
                        "trace": str(trace),
                    }
                )
    return runs


def measure() -> dict[str, Any]:
    """Start the servers, replay the trace, save MEASURED (see the module's docstring)."""
    from kneepoint.whatif.trace import agent_trace

    RESULTS.mkdir(parents=True, exist_ok=True)
    trace = agent_trace(SEED, sessions=sessions_for(max(LOADS)), **TRACE)
    TRACE_FILE.write_text(trace.to_json())
    version = vllm_version()
    started = time.monotonic()
    machine: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "uptime_before": uptime(),
    }
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"whatif-bench-{os.getpid()}"
    with running_together(folder, BENCH_SERVERS, ENGINE_BOUND, BENCH_ENV) as servers:
        machine["servers_ready_seconds"] = round(time.monotonic() - started, 1)
        machine["uptime_ready"] = uptime()
        print(f"servers ready in {machine['servers_ready_seconds']:.0f} s; {uptime()}", flush=True)
        runs = schedule({name: s.url for name, s in servers.items()}, list(CONFIGURATIONS))
        results = replay(runs)
        models = {name: server.model.name for name, server in servers.items()}
    machine["uptime_after"] = uptime()
    measured = {
        "generated_at": now(),
        "command": f"{COMMAND} --measure",
        "vllm": version,
        "model": {
            "shape": {"layers": ENGINE_BOUND[0], "heads": ENGINE_BOUND[1], "head_dim": 64},
            "folders": models,
            "max_model_len": 1024,
            "dtype": "bfloat16",
            "kv_cache_space_gib": 1,
        },
        "machine": machine,
        "servers": {
            name: {"flags": list(flags), "env": BENCH_ENV.get(name, {})}
            for name, flags in BENCH_SERVERS.items()
        },
        "configurations": CONFIGURATIONS,
        "trace": {
            "file": str(TRACE_FILE.relative_to(ROOT)),
            "seed": SEED,
            **TRACE,
            "sessions": len(trace.sessions),
        },
        "loads": list(LOADS),
        "sessions_per_load": SESSIONS_PER_LOAD,
        "rounds": ROUNDS,
        "measure_seconds": round(time.monotonic() - started, 1),
        "runs": results,
    }
    MEASURED.write_text(json.dumps(measured, separators=(",", ":")) + "\n")
    print(f"measured in {measured['measure_seconds']:.0f} s: {MEASURED}", flush=True)
    return measured


def replay(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run `runs` in one load process (whatif_load.py) on the free core, each run checked
    exact against the servers as it comes."""
    job = json.dumps({"runs": runs})
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.real.whatif_load"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=off_engine_core,
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(job)
    process.stdin.close()
    results = []
    for line in process.stdout:
        run = json.loads(line)
        results.append(run)
        problems = exact_problems(run)
        print(
            f"{run['configuration']:>24} load {run['load']:>2} round {run['round']}: "
            f"{run['requests']} requests, {run['server']['tokens'] / run['wall_seconds']:.0f} "
            f"tok/s, TTFT p95 {(figures(run)['ttft_p95'] or 0) * 1000:.0f} ms, preemptions "
            f"{run['server']['preemptions']:.0f}, waiting {run['waiting_mean'] or 0:.1f}, "
            f"load average {run['load_average']:.1f}"
            + (f" PROBLEM: {problems}" if problems else ""),
            flush=True,
        )
    assert process.wait() == 0, "the load process failed"
    assert len(results) == len(runs), f"{len(results)} of {len(runs)} runs"
    return results


def exact_problems(run: dict[str, Any]) -> list[str]:
    """What a run got wrong that no noise explains: a request failed, the servers did not
    count every request, or generated other than exactly the requested tokens."""
    problems = []
    if run["errors"]:
        problems.append(f"{run['errors']} requests failed: {run['first_error']}")
    server = run["server"]
    if server["finished"] != run["requests"] or server["requests"] != run["requests"]:
        problems.append(f"server counted {server['finished']:.0f} of {run['requests']} requests")
    if server["tokens"] != run["requested_tokens"]:
        problems.append(f"server generated {server['tokens']:.0f} of {run['requested_tokens']}")
    if run["streamed_tokens"] != run["requested_tokens"]:
        problems.append(f"streamed {run['streamed_tokens']} of {run['requested_tokens']}")
    return problems


def percentile(values: list[float], q: float) -> float:
    """numpy's linear interpolation (the twin's TraceRun quantiles use the same rule)."""
    return float(np.percentile(values, 100 * q))


def figures(run: dict[str, Any]) -> dict[str, float | None]:
    """One run's measured metrics, as the published table names them."""
    itl = run["itl_quantiles"] or {}
    ttft = [t for t in run["per_request"]["ttft"] if t is not None]
    minutes = run["wall_seconds"] / 60
    return {
        "throughput": run["server"]["tokens"] / run["wall_seconds"],
        "ttft_p50": percentile(ttft, 0.50) if ttft else None,
        "ttft_p95": percentile(ttft, 0.95) if ttft else None,
        "ttft_mean": float(np.mean(ttft)) if ttft else None,
        "itl_mean": itl.get("mean"),
        "itl_p50": itl.get("p50"),
        "itl_p95": itl.get("p95"),
        "waiting_mean": run["waiting_mean"],
        "preemptions": run["server"]["preemptions"],
        "preemptions_per_minute": run["server"]["preemptions"] / minutes,
        "wall_seconds": run["wall_seconds"],
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """The median over rounds of each metric (None where a round lacks it)."""
    each = [figures(run) for run in runs]
    out: dict[str, float | None] = {}
    for key in each[0]:
        values = [f[key] for f in each]
        out[key] = None if any(v is None for v in values) else statistics.median(values)  # type: ignore[type-var]
    return out


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true", help="measure even if saved")
    parser.add_argument("--predict-only", action="store_true", help="only predict")
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print validation.json's table per change (the README's and the how-to's)",
    )
    parser.add_argument(
        "--rows", action="store_true", help="print validation.json's every row, as markdown"
    )
    args = parser.parse_args(argv)
    if args.markdown or args.rows:
        from kneepoint.whatif import validation

        published = json.loads(VALIDATION.read_text())
        print(validation.markdown(published) if args.markdown else markdown(published))
        return
    if args.measure or (not args.predict_only and not MEASURED.exists()):
        measured = measure()
    else:
        measured = json.loads(MEASURED.read_text())
    predict(measured)


def knee_load(measured: dict[str, Any]) -> int | None:
    """A's knee among the loads, as the product finds a knee (kneepoint.knee.detect.knee:
    Kneedle on throughput against load): a load past it is "past the knee"."""
    from kneepoint.knee.detect import knee
    from kneepoint.knee.runs import Point

    points = [
        Point(
            concurrency=load,
            output_tokens_per_second=medians(runs_of(measured, "A", load))["throughput"] or 0.0,
        )
        for load in measured["loads"]
    ]
    return knee(points)


def runs_of(measured: dict[str, Any], configuration: str, load: int) -> list[dict[str, Any]]:
    return [
        r
        for r in measured["runs"]
        if r["configuration"] == configuration and r["load"] == load and r["round"] >= 0
    ]


def error_of(metric: str, measured: float | None, predicted: float | None) -> dict[str, Any]:
    """A metric's row: the relative error (predicted − measured) ÷ measured, its aim (None
    where the issue sets none) and whether it is met."""
    error = (
        None if measured in (None, 0) or predicted is None else (predicted - measured) / measured
    )
    aim_key = METRIC_AIMS.get(metric)
    aim = AIMS[aim_key] if aim_key else None
    met = None if aim is None or error is None else abs(error) <= aim
    return {"measured": measured, "predicted": predicted, "error": error, "aim": aim, "met": met}


def preemption_row(
    measured: float, predicted: float, minutes: tuple[float, float]
) -> dict[str, Any]:
    """Preemptions: measured ÷ predicted within the ratio aim either way, or both at most the
    floor per minute (each over its own duration: measured wall, predicted duration)."""
    ratio = None if not predicted else measured / predicted
    per_minute = [measured / minutes[0], predicted / minutes[1]]
    floor = AIMS["preemptions_per_minute_floor"]
    bound = AIMS["preemptions_ratio"]
    met = all(rate <= floor for rate in per_minute) or (
        ratio is not None and 1 / bound <= ratio <= bound
    )
    return {
        "measured": measured,
        "predicted": predicted,
        "ratio": ratio,
        "per_minute": per_minute,
        "aim": bound,
        "met": met,
    }


def table_of(
    measured: dict[str, Any],
    predictions: dict[tuple[str, int], dict[str, float | None]],
    calibration: dict[str, Any],
) -> dict[str, Any]:
    """validation.json's object: one row per (change, load) of the measurement."""
    knee = knee_load(measured)
    rows = []
    present = {run["configuration"] for run in measured["runs"]}
    for name, spec in CONFIGURATIONS.items():
        if spec["change"] is None or name not in present:
            continue
        for load in measured["loads"]:
            real = medians(runs_of(measured, name, load))
            twin = predictions[(name, load)]
            metrics = {m: error_of(m, real[m], twin.get(m)) for m in METRICS}
            wall = real["wall_seconds"] or 0.0
            minutes = (wall / 60, (twin.get("wall_seconds") or wall) / 60)
            metrics["preemptions"] = preemption_row(
                real["preemptions"] or 0.0, twin.get("preemptions") or 0.0, minutes
            )
            rows.append(
                {
                    "change": name,
                    "setting": spec["change"],
                    "calibrated": spec["calibrated"],
                    "load": load,
                    "past_knee": knee is not None and load > knee,
                    "metrics": metrics,
                }
            )
    loads = [r["load_average"] for r in measured["runs"]]
    shape = measured.get("model", {}).get(
        "shape", {"layers": ENGINE_BOUND[0], "heads": ENGINE_BOUND[1]}
    )
    return {
        "generated_at": now(),
        "command": COMMAND,
        "vllm": measured.get("vllm"),
        "model": (
            f"the tests' engine-bound model ({shape['layers']} layers, {shape['heads']} "
            "attention heads of 64), vLLM's CPU build, bfloat16"
        ),
        "machine": (
            f"{measured.get('machine', {}).get('cpus', os.cpu_count())} cores, shared (load "
            f"average {min(loads):.1f}-{max(loads):.1f} during the runs)"
        ),
        "measured_at": measured.get("generated_at"),
        "trace": measured["trace"],
        "rounds": measured.get("rounds"),
        "knee_load": knee,
        "calibration": calibration,
        "aims": AIMS,
        "rows": rows,
    }


def shape_of(name: str) -> dict[str, Any]:
    """A configuration's engine as its server was started (vllm_server.BENCH_SERVERS), in
    kneepoint.whatif.EngineShape's terms."""
    flags = BENCH_SERVERS[CONFIGURATIONS[name]["servers"][0]]
    value = {flags[i]: flags[i + 1] for i in range(len(flags) - 1) if flags[i].startswith("--")}
    return {
        "num_gpu_blocks": int(value["--num-gpu-blocks-override"]),
        "block_size": 128,
        "max_num_seqs": int(value["--max-num-seqs"]),
        "max_model_len": 1024,
        "max_num_batched_tokens": int(value["--max-num-batched-tokens"]),
        "enable_prefix_caching": "--no-enable-prefix-caching" not in flags,
    }


def acceptance(measured: dict[str, Any]) -> float | None:
    """The n-gram drafter's acceptance rate in the twin's terms (per drafted token, given the
    ones before it accepted: a) from the ngram server's counters over its runs: the mean
    accepted tokens per draft, accepted ÷ drafts, is a + a² + … + a^γ for γ drafted tokens;
    solved for a by bisection (None if it drafted nothing)."""
    runs = [
        r
        for r in measured["runs"]
        if r["configuration"] == "num_speculative_tokens" and r["round"] >= 0
    ]
    drafts = sum(r["server"]["spec_drafts"] for r in runs)
    if not drafts:
        return None
    mean = sum(r["server"]["spec_accepted_tokens"] for r in runs) / drafts
    gamma = CONFIGURATIONS["num_speculative_tokens"]["change"]["num_speculative_tokens"]
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if sum(middle**k for k in range(1, gamma + 1)) < mean:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def trace_sessions(measured: dict[str, Any], load: int) -> Any:
    """The trace a run of `load` replayed: the saved trace's first sessions_for(load)."""
    from kneepoint.whatif.trace import AgentTrace

    trace = AgentTrace.from_json((ROOT / measured["trace"]["file"]).read_text())
    return AgentTrace(trace.sessions[: measured["sessions_per_load"] * load])


# The step-cost terms fitted, and where the search starts (seconds; per token; per context
# token read; per request).
FITTED_COST = {
    "overhead_seconds": 3e-3,
    "token_seconds": 1e-5,
    "context_token_seconds": 1e-7,
    "request_overhead_seconds": 1e-2,
}
CALIBRATION_EVALUATIONS = 200


def calibrate(measured: dict[str, Any]) -> Any:
    """The twin fitted to A's runs (medians over rounds): the step cost whose simulated runs
    of the same trace at the same loads (kneepoint.whatif.trace.simulate_trace) come closest
    to A's measured throughput, mean TTFT and mean ITL, in RMS relative error (Nelder-Mead
    over the logarithms of FITTED_COST's terms, at most CALIBRATION_EVALUATIONS runs of the
    loads). Directly on the simulation, not on its linearisation: with think times and a
    closed loop the schedule moves with the cost, and fitting the terms of one schedule and
    simulating again did not converge on these runs (the RMS error jumped between 11 % and
    130 % from one pass to the next)."""
    from scipy.optimize import minimize

    from kneepoint.twin.simulated_engine import StepCost
    from kneepoint.whatif import TRUST_RMS, EngineShape, FitPoint, FitQuality, Profile
    from kneepoint.whatif.trace import simulate_trace

    shape = EngineShape(**shape_of("A"))
    loads = list(measured["loads"])
    real = {load: medians(runs_of(measured, "A", load)) for load in loads}
    traces = {load: trace_sessions(measured, load) for load in loads}
    names = tuple(FITTED_COST)

    def cost(x: np.ndarray) -> StepCost:
        return StepCost(**dict(zip(names, (float(v) for v in np.exp(x)), strict=True)))

    def points(x: np.ndarray) -> list[FitPoint]:
        out = []
        for load in loads:
            run = simulate_trace(shape.engine_config(cost(x)), traces[load], load)
            simulated = {
                "throughput": run.output_tokens_per_second,
                "ttft_mean": float(run.ttfts.mean()),
                "itl_mean": float(run.itls.mean()) if run.itls.size else None,
            }
            for metric, value in simulated.items():
                target = real[load][metric]
                if target and value is not None:
                    out.append(FitPoint("trace", float(load), metric, target, value))
        return out

    def rms(x: np.ndarray) -> float:
        errors = [p.relative_error for p in points(x)]
        return float(np.sqrt(np.mean(np.square(errors))))

    start = np.log(list(FITTED_COST.values()))
    best = minimize(
        rms,
        start,
        method="Nelder-Mead",
        options={"maxfev": CALIBRATION_EVALUATIONS, "xatol": 0.02, "fatol": 1e-3},
    )
    fitted = points(best.x)
    error = float(np.sqrt(np.mean(np.square([p.relative_error for p in fitted]))))
    trusted = error <= TRUST_RMS
    quality = FitQuality(
        tuple(fitted),
        trusted,
        f"RMS relative error {error:.1%} {'≤' if trusted else '>'} {TRUST_RMS:.0%}",
    )
    return Profile(replica="vllm-cpu A", shape=shape, cost=cost(best.x), fit=quality)


def twin_predictions(
    measured: dict[str, Any],
) -> tuple[dict[str, Any], dict[tuple[str, int], dict[str, float | None]]]:
    """Calibrate the twin on A's runs and predict each configuration present at each load:
    (the calibration's summary, predictions by (configuration, load) with the keys of
    `figures`). A's own (no change: the calibrated twin itself) is there too, to tell how
    closely the calibration reproduces A's figure at each load."""
    from kneepoint.whatif import Change, predict_trace

    profile = calibrate(measured)
    present = {run["configuration"] for run in measured["runs"]}
    alpha = acceptance(measured)
    predictions: dict[tuple[str, int], dict[str, float | None]] = {}
    for name, spec in CONFIGURATIONS.items():
        if name not in present:
            continue
        settings = dict(spec["change"] or {})
        ngram = "num_speculative_tokens" in settings
        if ngram:
            settings["spec_acceptance_rate"] = alpha
        change = Change(**settings)
        for load in measured["loads"]:
            # Each load ran its own slice of the trace (sessions_per_load × load sessions).
            (run,) = predict_trace(
                profile, change, trace_sessions(measured, load), [load], ngram=ngram
            )
            predictions[(name, load)] = {
                "throughput": run.output_tokens_per_second,
                "ttft_p50": run.ttft_p50,
                "ttft_p95": run.ttft_p95,
                "ttft_mean": run.ttft_mean,
                "itl_p50": run.itl_p50,
                "itl_p95": run.itl_p95,
                "itl_mean": run.itl_mean,
                "waiting_mean": run.waiting_mean,
                "preemptions": float(run.preemptions),
                "wall_seconds": run.wall_seconds,
            }
    fit = profile.fit
    calibration = {
        "configuration": {**shape_of("A"), "replicas": 1, "num_speculative_tokens": 0},
        "rms_relative_error": fit.rms,
        "trusted": fit.trusted,
        "reason": fit.reason,
        "loads": list(measured["loads"]),
        "cost": {k: v for k, v in vars(profile.cost).items()},
        "spec_acceptance_rate": alpha,
        "points": [point.as_dict() for point in fit.points],
    }
    return calibration, predictions


def predict(measured: dict[str, Any]) -> dict[str, Any]:
    """Calibrate on A, predict every change at every load, write VALIDATION, print it."""
    calibration, predictions = twin_predictions(measured)
    table = table_of(measured, predictions, calibration)
    VALIDATION.write_text(json.dumps(table, indent=1) + "\n")
    print(text_table(table))
    return table


def _format(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric.startswith(("ttft", "itl")):
        return f"{value * 1000:.1f} ms"
    if metric == "throughput":
        return f"{value:.0f} tok/s"
    return f"{value:.2f}"


def table_lines(table: dict[str, Any]) -> list[list[str]]:
    """The published rows: change, load, metric, measured, predicted, error, aim, met."""
    lines = []
    for row in table["rows"]:
        setting = ", ".join(f"{k} {v}" for k, v in row["setting"].items())
        where = f"{row['load']}" + (" (past knee)" if row["past_knee"] else "")
        for metric, cell in row["metrics"].items():
            if metric == "preemptions":
                error = "-" if cell["ratio"] is None else f"×{cell['ratio']:.2f}"
                aim = f"×{cell['aim']} or ≤ {table['aims']['preemptions_per_minute_floor']:g}/min"
                shown = [f"{cell['measured']:.0f}", f"{cell['predicted']:.0f}"]
            else:
                error = "-" if cell["error"] is None else f"{cell['error']:+.1%}"
                aim = "-" if cell["aim"] is None else f"±{cell['aim']:.0%}"
                shown = [_format(metric, cell["measured"]), _format(metric, cell["predicted"])]
            met = {True: "yes", False: "NO", None: "-"}[cell["met"]]
            lines.append([setting, where, metric, *shown, error, aim, met])
    return lines


HEADER = ["change", "load", "metric", "measured", "predicted", "error", "aim", "met"]


def text_table(table: dict[str, Any]) -> str:
    lines = [HEADER, *table_lines(table)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    calibration = table["calibration"]
    head = (
        f"calibrated on A ({calibration.get('configuration')}), RMS relative error "
        f"{calibration.get('rms_relative_error')}; A's knee at load {table['knee_load']}"
    )
    return "\n".join(
        [
            head,
            *("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines),
        ]
    )


def markdown(table: dict[str, Any]) -> str:
    """validation.json's table as markdown (the README's and docs' source)."""
    rows = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * 2 + "---|" + "---:|" * 4 + "---|"]
    rows += ["| " + " | ".join(line) + " |" for line in table_lines(table)]
    return "\n".join(rows)


if __name__ == "__main__":
    main()
