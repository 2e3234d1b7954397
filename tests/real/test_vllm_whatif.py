"""What-if against a real engine, not against itself (issue 18): calibrate the twin from a
closed-loop sweep of a real vLLM at configuration A, predict the same sweep at two changed
configurations, B (half the KV blocks, so it preempts at the higher steps) and C (a quarter
of A's max_num_seqs, so requests queue at the higher steps), run B and C for real with the
same load, and hold the predictions against what their servers counted.

Three real vLLM servers (CPU build, the engine-bound model of vllm_server.py) are started
side by side and loaded in turn, never together: an idle server uses no CPU here, and
taking turns at each step means the configurations' steps meet the same machine (this one
is shared; its load varies by the minute). The load is `kneepoint sweep`'s closed loop
(whatif_load.py, on the core the engines leave free): INPUT-token prompts, exactly OUTPUT
tokens each (ignore_eos), max(MINIMUM, PER_CLIENT × concurrency) requests a step. A step's
numbers are the server's own, from its counters before and after the step: generated tokens
over the client's wall time (throughput), the TTFT and inter-token-latency histograms' sum
over count (means), the preemption counter. Per step, the figure used is the median over
ROUNDS rounds.

The ladder straddles both knees. A request ends holding 2 blocks (INPUT + OUTPUT tokens in
blocks of the server's block size, 128): A's cache holds every step's requests, B's the
lower steps' only, and above them B preempts, recomputes, and its throughput flattens while
TTFT climbs. C runs at most MAX_SEQS_C requests at once: above that, requests wait for a
slot and TTFT grows by whole requests' durations. The calibration uses A's points and A's
engine as vllm:cache_config_info and its flags state it; each prediction changes only
num_gpu_blocks or max_num_seqs.

The issue's aims are throughput and mean TTFT within 20 % (AIM_ERROR) and preemptions within
a factor of 1.5, before the knee and after it; each step's errors are printed with whether
they met the aims. What is asserted:

- Exact, whatever the noise: every request completed, and the server generated exactly
  requests × OUTPUT tokens in each step (no other traffic, ignore_eos honoured).
- The calibration is trusted (the product refuses to predict from an untrusted one).
- Preemptions: none predicted and none measured at A and C, nor at B's steps whose requests
  fit; some of both at B's other steps, measured ÷ predicted within PREEMPTION_RATIO.
- The right direction at the top step, predicted and measured: B's and C's mean TTFT over
  TOP_STEP_TTFT_RATIO × A's; their predicted throughput below A's.
- Per step at B and C, throughput within THROUGHPUT_ERROR and mean TTFT within a factor
  TTFT_FACTOR of the measured. These are wider than the aims because this test's runs here
  did not meet the aims with margin (docs/how-to/whatif.md, "What-if against a real vLLM",
  has the runs):
  on this shared 2-core machine under other work (load average 4–40), the slowest of a
  step's three rounds was up to 2.5× slower than the fastest (TTFT 4×), and at the steps
  where A and B are the same engine (their requests fit both caches) B's medians were up to
  31 % off A's in throughput and 33 % in TTFT: the prediction cannot be held closer than the
  machine repeats itself. The twin also preempted 1.1–1.8× as often as the real engine
  (PREEMPTION_RATIO's lower end), a difference in scheduling the docs report. Under the
  heaviest load (30–53) the calibration itself missed the 20 % RMS the product trusts in 2
  of 10 runs, and the test fails there: it cannot tell the twin's error from the machine's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kneepoint.knee.runs import Point
from kneepoint.whatif import EngineShape, SweepPrediction, calibrate_sweep, predict_sweep
from tests.real.vllm_server import (
    BATCHED_TOKENS,
    BLOCKS_A,
    BLOCKS_B,
    MAX_SEQS,
    MAX_SEQS_C,
    WHATIF_CONFIGS,
    Vllm,
    off_engine_core,
)

pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
INPUT, OUTPUT = 128, 128  # tokens: a request holds 2 blocks of 128 at its end
LADDER = (4, 16, 32, 44)
PER_CLIENT, MINIMUM = 3, 32  # a step of concurrency c: max(MINIMUM, PER_CLIENT × c) requests
ROUNDS = 3  # rounds of the ladder, the configurations taking turns at each step
# Each configuration: (KV blocks, max_num_seqs), as its server is started (vllm_server.py);
# the change predicted from A.
CONFIGS = WHATIF_CONFIGS
CHANGES: dict[str, dict[str, object]] = {
    "B": {"num_gpu_blocks": BLOCKS_B},
    "C": {"max_num_seqs": MAX_SEQS_C},
}
# The aims, reported per step (see the module's docstring for what is asserted).
AIM_ERROR, AIM_PREEMPTION_FACTOR = 0.20, 1.5
# What is asserted, from this test's runs on this machine (docs/how-to/whatif.md gives them).
THROUGHPUT_ERROR = 0.35  # relative, either way
TTFT_FACTOR = 2.0  # predicted mean TTFT within [measured ÷ 2, measured × 2]
PREEMPTION_RATIO = (0.25, 1.5)  # measured ÷ predicted
TOP_STEP_TTFT_RATIO = 1.5  # B's (C's) mean TTFT over A's at the top step, at least


def requests_for(concurrency: int) -> int:
    return max(MINIMUM, PER_CLIENT * concurrency)


@pytest.fixture(scope="module")
def servers(engine_bound_servers: dict[str, Vllm]) -> dict[str, Vllm]:
    """A, B and C, started at the same time (each start is mostly torch compiling), once per
    session: the sweep test loads A too (tests/real/conftest.py)."""
    return engine_bound_servers


def cache_config(server: Vllm) -> dict[str, str]:
    """The labels of the server's vllm:cache_config_info."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                return dict(sample.labels)
    raise AssertionError("no vllm:cache_config_info on /metrics")


def run_rounds(servers: dict[str, Vllm]) -> dict[str, list[list[dict[str, Any]]]]:
    """ROUNDS rounds of the ladder, the servers taking turns at each step (whatif_load.py):
    per server a list of rounds of steps; each step checked exact against the server."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.real.whatif_load",
            ",".join(server.url for server in servers.values()),
            ",".join(map(str, LADDER)),
            str(INPUT),
            str(OUTPUT),
            str(PER_CLIENT),
            str(MINIMUM),
            str(ROUNDS),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        preexec_fn=off_engine_core,
    )
    assert done.returncode == 0, f"the load failed: {done.stderr[-3000:]}"
    out: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in servers}
    steps = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    for name, server in servers.items():
        mine = [s for s in steps if s["url"] == server.url]
        for number in range(ROUNDS):
            this = [s for s in mine if s["round"] == number]
            assert [s["concurrency"] for s in this] == list(LADDER), done.stdout
            out[name].append(this)
    for step in (s for rounds in out.values() for steps in rounds for s in steps):
        requests = requests_for(step["concurrency"])
        assert step["errors"] == 0, step["first_error"]
        assert step["completed"] == requests == step["server_requests"], step
        assert step["server_finished"] == requests, step
        assert step["server_tokens"] == requests * OUTPUT, step
    return out


def median_point(rounds: list[list[dict[str, Any]]], index: int) -> Point:
    """A step's point: the median over rounds of each of the server's figures."""
    steps = [steps[index] for steps in rounds]

    def median(key: str) -> float:
        return statistics.median(float(s[key]) for s in steps)

    return Point(
        concurrency=steps[0]["concurrency"],
        output_tokens_per_second=median("generation_tokens_per_second"),
        ttft_mean_seconds=median("ttft_mean_seconds"),
        itl_mean_seconds=median("itl_mean_seconds"),
        input_tokens_mean=median("server_prompt_tokens") / steps[0]["completed"],
        completed=steps[0]["completed"],
        duration_seconds=median("wall_seconds"),
        server={"preemptions": median("server_preemptions")},
    )


def relative(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def table(
    title: str,
    predicted: list[SweepPrediction],
    measured: list[Point],
    rounds: list[list[dict[str, Any]]],
) -> str:
    """Predicted against measured per step (the median over rounds; each round's in
    brackets)."""

    def each(index: int, key: str, scale: float, form: str) -> str:
        return "/".join(format(r[index][key] * scale, form) for r in rounds)

    lines = [
        title,
        "| concurrency | throughput predicted | measured (rounds) | error "
        "| mean TTFT predicted | measured (rounds) | error "
        "| preemptions predicted | measured (rounds) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, (p, m) in enumerate(zip(predicted, measured, strict=True)):
        assert m.ttft_mean_seconds is not None
        lines.append(
            f"| {p.concurrency} | {p.output_tokens_per_second:.0f} tok/s "
            f"| {m.output_tokens_per_second:.0f} tok/s "
            f"({each(i, 'generation_tokens_per_second', 1, '.0f')}) "
            f"| {relative(p.output_tokens_per_second, m.output_tokens_per_second):+.1%} "
            f"| {p.ttft_mean_seconds * 1000:.0f} ms | {m.ttft_mean_seconds * 1000:.0f} ms "
            f"({each(i, 'ttft_mean_seconds', 1000, '.0f')}) "
            f"| {relative(p.ttft_mean_seconds, m.ttft_mean_seconds):+.1%} "
            f"| {p.preemptions} | {m.server['preemptions']:.0f} "
            f"({each(i, 'server_preemptions', 1, '.0f')}) |"
        )
    return "\n".join(lines)


def holds(name: str, concurrency: int, block_size: int) -> bool:
    """Whether configuration `name`'s cache holds `concurrency` requests at their longest."""
    blocks, seqs = CONFIGS[name]
    per_request = -(-(INPUT + OUTPUT - 1) // block_size)
    return min(concurrency, seqs) * per_request <= blocks - 1


def test_whatif_predicts_a_real_vllm_with_fewer_kv_blocks_and_fewer_seqs(
    servers: dict[str, Vllm],
) -> None:
    started = time.monotonic()
    shapes = {}
    for name, server in servers.items():
        info = cache_config(server)
        assert int(info["num_gpu_blocks"]) == CONFIGS[name][0], info
        shapes[name] = EngineShape(
            num_gpu_blocks=int(info["num_gpu_blocks"]),
            block_size=int(info["block_size"]),
            max_num_seqs=CONFIGS[name][1],
            max_model_len=1024,
            max_num_batched_tokens=BATCHED_TOKENS,
            enable_prefix_caching=info["enable_prefix_caching"] == "True",
        )
    block_size = shapes["A"].block_size

    rounds = run_rounds(servers)
    loads = [s["load_average"] for r in rounds.values() for steps in r for s in steps]
    measured = {
        name: [median_point(rounds[name], i) for i in range(len(LADDER))] for name in rounds
    }

    profile = calibrate_sweep(measured["A"], shapes["A"], INPUT, OUTPUT, replica="vllm-cpu")
    fit = "\n".join(
        f"  fit c={p.load:g} {p.metric}: measured {p.measured:.4g}, fitted {p.fitted:.4g}"
        for p in profile.fit.points
    )
    print(f"\ncalibrated on A ({profile.fit.reason}): {profile.cost}\n{fit}")
    assert profile.fit.trusted, profile.fit.reason
    requests = {c: requests_for(c) for c in LADDER}
    predicted = {
        name: predict_sweep(profile, change, LADDER, INPUT, OUTPUT, requests_per_step=requests)
        for name, change in (("A", None), *CHANGES.items())
    }
    titles = {
        "A": f"A ({BLOCKS_A} blocks, max_num_seqs {MAX_SEQS}), as calibrated:",
        "B": f"B ({BLOCKS_B} blocks), predicted from A:",
        "C": f"C (max_num_seqs {MAX_SEQS_C}), predicted from A:",
    }
    report = "\n\n".join(
        table(titles[name], predicted[name], measured[name], rounds[name]) for name in CONFIGS
    )
    print(
        f"\n{report}\n(load and measurement {time.monotonic() - started:.0f} s; machine load "
        f"average {min(loads):.1f}–{max(loads):.1f} over {os.cpu_count()} cores)"
    )

    # Both sides of each knee are in the ladder (else the test checks less than it says).
    for name in CHANGES:
        limit = CONFIGS[name][1]
        sides = {c: holds(name, c, block_size) and c <= limit for c in LADDER}
        assert any(sides.values()) and not all(sides.values()), (name, sides)
    # A holds every step's requests: it never preempts, as predicted.
    for p, m in zip(predicted["A"], measured["A"], strict=True):
        assert p.preemptions == 0 and m.server["preemptions"] == 0, report
    aims, failures = [], []
    for name in CHANGES:
        for p, m in zip(predicted[name], measured[name], strict=True):
            c = p.concurrency
            where = f"{name} c={c}"
            measured_preemptions = m.server["preemptions"] or 0.0
            assert m.ttft_mean_seconds is not None
            throughput = relative(p.output_tokens_per_second, m.output_tokens_per_second)
            ttft = p.ttft_mean_seconds / m.ttft_mean_seconds
            ratio = None
            if holds(name, c, block_size):
                if p.preemptions or measured_preemptions:
                    failures.append(f"{where}: preemptions where the cache holds every request")
            elif not (p.preemptions and measured_preemptions):
                failures.append(f"{where}: no preemptions where the cache cannot hold them")
            else:
                ratio = measured_preemptions / p.preemptions
                low, high = PREEMPTION_RATIO
                if not low <= ratio <= high:
                    failures.append(f"{where}: preemptions measured/predicted {ratio:.2f}")
            met = (
                abs(throughput) <= AIM_ERROR
                and abs(ttft - 1) <= AIM_ERROR
                and (ratio is None or 1 / AIM_PREEMPTION_FACTOR <= ratio <= AIM_PREEMPTION_FACTOR)
            )
            aims.append(
                f"{where}: throughput {throughput:+.1%}, mean TTFT {ttft - 1:+.1%}"
                + ("" if ratio is None else f", preemptions measured/predicted {ratio:.2f}")
                + (" (aims met)" if met else " (aims missed)")
            )
            if abs(throughput) > THROUGHPUT_ERROR:
                failures.append(f"{where}: throughput {throughput:+.1%}")
            if not 1 / TTFT_FACTOR <= ttft <= TTFT_FACTOR:
                failures.append(f"{where}: mean TTFT predicted/measured {ttft:.2f}")
        # The physically right direction at the top step, predicted and measured alike: with
        # fewer blocks (or slots), requests wait for room and the first token comes later.
        top_a, top = measured["A"][-1], measured[name][-1]
        assert top_a.ttft_mean_seconds and top.ttft_mean_seconds
        if not top.ttft_mean_seconds > TOP_STEP_TTFT_RATIO * top_a.ttft_mean_seconds:
            failures.append(f"{name}: measured TTFT at the top step not above A's")
        if not (
            predicted[name][-1].ttft_mean_seconds
            > TOP_STEP_TTFT_RATIO * predicted["A"][-1].ttft_mean_seconds
        ):
            failures.append(f"{name}: predicted TTFT at the top step not above A's")
        if not (
            predicted[name][-1].output_tokens_per_second
            < predicted["A"][-1].output_tokens_per_second
        ):
            failures.append(f"{name}: predicted throughput at the top step not below A's")
    print("\n".join(aims))
    assert not failures, "\n".join(failures) + "\n\n" + report
