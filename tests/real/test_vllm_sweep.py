"""`kneepoint sweep` against a real vLLM, next to `vllm bench serve` on the same server, each
held against the server's own account of the same round; and `kneepoint import` reads the
file vllm bench wrote.

Why against the server and not tool against tool: on this shared two-core machine two rounds
of the same load differ by up to 30 % (other work, the server's own pace), so one client's
mean TTFT or throughput against another's, taken in different rounds, is decided by noise.
vLLM's /metrics is a truth both rounds share: for every request it records TTFT and
end-to-end latency from the moment it accepted the request to the moment its output
processor had the first (last) token, and it counts every token it generated. Reading the
counters before and after a round (nothing else uses the server meanwhile) gives that round's
exact request count, exact token count, and its sums of TTFT and end-to-end latency.

What must hold, and what each check catches:

- Tokens and requests: the tool's output-token count equals the server's generated-token
  delta exactly (PROMPTS × OUTPUT with ignore_eos), and its completed count equals the
  server's request delta. No noise: a miscount (a usage chunk counted as a token, a dropped
  request) fails.
- TTFT, one-sided: each request's server interval lies inside the client's (the client sent
  before the server accepted; it read the token after the server produced it), so a client's
  mean TTFT is at least the server's for the same round: gap = client − server ≥ −EPSILON.
  The gap is the HTTP path both ways (and any queueing in the client): positive, never
  negative. TTFT timed from an instant later than the send by more than that gap (the
  response's headers or first byte on a busy server) falls below the server's and fails.
- TTFT, bounded: kneepoint's gap is no larger than vllm bench's gap for the same kind of
  round, within a tolerance from the measured spread (below). TTFT timed to a later instant
  (the usage chunk, the last token) or from an earlier one (the step's start) widens the
  gap; by more than the tolerance, it fails.
- Wall time, one-sided: a closed loop of CONCURRENCY clients never has more than CONCURRENCY
  requests open, and each server interval lies inside its client's, so the server's summed
  end-to-end latency is at most CONCURRENCY × the client's wall time: fill =
  CONCURRENCY × wall / Σ server e2e ≥ 1 − EPSILON. A wall that leaves out part of the step
  (started late, stopped before the last token) falls below once it is short by more than
  the fill's own margin (1–4 % here).
- Wall time, bounded: kneepoint's fill (its ramp-up, tail and per-request overhead) is no
  larger than vllm bench's plus a tolerance. A wall that takes in more than the step
  (process start, the store) by more than the tolerance fails. With exact tokens, this is
  the output throughput check: throughput = tokens / wall.

Tolerances: each bounded check takes the median over ROUNDS paired rounds (in each round both
tools run, taking turns going first) of the paired difference d = kneepoint − bench, and
allows tolerance = min(CAP, max(FLOOR, 3 × 1.4826 × MAD(d))): three standard deviations of
the differences as this run measured them (the median absolute deviation, scaled, so one wild
round does not widen it), never below FLOOR, which covers what six rounds cannot resolve, and
never above CAP, so a noisy run cannot hide a gross error. For TTFT, FLOOR is 10 % and CAP
25 % of the round's server TTFT (median over rounds): on this machine, loaded by other work,
gaps were 12–48 ms on server TTFTs of 310–530 ms and the two tools' gaps in one round differed
by at most 23 ms (6 %). For fill, FLOOR is 0.03 and CAP 0.10: fills were 1.009–1.043, paired
differences at most 0.025. In ten runs in a row (4 minutes each), gaps were 7–57 ms, the
median paired TTFT difference −1.3…−3.7 ms against 32–36 ms allowed, fills 1.007–1.023 and
the median fill difference −0.003…0.000 against 0.030. So a TTFT error above about a tenth
of the TTFT (at most a quarter, in the noisiest run), or a wall time about 3 % too long (at
most 10 %), fails; smaller ones cannot be told from this machine's noise.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from kneepoint.cli import app
from kneepoint.knee.imports import read
from kneepoint.knee.sweep import CLIENT_SATURATED_CORES, SweepSettings, random_prompt, sweep
from kneepoint.store.db import open_store
from tests.real.vllm_server import BenchServe, Vllm, bench_serve, off_engine_core

pytestmark = [pytest.mark.real, pytest.mark.timeout(1200)]
CONCURRENCY, PROMPTS, INPUT, OUTPUT = 16, 128, 256, 128
ROUNDS = 6
EPSILON = 0.002  # s, and a share for fill: clock reads of two processes, float sums
TTFT_FLOOR, TTFT_CAP = 0.10, 0.25  # shares of the server's median TTFT (see the docstring)
FILL_FLOOR, FILL_CAP = 0.03, 0.10
# The server's counters and histograms a round is held against (sums over their labels).
TRUTH = {
    "requests": "vllm:time_to_first_token_seconds_count",
    "ttft_sum": "vllm:time_to_first_token_seconds_sum",
    "finished": "vllm:e2e_request_latency_seconds_count",
    "e2e_sum": "vllm:e2e_request_latency_seconds_sum",
    "tokens": "vllm:generation_tokens_total",
}


@pytest.fixture(scope="module")
def vllm(engine_bound_servers: dict[str, Vllm]) -> Vllm:
    """A server whose engine is the bottleneck, as on a GPU. On the tiny model the API server
    sets the pace, and it shares its core with the load generator: a heavier client then
    slows the server it measures (mean TTFT differed by −25 % to +13 % between the tools).
    It is the what-if test's configuration A (started with B and C, once): its 95 usable KV
    blocks hold this test's CONCURRENCY requests of 3 blocks each, and its max_num_seqs (64)
    runs them all at once, which the warm-up asserts (no preemption, 16 running)."""
    return engine_bound_servers["A"]


def server_totals(vllm: Vllm) -> dict[str, float]:
    text = httpx.get(f"{vllm.url}/metrics", timeout=30).text
    totals = dict.fromkeys(TRUTH, 0.0)
    names = {name: key for key, name in TRUTH.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                totals[names[sample.name]] += sample.value
    return totals


@dataclass(frozen=True)
class Measured:
    """One tool's round: what it reported, and what the server counted meanwhile."""

    tool: str
    ttft: float  # the tool's mean TTFT, s
    wall: float  # its wall time for the round, s
    tokens: float  # output tokens it counted
    completed: int
    server: dict[str, float]  # deltas of TRUTH over the round

    @property
    def server_ttft(self) -> float:
        return self.server["ttft_sum"] / self.server["requests"]

    @property
    def ttft_gap(self) -> float:
        return self.ttft - self.server_ttft

    @property
    def fill(self) -> float:
        return CONCURRENCY * self.wall / self.server["e2e_sum"]

    def line(self) -> str:
        return (
            f"{self.tool:>9}: TTFT {self.ttft * 1000:6.1f} ms (server "
            f"{self.server_ttft * 1000:6.1f}, gap {self.ttft_gap * 1000:+5.1f}), "
            f"{self.tokens / self.wall:6.0f} tok/s, fill {self.fill:.3f}"
        )


def tolerance(differences: list[float], floor: float, cap: float) -> float:
    """Three standard deviations of the paired differences, from their median absolute
    deviation, kept within [floor, cap]."""
    middle = statistics.median(differences)
    mad = statistics.median(abs(d - middle) for d in differences)
    return min(cap, max(floor, 3 * 1.4826 * mad))


def against_server(
    vllm: Vllm, tool: str, run: Callable[[], tuple[float, float, float, int]]
) -> Measured:
    """Run one tool's round between two reads of the server's counters. The server records
    a request's figures just after streaming its last token, so the after-read waits (poll,
    deadline) until every request of the round is recorded."""
    before = server_totals(vllm)
    ttft, wall, tokens, completed = run()
    deadline = time.monotonic() + 30
    while True:
        after = server_totals(vllm)
        if after["finished"] - before["finished"] >= completed or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    delta = {key: after[key] - before[key] for key in TRUTH}
    return Measured(tool, ttft, wall, tokens, completed, delta)


def bench_round(bench: BenchServe, folder: Path) -> tuple[float, float, float, int]:
    """One `vllm bench serve` round on the same kind of load as the sweep's: fresh prompts of
    INPUT random common words (its own random dataset draws other text, which this server
    tokenizes at another cost), OUTPUT tokens each with ignore_eos, CONCURRENCY at a time;
    no single-prompt check first (it would be a request outside the round)."""
    folder.mkdir()
    rng = random.Random()
    prompts = folder / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": random_prompt(rng, INPUT)}) + "\n" for _ in range(PROMPTS))
    )
    bench.run(
        folder,
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(prompts),
        "--skip-chat-template",
        "--custom-output-len",
        str(OUTPUT),
        "--ignore-eos",
        "--max-concurrency",
        str(CONCURRENCY),
        "--num-prompts",
        str(PROMPTS),
        "--ready-check-timeout-sec",
        "0",
        "--label",
        "vllm-bench-c16",
    )
    (result_file,) = folder.glob("*.json")
    result = json.loads(result_file.read_text())
    return (
        result["mean_ttft_ms"] / 1000,
        result["duration"],
        result["total_output_tokens"],
        result["completed"],
    )


def cli_sweep(vllm: Vllm, config: Path, label: str) -> dict:  # type: ignore[type-arg]
    """`kneepoint sweep` as a user runs it: its own process, like `vllm bench serve`."""
    command = [
        sys.executable,
        "-m",
        "kneepoint.cli",
        "sweep",
        "--url",
        vllm.url,
        "--model",
        "tiny",
        "--concurrency",
        str(CONCURRENCY),
        "--requests",
        str(PROMPTS),
        "--input-tokens",
        str(INPUT),
        "--output-tokens",
        str(OUTPUT),
        "--label",
        label,
        "--json",
        "--config",
        str(config),
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        preexec_fn=off_engine_core,
    )
    assert done.returncode == 0, f"kneepoint sweep failed: {done.stderr[-2000:]}"
    (point,) = json.loads(done.stdout)["points"]
    return point


def test_sweep_agrees_with_vllm_bench_serve_and_imports_its_file(
    vllm: Vllm, tmp_path: Path
) -> None:
    settings = SweepSettings(
        url=vllm.url,
        model="tiny",
        ladder=(CONCURRENCY,),
        input_tokens=INPUT,
        output_tokens=OUTPUT,
        requests_per_step=PROMPTS,
    )
    config = tmp_path / "kneepoint.yaml"
    config.write_text(f"database: sqlite:///{tmp_path / 'k.db'}\n")
    open_store(f"sqlite:///{tmp_path / 'k.db'}")
    points: list[dict] = []  # type: ignore[type-arg]

    def ours(turn: int) -> tuple[float, float, float, int]:
        point = cli_sweep(vllm, config, f"kneepoint-{turn}")
        assert point["errors"] == 0, point["first_error"]
        points.append(point)
        wall = point["duration_seconds"]
        return (
            point["ttft_mean_seconds"],
            wall,
            point["output_tokens_per_second"] * wall,
            point["completed"],
        )

    # vllm bench imports vLLM (tens of seconds) while the warm-up runs.
    with bench_serve(vllm, tmp_path / "bench.log") as bench:
        # Both load generators run on the core the engine leaves free (see off_engine_core).
        # The warm-up also captures the server's /metrics around and during the step; the
        # rounds do not, as vllm bench does not poll /metrics (on two cores that costs).
        captured = replace(settings, metrics_url=f"{vllm.url}/metrics")
        (warm,) = sweep(captured, "warm-up").points
        assert warm.server["requests_running_peak"] == CONCURRENCY
        assert warm.server["preemptions"] == 0
        # Text prompts of INPUT common words: the server counted INPUT tokens to within 5 %.
        assert warm.input_tokens_mean == pytest.approx(INPUT, rel=0.05)
        assert warm.server["prefix_cache_queries"] == pytest.approx(
            PROMPTS * (warm.input_tokens_mean or 0), rel=0.01
        )
        rounds: list[tuple[Measured, Measured]] = []
        for turn in range(ROUNDS):
            folder = tmp_path / f"round-{turn}"
            by_tool: dict[str, Measured] = {}
            # The tools take turns going first: neither always meets a server just rested.
            for tool in ("bench", "kneepoint")[:: 1 if turn % 2 == 0 else -1]:
                run = (
                    partial(bench_round, bench, folder) if tool == "bench" else partial(ours, turn)
                )
                by_tool[tool] = against_server(vllm, tool, run)
            mine, theirs = by_tool["kneepoint"], by_tool["bench"]
            rounds.append((mine, theirs))
            print(f"round {turn}: {mine.line()}\n         {theirs.line()}", flush=True)
    report = "\n".join(f"{m.line()} | {t.line()}" for m, t in rounds)
    for pair in rounds:
        for measured in pair:
            # Exact, whatever the noise: every request and every token the server made.
            assert measured.completed == PROMPTS == measured.server["requests"], report
            assert measured.server["finished"] == PROMPTS, report
            assert measured.server["tokens"] == PROMPTS * OUTPUT, report
            assert measured.tokens == pytest.approx(measured.server["tokens"], abs=1e-6), report
            # One-sided: no client sees its first token before the server made it, nor holds
            # more than CONCURRENCY requests open.
            assert measured.ttft_gap >= -EPSILON, (
                f"{measured.tool}: TTFT under the server's\n{report}"
            )
            assert measured.fill >= 1 - EPSILON, f"{measured.tool}: wall too short\n{report}"

    # Bounded: kneepoint's gap to the server no wider than vllm bench's (paired by round).
    server_ttft = statistics.median(m.server_ttft for pair in rounds for m in pair)
    checks = {
        "TTFT gap (s)": (
            [m.ttft_gap - t.ttft_gap for m, t in rounds],
            TTFT_FLOOR * server_ttft,
            TTFT_CAP * server_ttft,
        ),
        "fill": ([m.fill - t.fill for m, t in rounds], FILL_FLOOR, FILL_CAP),
    }
    for name, (differences, floor, cap) in checks.items():
        allowed = tolerance(differences, floor, cap)
        measured_difference = statistics.median(differences)
        print(
            f"{name}: kneepoint − vllm bench, median {measured_difference:+.4f} "
            f"(rounds {', '.join(f'{d:+.4f}' for d in differences)}), allowed {allowed:.4f}"
        )
        assert measured_difference <= allowed, (
            f"{name}: kneepoint sweep exceeds vllm bench serve by {measured_difference:.4g} "
            f"(median of paired rounds; allowed {allowed:.3g})\n{report}"
        )

    cores = [p["client_cpu_cores"] for p in points]
    assert max(cores) < CLIENT_SATURATED_CORES, f"the sweep client used {cores} cores"

    # kneepoint import reads the file vllm bench wrote, and its numbers are the file's.
    (result_file,) = (tmp_path / f"round-{ROUNDS - 1}").glob("*.json")
    reference = json.loads(result_file.read_text())
    (imported,) = read(result_file)
    assert (imported.label, imported.source, imported.model) == (
        "vllm-bench-c16",
        "vllm-bench",
        "tiny",
    )
    (point,) = imported.points
    assert point.concurrency == CONCURRENCY and point.completed == PROMPTS
    assert point.output_tokens_per_second == reference["output_throughput"]
    assert point.ttft_p99_seconds == pytest.approx(reference["p99_ttft_ms"] / 1000)
    result = CliRunner().invoke(app, ["import", "--config", str(config), str(result_file)])
    assert result.exit_code == 0, result.output
    assert "imported vllm-bench-c16 (vllm-bench, tiny): concurrency 16" in result.output
